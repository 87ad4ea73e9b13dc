# fish completion for aithermd(8); installed as /usr/share/fish/vendor_completions.d/aithermd.fish.

function __aithermd_policies
    for f in /etc/aithermd/policies/*.yaml /etc/aithermd/policies.d/*.yaml /usr/share/aithermd/policies/*.yaml
        basename $f .yaml
    end
end

set -l commands run restore sensors fans check schema replay
complete -c aithermd -f
complete -c aithermd -n "not __fish_seen_subcommand_from $commands" -l version -d 'Print the version'
complete -c aithermd -n "not __fish_seen_subcommand_from $commands" -a run -d 'Run the daemon'
complete -c aithermd -n "not __fish_seen_subcommand_from $commands" -a restore -d 'Put every journaled knob back'
complete -c aithermd -n "not __fish_seen_subcommand_from $commands" -a sensors -d 'Read every device once'
complete -c aithermd -n "not __fish_seen_subcommand_from $commands" -a fans -d 'Detect and calibrate the fans'
complete -c aithermd -n "__fish_seen_subcommand_from fans; and not __fish_seen_subcommand_from detect calibrate show" -a 'detect calibrate show'
complete -c aithermd -n "__fish_seen_subcommand_from fans" -l state-dir -x -a '(__fish_complete_directories)' -d 'State directory'
complete -c aithermd -n "__fish_seen_subcommand_from fans" -l config -r -F -d 'Settings file'
complete -c aithermd -n "__fish_seen_subcommand_from fans" -l json -d 'Print JSON'
complete -c aithermd -n "__fish_seen_subcommand_from fans" -l sysfs-root -x -a '(__fish_complete_directories)' -d 'Root of the sysfs tree'
complete -c aithermd -n "__fish_seen_subcommand_from fans" -l pwm -x -d 'Only this pwm knob'
complete -c aithermd -n "__fish_seen_subcommand_from fans" -l time-limit -x -d 'Abort and restore after S seconds'
complete -c aithermd -n "__fish_seen_subcommand_from fans" -l margin -x -d 'Abort when a temperature rose C °C'
complete -c aithermd -n "__fish_seen_subcommand_from fans" -l yes -d 'Do not ask before stopping fans'
complete -c aithermd -n "__fish_seen_subcommand_from fans" -l simulate -d 'The simulated workstation'
complete -c aithermd -n "__fish_seen_subcommand_from fans" -l speedup -x -d 'Simulated time runs K times faster'
complete -c aithermd -n "__fish_seen_subcommand_from fans" -l seed -x -d 'Noise seed'
complete -c aithermd -n "__fish_seen_subcommand_from run" -l calibrate-fans -d 'Detect and calibrate the fans first'
complete -c aithermd -n "not __fish_seen_subcommand_from $commands" -a check -d 'Validate policy files'
complete -c aithermd -n "not __fish_seen_subcommand_from $commands" -a schema -d 'JSON Schema of policy files'
complete -c aithermd -n "not __fish_seen_subcommand_from $commands" -a replay -d 'Replay a GPU trace'

complete -c aithermd -n "__fish_seen_subcommand_from run restore" -l config -r -F -d 'Settings file'
complete -c aithermd -n "__fish_seen_subcommand_from run replay" -l policy -x -a '(__aithermd_policies)' -d 'Policy'
complete -c aithermd -n "__fish_seen_subcommand_from run replay" -l policy-dir -x -a '(__fish_complete_directories)' -d 'Also load policies from DIR'
complete -c aithermd -n "__fish_seen_subcommand_from run restore" -l state-dir -x -a '(__fish_complete_directories)' -d 'State directory'
complete -c aithermd -n "__fish_seen_subcommand_from run restore sensors check" -l sysfs-root -x -a '(__fish_complete_directories)' -d 'Root of the sysfs tree'
complete -c aithermd -n "__fish_seen_subcommand_from run" -l tick -x -d 'Control-loop period, s'
complete -c aithermd -n "__fish_seen_subcommand_from run" -l dry-run -d 'Decide and log, write nothing'
complete -c aithermd -n "__fish_seen_subcommand_from run" -l bus -x -a 'system session none' -d 'D-Bus bus'
complete -c aithermd -n "__fish_seen_subcommand_from run" -l metrics-listen -x -a '127.0.0.1:8736 none' -d 'Prometheus endpoint'
complete -c aithermd -n "__fish_seen_subcommand_from run check" -l simulate -d 'The simulated workstation'
complete -c aithermd -n "__fish_seen_subcommand_from run sensors replay" -l gpu-profile -r -F -d 'nvidia-smi -q dump'
complete -c aithermd -n "__fish_seen_subcommand_from run replay" -l trace -r -F -d 'nvidia-smi trace'
complete -c aithermd -n "__fish_seen_subcommand_from run" -l duration -x -d 'Stop after S simulated seconds'
complete -c aithermd -n "__fish_seen_subcommand_from run" -l speedup -x -d 'Simulated time runs K times faster'
complete -c aithermd -n "__fish_seen_subcommand_from sensors replay" -l json -d 'Print JSON'
complete -c aithermd -n "__fish_seen_subcommand_from sensors" -l interval -x -d 'Seconds between two samples'
complete -c aithermd -n "__fish_seen_subcommand_from check" -F
complete -c aithermd -n "__fish_seen_subcommand_from run" -l no-nvml -d 'Do not open NVIDIA GPUs'
complete -c aithermd -n "__fish_seen_subcommand_from run" -l log-format -x -a 'auto json console' -d 'Log format'
complete -c aithermd -n "__fish_seen_subcommand_from run" -l log-level -x -a 'debug info warning error' -d 'Log level'
complete -c aithermd -n "__fish_seen_subcommand_from run" -l gpus -x -d 'Simulate N GPUs'
complete -c aithermd -n "__fish_seen_subcommand_from run" -l stagger -x -d 'Phase-shifted jobs, S seconds apart'
complete -c aithermd -n "__fish_seen_subcommand_from run" -l seed -x -d 'Noise seed'
complete -c aithermd -n "__fish_seen_subcommand_from run" -l cycle -x -d 'Default cycle: idle,busy,idle seconds'
complete -c aithermd -n "__fish_seen_subcommand_from run" -l busy -x -a 'training decode' -d 'The busy phase jobs'
complete -c aithermd -n "__fish_seen_subcommand_from run" -l held-idle -d 'Idle GPUs are held high'
complete -c aithermd -n "__fish_seen_subcommand_from run" -l progress -d 'The jobs report their progress rate'
complete -c aithermd -n "__fish_seen_subcommand_from run" -l summary-json -d 'Print the summary as JSON'
complete -c aithermd -n "__fish_seen_subcommand_from run" -l fault -x -d 'Inject a fault: TARGET:FAULT@WHEN'
complete -c aithermd -n "__fish_seen_subcommand_from check" -s q -l quiet -d 'Print nothing for valid files'
complete -c aithermd -n "__fish_seen_subcommand_from schema" -l compact -d 'One line instead of indented'
complete -c aithermd -n "__fish_seen_subcommand_from schema" -l markdown -d 'The reference as Markdown'

# fish completion for aithermctl(1); installed as /usr/share/fish/vendor_completions.d/aithermctl.fish.

function __aithermctl_policies
    for f in /etc/aithermd/policies/*.yaml /etc/aithermd/policies.d/*.yaml /usr/share/aithermd/policies/*.yaml
        basename $f .yaml
    end
end

set -l verbs status policy hold release run override gpu explain energy fans doctor demo top
complete -c aithermctl -f
complete -c aithermctl -l bus -x -a 'system session' -d 'Where the daemon is'
complete -c aithermctl -n "not __fish_seen_subcommand_from $verbs" -l no-ask-password -d 'Never let polkit ask for a password'
complete -c aithermctl -n "not __fish_seen_subcommand_from $verbs" -l version -d 'Print the version'
complete -c aithermctl -n "not __fish_seen_subcommand_from $verbs" -a status -d 'Devices, limits, fans and the policy'
complete -c aithermctl -n "not __fish_seen_subcommand_from $verbs" -a policy -d 'List, show, activate or reload policies'
complete -c aithermctl -n "not __fish_seen_subcommand_from $verbs" -a hold -d 'Hold a policy'
complete -c aithermctl -n "not __fish_seen_subcommand_from $verbs" -a release -d 'End a hold'
complete -c aithermctl -n "not __fish_seen_subcommand_from $verbs" -a run -d 'Hold a policy while a command runs'
complete -c aithermctl -n "not __fish_seen_subcommand_from $verbs" -a override -d 'Set a knob by hand'
complete -c aithermctl -n "not __fish_seen_subcommand_from $verbs" -a gpu -d 'Let go of a GPU'
complete -c aithermctl -n "not __fish_seen_subcommand_from $verbs" -a explain -d 'Why each knob has its value'
complete -c aithermctl -n "not __fish_seen_subcommand_from $verbs" -a energy -d 'Joules while a command runs'
complete -c aithermctl -n "not __fish_seen_subcommand_from $verbs" -a fans -d 'The fans; detect and calibrate them'
complete -c aithermctl -n "not __fish_seen_subcommand_from $verbs" -a doctor -d 'What can be read and written here'
complete -c aithermctl -n "__fish_seen_subcommand_from fans; and not __fish_seen_subcommand_from show detect calibrate" -a 'show detect calibrate'
complete -c aithermctl -n "not __fish_seen_subcommand_from $verbs" -a demo -d 'The simulated workstation and the TUI'
complete -c aithermctl -n "not __fish_seen_subcommand_from $verbs" -a top -d 'The terminal UI'

complete -c aithermctl -n "__fish_seen_subcommand_from status policy explain energy" -l json -d 'Print JSON'
complete -c aithermctl -n "__fish_seen_subcommand_from policy; and not __fish_seen_subcommand_from list show set reload" -a 'list show set reload'
complete -c aithermctl -n "__fish_seen_subcommand_from show set hold" -a '(__aithermctl_policies)'
complete -c aithermctl -n "__fish_seen_subcommand_from hold run" -l reason -x -d 'Why'
complete -c aithermctl -n "__fish_seen_subcommand_from hold energy" -l timeout -x -d 'DURATION'
complete -c aithermctl -n "__fish_seen_subcommand_from hold" -l detach -d 'Keep the hold after aithermctl exits'
complete -c aithermctl -n "__fish_seen_subcommand_from run demo" -l policy -x -a '(__aithermctl_policies)' -d 'Policy'
complete -c aithermctl -n "__fish_seen_subcommand_from run" -l progress-regex -x -d 'Read the progress CMD prints'
complete -c aithermctl -n "__fish_seen_subcommand_from run" -l progress-gpus -x -d 'The GPUs CMD runs on'
complete -c aithermctl -n "__fish_seen_subcommand_from override" -l for -x -d 'DURATION'
complete -c aithermctl -n "__fish_seen_subcommand_from gpu; and not __fish_seen_subcommand_from release" -a release -d 'Restore its originals and stop using it'
complete -c aithermctl -n "__fish_seen_subcommand_from demo" -l speedup -x -d 'Simulated time runs K times faster'
complete -c aithermctl -n "__fish_seen_subcommand_from demo" -l cycle -x -d 'Simulated idle, training, idle phases'
complete -c aithermctl -n "__fish_seen_subcommand_from demo" -l no-tui -d 'Print the bus address and wait'
complete -c aithermctl -n "__fish_seen_subcommand_from demo" -l metrics-listen -x -d 'Prometheus metrics HOST:PORT or none'

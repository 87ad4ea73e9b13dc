"""Who used the joules: processes, their cgroups (systemd units, Slurm jobs, containers), the share of each
device's energy each one used, energy windows and the energy history."""

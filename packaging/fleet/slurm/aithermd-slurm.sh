#!/usr/bin/env bash
# Shared code of the aithermd Slurm prolog and epilog (sourced by prolog.sh and epilog.sh).
#
# Settings: shell assignments in /etc/aithermd/slurm.conf (or the file AITHERMD_SLURM_CONF names), or the
# environment of slurmd:
#   AITHERMD_SLURM_DEFAULT_POLICY   policy held for jobs whose comment names none ("" = hold nothing);
#                                   default ai-training
#   AITHERMD_SLURM_WINDOW_TIMEOUT   seconds after which the daemon ends a forgotten energy window; default
#                                   604800 (7 days; set it above your longest MaxTime)
#   AITHERMD_SLURM_LOG              JSON lines, one per job and node; default /var/log/aithermd/slurm-energy.log
#   AITHERMD_SLURM_STATE_DIR        hold cookie and window id between prolog and epilog; default
#                                   /run/aithermd-slurm
#   AITHERMD_BUS                    system (default), session, or a D-Bus address
#   AITHERMD_SLURM_STRICT           1: fail the prolog when the hold cannot be taken (Slurm then drains the
#                                   node and requeues the job held until `scontrol release`, or, with
#                                   SchedulerParameters=nohold_on_prolog_fail, to run elsewhere);
#                                   default 0, fail open
#
# A job picks its policy with its comment: sbatch --comment "aithermd:policy=quiet" (other text may surround
# it). Slurm runs prologs and epilogs with no PATH; the standard directories are appended to whatever is set.
# slurmd passes them only SLURM_* variables (checked on Slurm 22.05): settings come from the file above.

PATH=${PATH:+$PATH:}/usr/local/sbin:/usr/local/bin:/usr/sbin:/usr/bin:/sbin:/bin
export PATH

conf=${AITHERMD_SLURM_CONF:-/etc/aithermd/slurm.conf}
# shellcheck source=/dev/null
[ -r "$conf" ] && . "$conf"

AITHERMD_SLURM_DEFAULT_POLICY=${AITHERMD_SLURM_DEFAULT_POLICY-ai-training}
AITHERMD_SLURM_WINDOW_TIMEOUT=${AITHERMD_SLURM_WINDOW_TIMEOUT:-604800}
AITHERMD_SLURM_LOG=${AITHERMD_SLURM_LOG:-/var/log/aithermd/slurm-energy.log}
AITHERMD_SLURM_STATE_DIR=${AITHERMD_SLURM_STATE_DIR:-/run/aithermd-slurm}
AITHERMD_SLURM_STRICT=${AITHERMD_SLURM_STRICT:-0}
AITHERMD_BUS=${AITHERMD_BUS:-system}

DBUS_NAME=io.github.aithermd.Daemon1
DBUS_PATH=/io/github/aithermd/Daemon1
DBUS_INTERFACE=io.github.aithermd.Daemon1

# One line to syslog (journal) and stderr (slurmd's log).
say() {
    logger -t aithermd-slurm -- "job ${SLURM_JOB_ID:-?}: $*" 2>/dev/null || true
    echo "aithermd-slurm: job ${SLURM_JOB_ID:-?}: $*" >&2
}

job_id() {
    case ${SLURM_JOB_ID:-} in
        '' | *[!0-9]*) say "SLURM_JOB_ID is not a job id: '${SLURM_JOB_ID:-}'"; return 1 ;;
    esac
    printf '%s\n' "$SLURM_JOB_ID"
}

# The policy a job asked for in its comment (aithermd:policy=NAME), else the default. Only names made of
# letters, digits, '.', '_' and '-' are taken: the comment is the user's text.
job_policy() {
    local comment=${SLURM_JOB_COMMENT:-} name
    name=$(printf '%s' "$comment" | grep -oE 'aithermd:policy=[A-Za-z0-9._-]+' | head -n 1 | cut -d= -f2)
    printf '%s\n' "${name:-$AITHERMD_SLURM_DEFAULT_POLICY}"
}

# busctl's bus selection for AITHERMD_BUS
busctl_bus() {
    case $AITHERMD_BUS in
        system) echo --system ;;
        session) echo --user ;;
        *) echo "--address=$AITHERMD_BUS" ;;
    esac
}

# busctl call on the daemon's interface: daemon_call [--busctl-option...] METHOD SIGNATURE ARGS...
daemon_call() {
    local opts=()
    while [ "${1#--}" != "${1:-}" ]; do
        opts+=("$1")
        shift
    done
    busctl "$(busctl_bus)" "${opts[@]}" --timeout=30 call "$DBUS_NAME" "$DBUS_PATH" "$DBUS_INTERFACE" "$@"
}

# The job's energy window: "slurm-<job>", summing the whole node and, apart, the job's own processes
# (scope job:<job>: its Slurm cgroup, or SLURM_JOB_ID in its environment where Slurm tracks no cgroups).
window_name() {
    printf 'slurm-%s\n' "$1"
}

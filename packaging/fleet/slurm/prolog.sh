#!/usr/bin/env bash
# aithermd Slurm prolog (slurm.conf: Prolog=/usr/lib/aithermd/slurm/prolog.sh).
# Holds the job's policy on this node (detached: the epilog is another process) and starts an energy
# window; the epilog releases both and records the job's joules per GPU. Fails open: a node without a
# running aithermd still runs jobs (set AITHERMD_SLURM_STRICT=1 to refuse them).
set -uo pipefail
here=$(dirname "$(readlink -f "$0")")
# shellcheck source=aithermd-slurm.sh
. "$here/aithermd-slurm.sh"

job=$(job_id) || exit 0
umask 077
mkdir -p "$AITHERMD_SLURM_STATE_DIR" || { say "cannot create $AITHERMD_SLURM_STATE_DIR"; exit 0; }
policy=$(job_policy)

if [ -n "$policy" ]; then
    if cookie=$(aithermctl --bus "$AITHERMD_BUS" hold "$policy" --reason "slurm job $job" --detach); then
        printf '%s\n' "$policy" >"$AITHERMD_SLURM_STATE_DIR/$job.policy"
        printf '%s\n' "$cookie" >"$AITHERMD_SLURM_STATE_DIR/$job.hold"
        say "holding policy $policy (cookie $cookie)"
    else
        if [ "$AITHERMD_SLURM_STRICT" = 1 ]; then
            # Slurm's answer to a failed prolog (slurm.conf(5), Prolog): the node is drained and the job
            # requeued in a held state; it runs again only after `scontrol release JOBID`, or at once
            # elsewhere when SchedulerParameters has nohold_on_prolog_fail.
            say "could not hold policy $policy; AITHERMD_SLURM_STRICT=1: failing the prolog, so Slurm drains" \
                "this node and requeues the job held (scontrol release $job; or set" \
                "SchedulerParameters=nohold_on_prolog_fail to requeue it to run elsewhere)"
            exit 1
        fi
        say "could not hold policy $policy; the job runs under the active policy"
    fi
fi

name=$(window_name "$job")
# the scoped window (aithermd ≥ 0.2); an older daemon only knows the device-wide one
if reply=$(daemon_call StartScopedEnergyWindow sds "$name" "$AITHERMD_SLURM_WINDOW_TIMEOUT" "job:$job" 2>/dev/null) ||
    reply=$(daemon_call StartEnergyWindow sd "$name" "$AITHERMD_SLURM_WINDOW_TIMEOUT"); then
    # busctl prints the reply as: t 42
    window=${reply#t }
    printf '%s\n' "$window" >"$AITHERMD_SLURM_STATE_DIR/$job.window"
    say "energy window $window started"
else
    say "could not start an energy window; the job's energy will not be recorded"
fi

exit 0

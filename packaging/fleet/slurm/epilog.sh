#!/usr/bin/env bash
# aithermd Slurm epilog (slurm.conf: Epilog=/usr/lib/aithermd/slurm/epilog.sh).
# Releases the hold the prolog took, stops its energy window and records the job's joules per GPU: one JSON
# line per job and node in AITHERMD_SLURM_LOG and, for single-node jobs, the job's AdminComment. Always
# exits 0: a failed epilog would drain the node.
set -uo pipefail
here=$(dirname "$(readlink -f "$0")")
# shellcheck source=aithermd-slurm.sh
. "$here/aithermd-slurm.sh"

job=$(job_id) || exit 0
state=$AITHERMD_SLURM_STATE_DIR/$job
policy=$(cat "$state.policy" 2>/dev/null || true)

if [ -s "$state.hold" ]; then
    cookie=$(cat "$state.hold")
    if aithermctl --bus "$AITHERMD_BUS" release "$cookie"; then
        say "released policy $policy (cookie $cookie)"
    else
        say "could not release hold $cookie (the daemon may have restarted, which ends holds)"
    fi
fi

if [ -s "$state.window" ]; then
    window=$(cat "$state.window")
    if reply=$(daemon_call --json=short StopEnergyWindow t "$window" 2>&1); then
        record=$(python3 - "$reply" "$job" "$policy" <<'PY'
import datetime
import json
import os
import socket
import sys

reply, job, policy = sys.argv[1:4]
doc = json.loads(json.loads(reply)["data"][0])  # busctl --json: {"type": "s", "data": ["<document>"]}
joules = {k: float(v) for k, v in doc.get("joules", {}).items()}
gpus = [g for g in os.environ.get("SLURM_JOB_GPUS", "").split(",") if g.strip().isdigit()]
job_gpus = {f"gpu{g}": joules[f"gpu{g}"] for g in gpus if f"gpu{g}" in joules}
host = socket.gethostname()
line = {
    "time": datetime.datetime.now(datetime.timezone.utc).isoformat(timespec="seconds"),
    "host": host,
    "job_id": int(job),
    "user": os.environ.get("SLURM_JOB_USER", ""),
    "policy": policy or None,
    "duration_s": doc.get("duration_s"),
    "joules": joules,
    "job_gpus": job_gpus if gpus else None,
}
per_gpu = job_gpus if gpus else {k: v for k, v in joules.items() if k.startswith("gpu")}
summary = " ".join(f"{k}={v:.0f}J" for k, v in sorted(per_gpu.items()))
print(json.dumps(line, sort_keys=True))
print(f"aithermd@{host}: {summary} in {doc.get('duration_s', 0):.0f}s")
PY
        ) || { say "StopEnergyWindow returned a document that cannot be read: $reply"; record=""; }
        if [ -n "$record" ]; then
            mkdir -p "$(dirname "$AITHERMD_SLURM_LOG")"
            # one line per job and node; flock keeps concurrent epilogs from interleaving
            { flock 9; head -n 1 <<<"$record" >&9; } 9>>"$AITHERMD_SLURM_LOG"
            summary=$(tail -n 1 <<<"$record")
            say "$summary"
            if [ "$AITHERMD_SLURM_ADMIN_COMMENT" = auto ] && single_node_job && command -v scontrol >/dev/null; then
                scontrol update JobId="$job" AdminComment="$summary" ||
                    say "scontrol could not set the AdminComment (the log has the record)"
            fi
        fi
    else
        say "could not stop energy window $window: $reply"
    fi
fi

rm -f "$state.hold" "$state.window" "$state.policy"
exit 0

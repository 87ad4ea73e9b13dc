#!/usr/bin/env bash
# aithermd Slurm epilog (slurm.conf: Epilog=/usr/lib/aithermd/slurm/epilog.sh).
# Releases the hold the prolog took, stops the job's energy window and records the job's joules: one JSON
# line per job and node in AITHERMD_SLURM_LOG (the node's devices, and the job's own share of them).
# aithermd keeps the job's record too (aithermctl energy report --by job). Slurm's AdminComment is not
# set: slurmctld refuses to update a finished job ("Job has already finished"), which is all an epilog sees.
# Always exits 0: a failed epilog would drain the node.
set -uo pipefail
here=$(dirname "$(readlink -f "$0")")
# shellcheck source=aithermd-slurm.sh
. "$here/aithermd-slurm.sh"

job=$(job_id) || exit 0
state=$AITHERMD_SLURM_STATE_DIR/$job
policy=$(cat "$state.policy" 2>/dev/null || true)
name=$(window_name "$job")

if [ -s "$state.hold" ]; then
    cookie=$(cat "$state.hold")
    if aithermctl --bus "$AITHERMD_BUS" release "$cookie"; then
        say "released policy $policy (cookie $cookie)"
    else
        say "could not release hold $cookie (the daemon may have restarted, which ends holds)"
    fi
fi

# Stop only this job's window: the daemon checks the name, so a stale id can never stop another job's.
stop_window() {
    daemon_call --json=short StopEnergyWindowNamed ts "$1" "$name"
}

# This job's open window by name, when the saved id is gone or names another window.
find_window() {
    local list
    list=$(daemon_call --json=short ListEnergyWindows) || return 1
    python3 - "$list" "$name" <<'PY'
import json
import sys

reply, name = sys.argv[1:3]
windows = json.loads(json.loads(reply)["data"][0])
ids = [w["id"] for w in windows if w.get("name") == name]
if not ids:
    sys.exit(1)
print(ids[0])
PY
}

window=$(cat "$state.window" 2>/dev/null || true)
reply=""
if [ -n "$window" ] && ! reply=$(stop_window "$window" 2>&1); then
    say "energy window $window is not this job's open window ($reply); looking it up by name"
    reply=""
fi
if [ -z "$reply" ] && found=$(find_window) && [ -n "$found" ]; then
    window=$found
    reply=$(stop_window "$window" 2>&1) || { say "could not stop energy window $window: $reply"; reply=""; }
fi

if [ -n "$reply" ]; then
    record=$(python3 - "$reply" "$job" "$policy" <<'PY'
import datetime
import json
import os
import socket
import sys

reply, job, policy = sys.argv[1:4]
doc = json.loads(json.loads(reply)["data"][0])  # busctl --json: {"type": "s", "data": ["<document>"]}
joules = {k: float(v) for k, v in doc.get("joules", {}).items()}
attributed = {k: float(v) for k, v in doc.get("attributed", {}).items()} if "scope" in doc else None
gpus = [g for g in os.environ.get("SLURM_JOB_GPUS", "").split(",") if g.strip().isdigit()]
job_gpus = {f"gpu{g}": joules[f"gpu{g}"] for g in gpus if f"gpu{g}" in joules}
host = socket.gethostname()
line = {
    "time": datetime.datetime.now(datetime.timezone.utc).isoformat(timespec="seconds"),
    "host": host,
    "job_id": int(job),
    "user": os.environ.get("SLURM_JOB_USER", ""),
    "policy": policy or None,
    "window": doc.get("id"),
    "duration_s": doc.get("duration_s"),
    "joules": joules,
    "job_gpus": job_gpus if gpus else None,
    "attributed": attributed,
    "daemon_restarts": doc.get("restarts", 0),
    "unmeasured_s": doc.get("unmeasured_s", 0.0),
}
mine = attributed if attributed is not None else (job_gpus if gpus else
                                                  {k: v for k, v in joules.items() if k.startswith("gpu")})
summary = " ".join(f"{k}={v:.0f}J" for k, v in sorted(mine.items()))
what = "its own share" if attributed is not None else "the node's GPUs"
print(json.dumps(line, sort_keys=True))
print(f"aithermd@{host}: {sum(mine.values()) / 3.6e6:.3f} kWh ({what}: {summary or 'none'}) "
      f"in {doc.get('duration_s', 0):.0f}s")
PY
    ) || { say "StopEnergyWindowNamed returned a document that cannot be read: $reply"; record=""; }
    if [ -n "$record" ]; then
        mkdir -p "$(dirname "$AITHERMD_SLURM_LOG")"
        # one line per job and node; flock keeps concurrent epilogs from interleaving
        { flock 9; head -n 1 <<<"$record" >&9; } 9>>"$AITHERMD_SLURM_LOG"
        say "$(tail -n 1 <<<"$record")"
    fi
elif [ -n "$window" ]; then
    say "no open energy window for this job (stopped, timed out, or the daemon lost its state)"
fi

rm -f "$state.hold" "$state.window" "$state.policy"
exit 0

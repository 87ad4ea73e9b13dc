"""``python hotplug_daemon.py STATE_DIR POLICY_DIR``: the daemon on the default sysfs root (``/sys``, which
umockdev's preload redirects to its testbed) with hotplug on, printing one JSON line per snapshot (its device
ids and the tick's events) until SIGTERM, which restores as ``aithermd run`` does."""

from __future__ import annotations

import asyncio
import json
import sys
from pathlib import Path

from aithermd import log
from aithermd.runtime.daemon import Daemon
from aithermd.settings import DaemonSettings
from aithermd.watchers.options import WatcherOptions


def main(argv: list[str]) -> int:
    state, policies = map(Path, argv[:2])
    settings = DaemonSettings(state_dir=state, policy_dirs=[policies], policy="steady", policy_pinned=True,
                              bus="none", metrics_listen="none", nvml=False, tick_s=0.1)
    log.setup("warning", "json")
    daemon = Daemon(settings, watchers=WatcherOptions(hotplug=True, settle_s=0.05))

    def show(snapshot, events):
        print(json.dumps({"seq": snapshot.seq, "devices": [d.id for d in snapshot.devices],
                          "events": [[e.kind, e.subject, e.message] for e in events]}), flush=True)

    daemon.hub.add_listener(show)
    return asyncio.run(daemon.run(handle_signals=True))


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))

"""``python gpu_daemon.py ROOT STATE_DIR NVML_STATE POLICY_DIR``: the daemon as a real process on a
copied board tree plus the fake NVML keeping its GPUs in NVML_STATE (so ``aithermd restore`` in another
process sees the same GPUs), with signals handled as by ``aithermd run``. For the kill -9 tests."""

from __future__ import annotations

import asyncio
import sys
from pathlib import Path

from aithermd import log
from aithermd.backends.nvml import NvmlBackend
from aithermd.backends.registry import open_for_daemon
from aithermd.runtime.daemon import Daemon
from aithermd.settings import DaemonSettings
from aithermd.sim.fake_nvml import FakeNvml


def main(argv: list[str]) -> int:
    root, state, nvml_state, policies = map(Path, argv[:4])
    settings = DaemonSettings(sysfs_root=root, state_dir=state, bus="none", metrics_listen="none", nvml=False,
                              tick_s=0.05, policy="gpu-now", policy_pinned=True, policy_dirs=[policies])
    log.setup("info", "json")
    backends = open_for_daemon(settings)
    backends.append(NvmlBackend(nvml=FakeNvml.open(nvml_state).bindings()))
    return asyncio.run(Daemon(settings, backends=backends).run(handle_signals=True))


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))

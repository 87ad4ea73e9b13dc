"""Recorded machines and the one way a test gets a writable copy of one.

Two forms: ``tests/fixtures/sysfs/<machine>/`` (a real ``/sys`` tree, its ``sensors -j`` output and umockdev
recording) and ``tests/fixtures/ttar/<name>.ttar`` (the text tree archives of node_exporter, prometheus/procfs
and telegraf: ``sys/`` trees, some under a ``fixtures/`` prefix)."""

from __future__ import annotations

import shutil
from pathlib import Path

from aithermd.sim import ttar

FIXTURES = Path(__file__).resolve().parents[1] / "fixtures"
MACHINES_DIR = FIXTURES / "sysfs"
TTAR = FIXTURES / "ttar"
NVIDIA_SMI = FIXTURES / "nvidia-smi-q"

X570 = "asus-rog-strix-x570-f-nct6798-amdgpu-k10temp"  # nct6798 fans with pwm, amdgpu, k10temp
Z690 = "asus-rog-strix-z690-e-alderlake-coretemp-nvme"  # coretemp and a slow nvme chip
DELL_7920 = "dell-precision-7920-tower-xeon-coretemp-dell-smm-fans-nouveau"  # dell_smm: pwm without enable
LAPTOP = "laptop-amd-k10temp-amdgpu-nct6779-asus-nvme"
SUPERMICRO = "supermicro-as-4124gs-tnr-gpu-server-amd-energy-nvme-i350"

MACHINES = sorted(p.name for p in MACHINES_DIR.iterdir() if (p / "sys").is_dir())


def machine_root(machine: str = X570) -> Path:
    """The recorded ``sys/`` tree of ``machine`` itself: read-only use (never write into it)."""
    root = MACHINES_DIR / machine / "sys"
    if not root.is_dir():
        raise FileNotFoundError(f"no recorded machine {machine!r} in {MACHINES_DIR} "
                                f"(have: {', '.join(MACHINES)})")
    return root


def copy_machine(dest: Path, machine: str = X570) -> Path:
    """A writable copy of ``machine``'s ``sys/`` tree at ``dest/sys`` (symlinks kept as links, so the tree
    resolves inside the copy as it did on the machine); returns that root. ``machine`` is a directory of
    ``tests/fixtures/sysfs`` or an archive of ``tests/fixtures/ttar`` (``name.ttar``, extracted with its
    ``fixtures/`` prefix stripped). Raises FileNotFoundError for an unknown machine, FileExistsError when
    ``dest/sys`` exists."""
    root = Path(dest) / "sys"
    if machine.endswith(".ttar"):
        if root.exists():
            raise FileExistsError(root)
        archive = TTAR / machine
        entries = ttar.read(archive)
        strip = "fixtures" if entries and entries[0].path.split("/", 1)[0] == "fixtures" else ""
        ttar.extract(archive, dest, strip=strip)
        return root
    shutil.copytree(machine_root(machine), root, symlinks=True)
    return root


def crashed_with_fans(dest: Path, duty_pct: float = 100.0, pwms: tuple[int, ...] = (1, 2),
                      ) -> tuple[Path, Path, dict[str, str]]:
    """A copy of the X570 machine (:func:`copy_machine` at ``dest``) whose nct6798 ``pwmN`` (``pwms``) a
    daemon journaled in ``dest/state`` and then drove at ``duty_pct`` % before it crashed: the journal on
    disk, nothing put back. Returns (root, state dir, the knob files as found: ``knob_files``)."""
    from aithermd.actuate.journal import Journal
    from aithermd.backends.hwmon import HwmonBackend
    from tests.support.proc import knob_files

    chip = "hwmon:nct6798-isa-0290"
    root = copy_machine(dest)
    original = knob_files(root)
    state = Path(dest) / "state"
    backend = HwmonBackend(str(root))
    backend.discover()
    journal = Journal(state)
    for i in pwms:
        kid = f"{chip}/pwm{i}"
        journal.record(kid, chip, backend.locator(), backend.save_knob(kid), 0.0)
        backend.write_knob(kid, duty_pct)
    backend.close()
    return root, state, original

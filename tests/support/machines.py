"""Recorded machines (``tests/fixtures/sysfs/<machine>/``: a real ``/sys`` tree, its ``sensors -j`` output and
umockdev recording) and the one way a test gets a writable copy of one."""

from __future__ import annotations

import shutil
from pathlib import Path

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
    resolves inside the copy as it did on the machine); returns that root. Raises FileNotFoundError for an
    unknown machine, FileExistsError when ``dest/sys`` exists."""
    root = Path(dest) / "sys"
    shutil.copytree(machine_root(machine), root, symlinks=True)
    return root

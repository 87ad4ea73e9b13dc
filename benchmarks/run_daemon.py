"""``aithermd`` with ``N`` simulated GPUs under the real ``pynvml`` bindings (see :mod:`fakegpus`).

    python benchmarks/run_daemon.py --gpus N [--seed S] -- run --sysfs-root ... (aithermd's own arguments)

Without GPUs the benchmark runs ``python -m aithermd`` itself; this wrapper only adds the fake NVML, so the
process is otherwise the daemon users run.
"""

from __future__ import annotations

import argparse
import sys

import fakegpus  # this script's directory is first on sys.path


def main() -> int:
    argv = sys.argv[1:]
    split = argv.index("--") if "--" in argv else len(argv)
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--gpus", type=int, default=0)
    parser.add_argument("--seed", type=int, default=0)
    args = parser.parse_args(argv[:split])
    fakegpus.install(args.gpus, args.seed)
    from aithermd.cli import main as aithermd_main
    return aithermd_main(argv[split + 1:])


if __name__ == "__main__":
    sys.exit(main())

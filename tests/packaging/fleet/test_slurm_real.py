"""The Slurm prolog and epilog under a real Slurm: Debian's slurmctld and slurmd (22.05) on this one node,
munge for their authentication, the hooks as slurm.conf's Prolog and Epilog, and the real aithermd on the
simulated workstation on a private bus. Needs root and the packages of scripts/system-packages.txt.

What a fake cannot show: slurmd runs the hooks with no PATH and only SLURM_* variables (settings come from
the hooks' conf file), the epilog runs after the job finished (slurmctld then refuses ``scontrol update``:
the AdminComment the hooks used to promise cannot be set), and a daemon restart in the middle of a job keeps
the job's window: the epilog stops the very window its prolog opened."""

from __future__ import annotations

import json
import os
import shutil
import signal
import socket
import subprocess
import sys
import time
from collections.abc import Iterator
from pathlib import Path

import pytest

from tests.support.dbus import PrivateBus

ROOT = Path(__file__).resolve().parents[3]
HOOKS = ROOT / "packaging" / "fleet" / "slurm"
BIN = Path(sys.executable).parent
TOOLS = ("slurmctld", "slurmd", "munged", "sbatch", "scontrol", "sinfo", "busctl")

pytestmark = pytest.mark.skipif(os.geteuid() != 0 or any(shutil.which(t) is None for t in TOOLS),
                                reason="needs root, slurmctld, slurmd, munge (scripts/system-packages.txt)")


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def until(predicate, timeout_s: float, what: str, explain=lambda: "") -> None:
    deadline = time.monotonic() + timeout_s
    while time.monotonic() < deadline:
        if predicate():
            return
        time.sleep(0.2)
    raise AssertionError(f"timed out waiting for {what}\n{explain()}")


class Cluster:
    """One node: munged, slurmctld and slurmd in ``home``, the hooks wrapped to find this test's settings."""

    def __init__(self, home: Path, bus: str) -> None:
        self.home, self.bus = home, bus
        self.procs: list[subprocess.Popen] = []
        self.conf = home / "slurm.conf"
        self.env = {**os.environ, "SLURM_CONF": str(self.conf)}
        self.log = home / "slurm-energy.log"

    def start(self) -> None:
        h = self.home
        (h / "munge").mkdir(mode=0o711)
        key = h / "munge" / "munge.key"
        key.write_bytes(os.urandom(1024))
        key.chmod(0o400)
        sock = h / "munge" / "munge.socket"
        self._spawn(["munged", "-F", "-f", f"--socket={sock}", f"--key-file={key}",
                     f"--pid-file={h}/munge/munged.pid", f"--log-file={h}/munge/munged.log",
                     f"--seed-file={h}/munge/seed"], "munged")
        until(sock.exists, 20, "munged's socket")
        settings = h / "aithermd-slurm.conf"
        settings.write_text(f"AITHERMD_BUS='{self.bus}'\nAITHERMD_SLURM_LOG='{self.log}'\n"
                            f"AITHERMD_SLURM_STATE_DIR='{h}/hooks'\nAITHERMD_SLURM_DEFAULT_POLICY=quiet\n")
        for hook in ("prolog", "epilog"):
            wrapper = h / f"{hook}.sh"
            wrapper.write_text(f"#!/bin/bash\nexport AITHERMD_SLURM_CONF='{settings}'\n"
                               f"export PATH='{BIN}:/usr/bin:/bin'\n"
                               f"exec '{HOOKS / (hook + '.sh')}' 2>>'{h}/{hook}.err'\n")
            wrapper.chmod(0o755)
        node = socket.gethostname()
        (h / "state").mkdir()
        (h / "spool").mkdir()
        self.conf.write_text(f"""ClusterName=aithermdtest
SlurmctldHost={node}(127.0.0.1)
SlurmctldPort={free_port()}
SlurmdPort={free_port()}
AuthType=auth/munge
AuthInfo=socket={sock}
CredType=cred/munge
SlurmUser=root
SlurmdUser=root
StateSaveLocation={h}/state
SlurmdSpoolDir={h}/spool
SlurmctldPidFile={h}/slurmctld.pid
SlurmdPidFile={h}/slurmd.pid
SlurmctldLogFile={h}/slurmctld.log
SlurmdLogFile={h}/slurmd.log
ProctrackType=proctrack/linuxproc
TaskPlugin=task/none
SchedulerType=sched/builtin
SelectType=select/cons_tres
SelectTypeParameters=CR_Core
ReturnToService=2
JobCompType=jobcomp/none
AccountingStorageType=accounting_storage/none
Prolog={h}/prolog.sh
Epilog={h}/epilog.sh
NodeName={node} NodeAddr=127.0.0.1 CPUs=1 State=UNKNOWN
PartitionName=test Nodes=ALL Default=YES MaxTime=INFINITE State=UP
""")
        self._spawn(["slurmctld", "-D", "-f", str(self.conf)], "slurmctld")
        time.sleep(1)
        self._spawn(["slurmd", "-D", "-f", str(self.conf), "-N", node], "slurmd")
        until(lambda: "idle" in self.run("sinfo", "-h", "-o", "%t").stdout, 60, "the node to be idle")

    def _spawn(self, cmd: list[str], name: str) -> None:
        out = open(self.home / f"{name}.out", "wb")  # noqa: SIM115 - closed with the process
        self.procs.append(subprocess.Popen(cmd, stdout=out, stderr=subprocess.STDOUT, env=self.env,
                                           start_new_session=True))

    def run(self, *cmd: str) -> subprocess.CompletedProcess[str]:
        return subprocess.run(cmd, capture_output=True, text=True, env=self.env, timeout=30)

    def submit(self, seconds: float, comment: str = "") -> int:
        extra = ["--comment", comment] if comment else []
        out = self.run("sbatch", "--parsable", "-o", "/dev/null", *extra, "--wrap", f"sleep {seconds}").stdout
        return int(out.strip().split(";")[0])

    def state(self, job: int) -> str:
        out = self.run("scontrol", "show", "job", str(job)).stdout
        return next((w.split("=", 1)[1] for w in out.split() if w.startswith("JobState=")), "")

    def explain(self) -> str:
        """The hooks' stderr and the tails of slurmd's and slurmctld's logs, for a failure message."""
        out = []
        for name in ("prolog.err", "epilog.err", "slurmd.log", "slurmctld.log", "slurmd.out"):
            path = self.home / name
            if path.exists():
                out.append(f"--- {name}\n" + "\n".join(path.read_text(errors="replace").splitlines()[-15:]))
        return "\n".join(out)

    def records(self) -> list[dict]:
        return [json.loads(line) for line in self.log.read_text().splitlines()] if self.log.exists() else []

    def stop(self) -> None:
        for p in reversed(self.procs):
            p.send_signal(signal.SIGTERM)
        for p in reversed(self.procs):
            try:
                p.wait(15)
            except subprocess.TimeoutExpired:
                p.kill()
                p.wait()


class Daemon:
    """``aithermd run --simulate`` on the private bus, with a state directory that outlives a restart."""

    def __init__(self, bus: str, state: Path) -> None:
        self.bus, self.state, self.proc = bus, state, None

    def start(self) -> None:
        self.proc = subprocess.Popen([str(BIN / "aithermd"), "run", "--simulate", "--bus", self.bus,
                                      "--metrics-listen", "none", "--state-dir", str(self.state),
                                      "--speedup", "1"], stdout=subprocess.DEVNULL,
                                     stderr=open(self.state.parent / "aithermd.log", "ab"))  # noqa: SIM115
        until(lambda: subprocess.run(["busctl", f"--address={self.bus}", "status",
                                      "io.github.aithermd.Daemon1"], capture_output=True).returncode == 0,
              60, "aithermd on the bus")

    def stop(self) -> None:
        if self.proc is not None and self.proc.poll() is None:
            self.proc.send_signal(signal.SIGTERM)
            self.proc.wait(30)


@pytest.fixture()
def node(tmp_path_factory) -> Iterator[tuple[Cluster, Daemon]]:
    home = tmp_path_factory.mktemp("slurm")
    with PrivateBus.start("system") as bus:
        state = home / "aithermd"
        state.mkdir()
        daemon = Daemon(bus.address, state)
        cluster = Cluster(home, bus.address)
        try:
            daemon.start()
            cluster.start()
            yield cluster, daemon
        finally:
            cluster.stop()
            daemon.stop()


def test_a_job_gets_its_window_and_record_and_no_admin_comment(node):
    cluster, _daemon = node
    job = cluster.submit(3, comment="run 7 aithermd:policy=quiet")
    until(lambda: any(r["job_id"] == job for r in cluster.records()), 90, "the epilog's record",
          cluster.explain)
    (record,) = [r for r in cluster.records() if r["job_id"] == job]
    assert record["policy"] == "quiet" and record["user"] == "root"
    assert record["window"] > 0 and record["duration_s"] >= 2.0
    assert record["joules"]["gpu0"] > 0 and "attributed" in record and record["daemon_restarts"] == 0
    # the epilog writes the record before it exits: the job is COMPLETING until slurmd hears it did
    until(lambda: cluster.state(job) == "COMPLETED", 60, "the job to complete", cluster.explain)
    # what the hooks no longer try: slurmctld refuses to update a finished job
    refused = cluster.run("scontrol", "update", f"JobId={job}", "AdminComment=x")
    assert refused.returncode != 0 and "already finished" in refused.stderr.lower()


def test_a_daemon_restart_mid_job_keeps_the_jobs_window(node):
    cluster, daemon = node
    job = cluster.submit(10)
    window_file = cluster.home / "hooks" / f"{job}.window"
    until(window_file.exists, 60, "the prolog's window", cluster.explain)
    opened = int(window_file.read_text())
    daemon.stop()  # systemd restarts it (Restart=on-failure, an upgrade, the watchdog)
    daemon.start()
    until(lambda: any(r["job_id"] == job for r in cluster.records()), 90, "the epilog's record",
          cluster.explain)
    (record,) = [r for r in cluster.records() if r["job_id"] == job]
    assert record["window"] == opened and record["daemon_restarts"] == 1
    assert record["duration_s"] >= 9.0

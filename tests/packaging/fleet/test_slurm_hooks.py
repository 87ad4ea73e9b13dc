"""The Slurm prolog and epilog in a fake job environment: a real private D-Bus with a fake aithermd on it
(windows with the daemon's name check), the real aithermctl and busctl, and a fake scontrol that records
its arguments (the epilog must not call it: slurmctld refuses to update a finished job).

The prolog takes a detached hold of the job's policy (from the job comment or a default) and starts the
job's scoped energy window; the epilog releases both, stops only its own window (by name) and records the
node's and the job's own joules. The real Slurm is in test_slurm_real.py.
"""

import asyncio
import json
import os
import shutil
import socket
import stat
import sys
import tempfile
from collections.abc import AsyncIterator
from dataclasses import dataclass, field
from pathlib import Path

import pytest

from aithermd.publish import wire
from tests.support.dbus import PrivateBus

dbus_fast = pytest.importorskip("dbus_fast")
from dbus_fast import DBusError  # noqa: E402
from dbus_fast.aio import MessageBus  # noqa: E402
from dbus_fast.service import ServiceInterface, method  # noqa: E402

ROOT = Path(__file__).resolve().parents[3]
SLURM = ROOT / "packaging" / "fleet" / "slurm"

STOP_DOC = {"name": "slurm-42", "duration_s": 3600.0,
            "joules": {"gpu0": 1_080_000.0, "gpu1": 720_000.5, "powercap:package-0": 360_000.0},
            "attributed": {"gpu1": 540_000.0, "cpu": 90_000.0}}


class FakeDaemon(ServiceInterface):
    """io.github.aithermd.Daemon1 with the four methods the hooks use; records every call."""

    def __init__(self) -> None:
        super().__init__(wire.INTERFACE)
        self.calls: list[tuple] = []
        self.holds: dict[int, str] = {}
        self.windows: dict[int, str] = {}

    @method()
    def HoldPolicy(self, policy: "s", reason: "s", timeout_s: "d", detached: "b") -> "u":  # noqa: F821
        self.calls.append(("HoldPolicy", policy, reason, timeout_s, detached))
        if policy not in ("ai-training", "quiet", "balanced"):
            raise DBusError(wire.ERROR_UNKNOWN_POLICY, f"no policy named {policy!r}")
        cookie = 7 + len(self.holds)
        self.holds[cookie] = policy
        return cookie

    @method()
    def ReleasePolicy(self, cookie: "u"):  # noqa: F821
        self.calls.append(("ReleasePolicy", cookie))
        if self.holds.pop(cookie, None) is None:
            raise DBusError(wire.ERROR_UNKNOWN_COOKIE, f"no hold {cookie}")

    @method()
    def StartScopedEnergyWindow(self, name: "s", timeout_s: "d", scope: "s") -> "t":  # noqa: F821
        self.calls.append(("StartScopedEnergyWindow", name, timeout_s, scope))
        window = 1000 + len(self.windows)
        self.windows[window] = (name, scope)
        return window

    @method()
    def StopEnergyWindowNamed(self, window: "t", name: "s") -> "s":  # noqa: F821
        self.calls.append(("StopEnergyWindowNamed", window, name))
        if window not in self.windows:
            raise DBusError(wire.ERROR_UNKNOWN_WINDOW, f"no open energy window {window}")
        if name and self.windows[window][0] != name:
            raise DBusError(wire.ERROR_WRONG_WINDOW, f"energy window {window} is {self.windows[window][0]!r}")
        opened, scope = self.windows.pop(window)
        return json.dumps({**STOP_DOC, "id": window, "name": opened, "scope": scope})

    @method()
    def ListEnergyWindows(self) -> "s":  # noqa: F821
        self.calls.append(("ListEnergyWindows",))
        return json.dumps([{"id": w, "name": n, "scope": s} for w, (n, s) in self.windows.items()])


@dataclass
class Node:
    """One fake compute node: the bus, the daemon on it (or none), and where the hooks keep their files."""

    address: str
    daemon: FakeDaemon | None
    tmp: Path
    env: dict[str, str] = field(default_factory=dict)

    @property
    def log(self) -> Path:
        return self.tmp / "log" / "slurm-energy.log"

    @property
    def state(self) -> Path:
        return self.tmp / "state"

    def scontrol_calls(self) -> list[list[str]]:
        path = self.tmp / "scontrol.calls"
        return [json.loads(line) for line in path.read_text().splitlines()] if path.exists() else []

    async def hook(self, name: str, **job: str) -> tuple[int, str]:
        env = {**self.env, **job}
        proc = await asyncio.create_subprocess_exec(
            str(SLURM / f"{name}.sh"), env=env, stdout=asyncio.subprocess.PIPE,
            stderr=asyncio.subprocess.STDOUT)
        out, _ = await asyncio.wait_for(proc.communicate(), 60)
        return proc.returncode or 0, out.decode()


def fake_scontrol(bindir: Path, record: Path) -> None:
    script = bindir / "scontrol"
    script.write_text(f"#!{sys.executable}\nimport json, sys\n"
                      f"open({str(record)!r}, 'a').write(json.dumps(sys.argv[1:]) + '\\n')\n")
    script.chmod(script.stat().st_mode | stat.S_IXUSR)


async def make_node(with_daemon: bool) -> AsyncIterator[Node]:
    if shutil.which("busctl") is None:
        pytest.skip("busctl is needed (scripts/system-packages.txt)")
    bus = PrivateBus.start("session")
    address = bus.address
    home = Path(tempfile.mkdtemp(prefix="aithermd-slurm-"))
    conn = None
    daemon = None
    try:
        if with_daemon:
            conn = await MessageBus(bus_address=address).connect()
            daemon = FakeDaemon()
            conn.export(wire.OBJECT_PATH, daemon)
            await conn.request_name(wire.BUS_NAME)
        bindir = home / "bin"
        bindir.mkdir()
        fake_scontrol(bindir, home / "scontrol.calls")
        venv_bin = Path(sys.executable).parent
        assert (venv_bin / "aithermctl").exists(), "aithermctl must be installed in the test venv"
        env = {
            "PATH": f"{bindir}:{venv_bin}:/usr/bin:/bin",
            "AITHERMD_BUS": address,
            "AITHERMD_SLURM_CONF": "/dev/null",
            "AITHERMD_SLURM_STATE_DIR": str(home / "state"),
            "AITHERMD_SLURM_LOG": str(home / "log" / "slurm-energy.log"),
            "SLURM_JOB_USER": "alice",
            "SLURM_NODELIST": "gpu-node-1",  # what slurmd 22.05 gives a prolog (no SLURM_JOB_NODELIST)
            "SLURM_JOB_NUM_NODES": "1",
        }
        yield Node(address, daemon, home, env)
    finally:
        if conn is not None:
            conn.disconnect()
        bus.stop()
        shutil.rmtree(home, ignore_errors=True)


@pytest.fixture()
async def node() -> AsyncIterator[Node]:
    async for n in make_node(with_daemon=True):
        yield n


@pytest.fixture()
async def empty_node() -> AsyncIterator[Node]:
    async for n in make_node(with_daemon=False):
        yield n


async def test_prolog_holds_the_commented_policy_and_starts_a_window(node: Node) -> None:
    rc, out = await node.hook("prolog", SLURM_JOB_ID="42",
                              SLURM_JOB_COMMENT="run 3 aithermd:policy=quiet lr=3e-4")
    assert rc == 0, out
    assert node.daemon is not None
    assert node.daemon.calls == [("HoldPolicy", "quiet", "slurm job 42", 0.0, True),
                                 ("StartScopedEnergyWindow", "slurm-42", 604800.0, "job:42")]
    assert (node.state / "42.hold").read_text() == "7\n"
    assert (node.state / "42.window").read_text() == "1000\n"
    assert (node.state / "42.policy").read_text() == "quiet\n"
    assert stat.S_IMODE((node.state / "42.hold").stat().st_mode) == 0o600


async def test_epilog_releases_both_and_records_the_jobs_own_joules(node: Node) -> None:
    job = {"SLURM_JOB_ID": "42", "SLURM_JOB_COMMENT": "aithermd:policy=quiet"}
    assert (await node.hook("prolog", **job))[0] == 0
    rc, out = await node.hook("epilog", **job)
    assert rc == 0, out
    assert node.daemon is not None
    assert node.daemon.calls[2:] == [("ReleasePolicy", 7), ("StopEnergyWindowNamed", 1000, "slurm-42")]
    assert node.daemon.holds == {} and node.daemon.windows == {}
    (line,) = node.log.read_text().splitlines()
    record = json.loads(line)
    assert record["job_id"] == 42 and record["user"] == "alice" and record["policy"] == "quiet"
    assert record["host"] == socket.gethostname() and record["window"] == 1000
    assert record["duration_s"] == 3600.0
    assert record["joules"] == STOP_DOC["joules"]
    assert record["attributed"] == STOP_DOC["attributed"]
    assert record["job_gpus"] is None  # SLURM_JOB_GPUS not set: every GPU of the node
    assert "0.175 kWh (its own share: cpu=90000J gpu1=540000J) in 3600s" in out
    assert node.scontrol_calls() == []  # slurmctld refuses updates of finished jobs
    assert sorted(p.name for p in node.state.iterdir()) == []


async def test_job_gpus_narrow_the_device_record(node: Node) -> None:
    job = {"SLURM_JOB_ID": "43", "SLURM_JOB_GPUS": "1"}
    await node.hook("prolog", **job)
    rc, out = await node.hook("epilog", **job)
    assert rc == 0, out
    record = json.loads(node.log.read_text())
    assert record["job_gpus"] == {"gpu1": 720_000.5}


async def test_a_stale_window_id_never_stops_another_jobs_window(node: Node) -> None:
    await node.hook("prolog", SLURM_JOB_ID="51")
    await node.hook("prolog", SLURM_JOB_ID="52")
    assert node.daemon is not None
    # job 51's saved id now names job 52's window (as ids that started at 1 after every restart did)
    (node.state / "51.window").write_text("1001\n")
    rc, out = await node.hook("epilog", SLURM_JOB_ID="51")
    assert rc == 0, out
    assert "not this job's open window" in out
    assert [w for w, (n, _s) in node.daemon.windows.items()] == [1001]  # job 52's is still open
    assert json.loads(node.log.read_text())["window"] == 1000  # found by its name, and stopped
    assert ("StopEnergyWindowNamed", 1001, "slurm-51") in node.daemon.calls


async def test_default_policy_when_the_comment_names_none(node: Node) -> None:
    await node.hook("prolog", SLURM_JOB_ID="44")
    assert node.daemon is not None
    assert node.daemon.calls[0] == ("HoldPolicy", "ai-training", "slurm job 44", 0.0, True)


async def test_empty_default_holds_nothing_but_still_measures(node: Node) -> None:
    node.env["AITHERMD_SLURM_DEFAULT_POLICY"] = ""
    await node.hook("prolog", SLURM_JOB_ID="45")
    rc, out = await node.hook("epilog", SLURM_JOB_ID="45")
    assert rc == 0, out
    assert node.daemon is not None
    assert [c[0] for c in node.daemon.calls] == ["StartScopedEnergyWindow", "StopEnergyWindowNamed"]
    assert json.loads(node.log.read_text())["policy"] is None


async def test_comment_text_cannot_inject(node: Node) -> None:
    await node.hook("prolog", SLURM_JOB_ID="46",
                    SLURM_JOB_COMMENT="aithermd:policy=quiet;touch${IFS}/tmp/x $(id)")
    assert node.daemon is not None
    assert node.daemon.calls[0][1] == "quiet"


async def test_unknown_policy_fails_open_and_strict_fails(node: Node) -> None:
    rc, out = await node.hook("prolog", SLURM_JOB_ID="47", SLURM_JOB_COMMENT="aithermd:policy=turbo")
    assert rc == 0 and "could not hold policy turbo" in out
    assert not (node.state / "47.hold").exists() and (node.state / "47.window").exists()
    node.env["AITHERMD_SLURM_STRICT"] = "1"
    assert node.daemon is not None
    before = len(node.daemon.calls)
    rc, out = await node.hook("prolog", SLURM_JOB_ID="48", SLURM_JOB_COMMENT="aithermd:policy=turbo")
    assert rc == 1
    # what Slurm does with a failed prolog: drain, requeue held (slurm.conf(5)); no window left open for a
    # job that does not run
    assert "requeues the job held (scontrol release 48" in out and "nohold_on_prolog_fail" in out
    assert [c[0] for c in node.daemon.calls[before:]] == ["HoldPolicy"]
    assert not (node.state / "48.window").exists()


async def test_multi_node_job_has_one_line_per_node(node: Node) -> None:
    job = {"SLURM_JOB_ID": "49", "SLURM_NODELIST": "gpu-node-[1-4]", "SLURM_JOB_NUM_NODES": "4"}
    await node.hook("prolog", **job)
    assert (await node.hook("epilog", **job))[0] == 0
    assert json.loads(node.log.read_text())["job_id"] == 49


async def test_no_daemon_never_blocks_the_node(empty_node: Node) -> None:
    rc, out = await empty_node.hook("prolog", SLURM_JOB_ID="50")
    assert rc == 0, out
    assert "could not hold" in out and "could not start an energy window" in out
    rc, out = await empty_node.hook("epilog", SLURM_JOB_ID="50")
    assert rc == 0, out
    assert not empty_node.log.exists() and empty_node.scontrol_calls() == []


async def test_bad_job_id_is_refused_quietly(node: Node) -> None:
    rc, out = await node.hook("prolog", SLURM_JOB_ID="42; reboot")
    assert rc == 0 and "not a job id" in out
    assert node.daemon is not None and node.daemon.calls == []


def test_scripts_are_executable() -> None:
    for name in ("prolog.sh", "epilog.sh"):
        assert os.access(SLURM / name, os.X_OK)

"""A simulated day on the workstation: GPU losses, NVML errors, a driver upgraded under the daemon, a hung
GPU, a GPU pulled and put back, a failing board sensor, two dbus-daemon restarts and a second aithermd
started beside the first. The day ends with every GPU controlled by the policy, every original restored at
the stop, and the shipped alerts firing on the series the exporter produced, scraped once a simulated
minute and checked with promtool.

The faults come through ``--fault`` specs (:mod:`aithermd.sim.faults`), as an admin would give them; the bus
is a real dbus-daemon restarted on its socket; the second instance is a real ``aithermd run`` process."""

from __future__ import annotations

import asyncio
import json
import shutil
import subprocess
import sys
from pathlib import Path

import pytest
from dbus_fast import Message
from prometheus_client.parser import text_string_to_metric_families

from aithermd.publish import metrics
from aithermd.settings import DaemonSettings
from aithermd.sim import faults
from aithermd.sim.runner import SimOptions, simulate
from tests.support.dbus import PrivateBus

ROOT = Path(__file__).resolve().parents[2]
RULES = ROOT / "packaging" / "fleet" / "prometheus" / "aithermd-alerts.yml"
INSTANCE = {"job": "aithermd", "instance": "ws1:8736"}
H = 3600.0
DAY = [
    "gpu1:GPU_IS_LOST@2h-2h30m",  # falls off the bus (Xid 79), back after a reset half an hour later
    "gpu0:UNKNOWN@5h-5h10m",  # NVML answers Unknown Error for gpu0 (a cgroup reload in a container)
    "nvml:LIB_RM_VERSION_MISMATCH@8h-8h20m",  # the driver upgraded under the daemon, modules reloaded later
    "gpu1/nvmlDeviceGetUtilizationRates:NO_DATA@11h-12h",
    "hwmon:nct6798-isa-0290/temp2:EIO@16h-16h05m",  # a board sensor fails for five minutes
    "gpu0:HANG@18h-18h01m",  # a call on gpu0 does not return for a minute
    "gpu1:ABSENT@20h-20h30m",  # pulled from the bus (hot-remove, driver unbind) and put back
]
BUS_RESTARTS = (4 * H, 14 * H)
SECOND_INSTANCE = 6 * H
SCRAPED = {"aithermd_gpu_up", "aithermd_gpus_expected", "aithermd_gpus_present", "aithermd_nvml_up",
           "aithermd_faults_total", "aithermd_nvml_reinits_total", "aithermd_dbus_connected",
           "aithermd_dbus_reconnects_total"}


class Day:
    """What the day's listeners saw: promtool input series (one sample per simulated minute), bus restarts,
    the second instance's outcome."""

    def __init__(self, bus: PrivateBus) -> None:
        self.bus = bus
        self.handle = None
        self.daemon = None
        self.machine = None
        self.series: dict[tuple[str, tuple], list[str]] = {}
        self.minute = 0
        self.t0: float | None = None
        self.restarts_done: list[float] = []
        self.second: subprocess.CompletedProcess | None = None
        self.restore: subprocess.CompletedProcess | None = None

    def attach(self, daemon, machine) -> None:
        self.daemon, self.machine = daemon, machine
        self.handle = metrics.start("none", daemon.hub)

    def __call__(self, snapshot, events) -> None:
        if self.t0 is None:
            self.t0 = snapshot.t_mono
        t = snapshot.t_mono - self.t0
        while self.minute * 60.0 <= t:
            self._scrape()
            self.minute += 1
        for at in BUS_RESTARTS:
            if t >= at and at not in self.restarts_done:
                self.restarts_done.append(at)
                self.bus.restart()  # systemctl restart dbus: the daemon's connection is dropped
        if t >= SECOND_INSTANCE and self.second is None:
            self._second_instance()

    def _scrape(self) -> None:
        text = metrics.render(self.handle).decode()
        for family in text_string_to_metric_families(text):
            for s in family.samples:
                if s.name in SCRAPED:
                    key = (s.name, tuple(sorted({**s.labels, **INSTANCE}.items())))
                    self.series.setdefault(key, ["_"] * self.minute).append(repr(float(s.value)))
        for values in self.series.values():
            values.extend("_" * (self.minute + 1 - len(values)))

    def _second_instance(self) -> None:
        """A second aithermd on the same machine and state directory, and an admin's aithermd restore."""
        s = self.daemon.settings
        cmd = [sys.executable, "-m", "aithermd", "run", "--sysfs-root", str(s.sysfs_root), "--state-dir",
               str(s.state_dir), "--bus", "none", "--metrics-listen", "none", "--no-nvml", "--log-format",
               "json"]
        env = {"AITHERMD_RUNTIME_DIR": str(s.runtime_dir), "PATH": "/usr/bin:/bin"}
        self.second = subprocess.run(cmd, capture_output=True, text=True, timeout=120, env=env)
        self.restore = subprocess.run([sys.executable, "-m", "aithermd", "restore", "--state-dir",
                                       str(s.state_dir)], capture_output=True, text=True, timeout=120)

    def promtool_series(self) -> list[dict]:
        return [{"series": name + "{" + ",".join(f'{k}="{v}"' for k, v in labels) + "}",
                 "values": " ".join(values)} for (name, labels), values in sorted(self.series.items())]


@pytest.fixture
def bus():
    with PrivateBus.start("system") as b:
        yield b


def gpu_down(labels: dict) -> dict:
    g, uuid, bus_id = labels["gpu"], labels["uuid"], labels["pci_bus_id"]
    return {"exp_labels": {"severity": "critical", **INSTANCE, "gpu": g, "uuid": uuid, "pci_bus_id": bus_id},
            "exp_annotations": {
                "summary": f"GPU {g} ({bus_id}) on {INSTANCE['instance']} does not answer",
                "description": f"GPU {g} ({uuid}, PCI {bus_id}) has not answered NVML for 2 minutes; "
                               "aithermd checks it again with backoff and takes it back when it answers. See "
                               "`journalctl -u aithermd` (gpu_lost, gpu_down, nvml_call_hung) and the kernel "
                               "log for Xid errors."}}


def alerts_fired(series: list[dict], gpu1: dict, tmp_path: Path) -> subprocess.CompletedProcess:
    """promtool test rules: the shipped alerts on the day's scraped series."""
    promtool = shutil.which("promtool")
    if promtool is None:
        pytest.skip("promtool is not installed (see scripts/system-packages.txt)")
    instance = INSTANCE["instance"]
    missing = {"exp_labels": {"severity": "warning", **INSTANCE}, "exp_annotations": {
        "summary": f"{instance}: fewer GPUs answer than expected",
        "description": f"Only 1 of the GPUs aithermd expects on {instance} answer NVML. A GPU lost, removed, "
                       "not ready since boot or released (`aithermctl gpu release`); `aithermctl status` "
                       "names it."}}
    nvml_down = {"exp_labels": {"severity": "critical", **INSTANCE}, "exp_annotations": {
        "summary": f"NVML is down on {instance}",
        "description": f"aithermd cannot initialise NVML on {instance} and keeps trying with backoff; no GPU "
                       "is read or controlled meanwhile. After a driver upgrade: reboot, or reload the "
                       "nvidia modules. `journalctl -u aithermd` (nvml_init_failed) gives the error."}}
    chip = "hwmon:nct6798-isa-0290"
    board = {"exp_labels": {"severity": "warning", **INSTANCE, "device": chip}, "exp_annotations": {
        "summary": f"device {chip} on {instance} reports faults",
        "description": f"1 faults on {chip} in 10 minutes (failed reads, implausible values, a lost GPU). "
                       "`aithermctl doctor` and `journalctl -u aithermd` tell which."}}
    tests = [
        {"eval_time": "1h59m", "alertname": "AithermdGpuDown", "exp_alerts": []},
        {"eval_time": "2h05m", "alertname": "AithermdGpuDown", "exp_alerts": [gpu_down(gpu1)]},
        {"eval_time": "3h", "alertname": "AithermdGpuDown", "exp_alerts": []},  # back after its reset
        # the bus restarted at 4 h and 14 h: the daemon was back on it long before the alert's 5 minutes
        {"eval_time": "4h06m", "alertname": "AithermdDbusDisconnected", "exp_alerts": []},
        {"eval_time": "14h06m", "alertname": "AithermdDbusDisconnected", "exp_alerts": []},
        {"eval_time": "8h07m", "alertname": "AithermdNvmlDown", "exp_alerts": [nvml_down]},
        {"eval_time": "9h", "alertname": "AithermdNvmlDown", "exp_alerts": []},  # initialised again
        {"eval_time": "16h03m", "alertname": "AithermdDeviceFaults", "exp_alerts": [board]},
        {"eval_time": "20h08m", "alertname": "AithermdGpuMissing", "exp_alerts": [missing]},
        {"eval_time": "23h55m", "alertname": "AithermdGpuMissing", "exp_alerts": []},  # back, adopted
        {"eval_time": "23h55m", "alertname": "AithermdGpuDown", "exp_alerts": []},
    ]
    doc = {"rule_files": [str(RULES)], "evaluation_interval": "1m",
           "tests": [{"interval": "1m", "input_series": series, "alert_rule_test": tests}]}
    path = tmp_path / "day.test.yml"
    path.write_text(json.dumps(doc, indent=1))  # JSON is YAML
    return subprocess.run([promtool, "test", "rules", str(path)], capture_output=True, text=True, timeout=300)


@pytest.mark.timeout(900)  # 8640 ticks and a second daemon: ≈ 3 min on the loaded 2-core build VM
async def test_a_day_of_failures_ends_controlled_restorable_and_alerted(tmp_path, bus):
    day = Day(bus)
    originals: dict[int, float] = {}
    end: dict = {}

    def attach(daemon, machine):
        day.attach(daemon, machine)
        originals.update({i: machine.nvml.power_limit_w(i) for i in range(len(machine.gpus))})

    async def check_bus() -> None:  # a client on the restarted bus reaches the daemon by its name
        from dbus_fast.aio import MessageBus

        from aithermd.publish import wire
        client = await MessageBus(bus_address=bus.address).connect()
        try:
            reply = await client.call(Message(destination=wire.BUS_NAME, path=wire.OBJECT_PATH,
                                              interface=wire.INTERFACE, member="GetSnapshot"))
            end["bus_seq"] = json.loads(reply.body[0])["seq"]
        finally:
            client.disconnect()

    def near_the_end(snapshot, events) -> None:
        t = snapshot.t_mono - (day.t0 or snapshot.t_mono)
        if t >= 23.5 * H and "journal" not in end:
            journal = day.daemon.tick.applier.journal.entries()
            end["journal"] = {k: dict(v.saved) for k, v in journal.items()}
            end["snapshot"] = snapshot
            end["status"] = dict(day.daemon.hub.status.get("dbus", {}))
            end["task"] = asyncio.get_running_loop().create_task(check_bus())

    settings = DaemonSettings(tick_s=10.0, bus=bus.address, metrics_listen="none", policy="balanced",
                              runtime_dir=tmp_path / "run", log_level="warning")
    opts = SimOptions(duration_s=24 * H, speedup=0.0, state_dir=tmp_path / "state", max_step_s=10.0,
                      wall_start=1_767_225_600.0, faults=faults.parse_all(DAY), listeners=[day, near_the_end],
                      on_daemon=attach)
    try:
        result = await simulate(settings, opts, None)
    finally:
        if day.handle is not None:
            day.handle.stop()
    await end["task"]

    # a second daemon on the same machine refused, before it touched anything; so did a restore under it
    assert day.second.returncode == 1 and "is running on" in day.second.stderr, day.second.stderr[-2000:]
    assert day.restore.returncode == 1 and "nothing restored" in day.restore.stderr
    # the bus restarted twice: the daemon came back on it each time, under its name
    assert day.restarts_done == list(BUS_RESTARTS)
    assert end["status"] == {"connected": True, "reconnects": 2} and end["bus_seq"] >= end["snapshot"].seq
    # every GPU controlled at the end of the day: present, answering, its limit the policy's
    snap = end["snapshot"]
    assert [d.id for d in snap.devices if d.kind.value == "gpu"] == ["gpu0", "gpu1"]
    assert {g: s["state"] for g, s in snap.health["nvml"]["gpus"].items()} == {"gpu0": "ok", "gpu1": "ok"}
    for gpu in ("gpu0", "gpu1"):
        decision, value = snap.decisions[f"{gpu}/power_limit"], snap.knobs[f"{gpu}/power_limit"].value
        assert decision.layer.value == "policy" and abs(value - decision.value) <= 0.5, (gpu, decision, value)
    assert not [k for k in snap.degraded if k.startswith("gpu")]
    # every original restorable: journaled as found, and put back at the stop
    for i, watts in originals.items():
        assert end["journal"][f"gpu{i}/power_limit"]["limit_mw"] == round(watts * 1000)
    assert result.code == 0 and not (tmp_path / "state" / "journal.json").exists()
    assert {i: result.data["gpus"][f"gpu{i}"]["final_limit_w"] for i in originals} == originals
    # the alerts fired (and cleared) on the series the exporter produced
    gpu1 = next(dict(labels) for (name, labels), _ in day.series.items()
                if name == "aithermd_gpu_up" and dict(labels)["gpu"] == "1")
    done = alerts_fired(day.promtool_series(), gpu1, tmp_path)
    assert done.returncode == 0, done.stdout[-4000:] + done.stderr[-2000:]

"""The CPU's own knobs: the governor on the recorded intel_pstate tree of prometheus/procfs, and EPP, boost
and platform_profile added to that tree with the values the kernel's documentation gives (intel_pstate.rst,
amd-pstate.rst, ABI/testing/sysfs-platform_profile): what discovery finds, what writes reach every cpufreq
policy, what the drivers refuse, what a restore puts back, and that a running power-profiles-daemon or
tuned is never fought."""

from __future__ import annotations

import errno
import json
import os
from pathlib import Path

import pytest

from aithermd.actuate.journal import Journal
from aithermd.actuate.restore import restore_journal
from aithermd.backends.registry import open_backend
from aithermd.backends.cpu_knobs import CpuKnobBackend, profile_managers, run_root_of
from aithermd.errors import BackendError, NoPermission, OutOfRange
from aithermd.model import KnobKind, Reading, Status
from aithermd.policy.devicecheck import check_devices
from aithermd.policy.engine import EngineInput, evaluate, initial_state
from aithermd.policy.loader import load_policy_text
from tests.backends.faults import FaultIO
from tests.support.machines import copy_machine

RECORDED = "prometheus-procfs-sys-devices-system-cpu-cpufreq.ttar"
# amd-pstate.rst and intel_pstate.rst: the preferences in the kernel's order, "default" first on amd-pstate
AVAILABLE_EPP = "default performance balance_performance balance_power power"


def recorded(tmp_path: Path) -> Path:
    return copy_machine(tmp_path, RECORDED)


def with_epp(tmp_path: Path, policies: int = 2) -> Path:
    """The recorded tree with ``policies`` policies that have EPP (amd-pstate-epp's files), boost through
    intel_pstate/no_turbo and an ACPI platform profile."""
    root = recorded(tmp_path)
    cpufreq = root / "devices" / "system" / "cpu" / "cpufreq"
    for n in range(policies):
        p = cpufreq / f"policy{n}"
        p.mkdir(exist_ok=True)
        for name in ("scaling_available_governors", "scaling_governor", "scaling_driver"):
            if not (p / name).exists():
                (p / name).write_text((cpufreq / "policy0" / name).read_text())
        (p / "energy_performance_available_preferences").write_text(AVAILABLE_EPP + "\n")
        (p / "energy_performance_preference").write_text("balance_performance\n")
    pstate = root / "devices" / "system" / "cpu" / "intel_pstate"
    pstate.mkdir()
    (pstate / "no_turbo").write_text("0\n")
    acpi = root / "firmware" / "acpi"
    acpi.mkdir(parents=True)
    (acpi / "platform_profile_choices").write_text("low-power balanced performance\n")
    (acpi / "platform_profile").write_text("balanced\n")
    return root


def knobs(backend: CpuKnobBackend) -> dict:
    return {k.id: k for d in backend.discover() for k in d.knobs}


def test_the_recorded_intel_pstate_tree_has_a_governor_knob(tmp_path):
    root = recorded(tmp_path)
    backend = CpuKnobBackend(str(root), managed_by=[])
    (dev,) = backend.discover()
    assert (dev.id, dev.name, dev.info["scaling_driver"]) == ("cpufreq", "cpufreq (intel_pstate)", "intel_pstate")
    (gov,) = dev.knobs
    assert (gov.id, gov.kind, gov.choices, gov.min, gov.max, gov.writable) == (
        "cpufreq/governor", KnobKind.GOVERNOR, ("performance", "powersave"), 0.0, 1.0, True)
    assert backend.sample().knobs["cpufreq/governor"].value == 1.0  # powersave, as recorded
    saved = backend.save_knob(gov.id)
    assert saved == {"files": {"devices/system/cpu/cpufreq/policy0/scaling_governor": "powersave"}}
    backend.write_knob(gov.id, 0.0)
    policy0 = root / "devices" / "system" / "cpu" / "cpufreq" / "policy0"
    assert (policy0 / "scaling_governor").read_text() == "performance\n"
    assert backend.read_knob(gov.id).value == 0.0
    backend.restore_knob(gov.id, json.loads(json.dumps(saved)))
    assert (policy0 / "scaling_governor").read_text() == "powersave\n"


def test_epp_boost_and_platform_profile(tmp_path):
    root = with_epp(tmp_path)
    backend = CpuKnobBackend(str(root), managed_by=[])
    found = knobs(backend)
    assert sorted(found) == ["acpi/platform_profile", "cpufreq/boost", "cpufreq/epp", "cpufreq/governor"]
    epp = found["cpufreq/epp"]
    assert epp.choices == ("performance", "balance_performance", "balance_power", "power")  # "default" left out
    values = {k: v.value for k, v in backend.sample().knobs.items()}
    assert values == {"cpufreq/epp": 1.0, "cpufreq/governor": 1.0, "cpufreq/boost": 1.0,
                      "acpi/platform_profile": 1.0}
    cpufreq = root / "devices" / "system" / "cpu" / "cpufreq"
    backend.write_knob("cpufreq/epp", 2.0)  # balance_power, on every policy
    assert [(cpufreq / f"policy{n}" / "energy_performance_preference").read_text() for n in (0, 1)] == \
        ["balance_power\n"] * 2
    backend.write_knob("cpufreq/boost", 0.0)  # boost off is no_turbo 1
    assert (root / "devices" / "system" / "cpu" / "intel_pstate" / "no_turbo").read_text() == "1\n"
    assert backend.read_knob("cpufreq/boost").value == 0.0
    backend.write_knob("acpi/platform_profile", 0.0)
    assert (root / "firmware" / "acpi" / "platform_profile").read_text() == "low-power\n"
    for bad in (float("nan"), -1.0, 4.0, 1.5):
        with pytest.raises(OutOfRange):
            backend.write_knob("cpufreq/epp", bad)


def test_epp_reads_a_raw_value_as_the_nearest_name_and_default_as_unknown(tmp_path):
    root = with_epp(tmp_path, policies=1)
    backend = CpuKnobBackend(str(root), managed_by=[])
    backend.discover()
    f = root / "devices" / "system" / "cpu" / "cpufreq" / "policy0" / "energy_performance_preference"
    f.write_text("200\n")  # intel_pstate shows the raw EPP once one was written: nearest is balance_power (192)
    backend.discover()
    assert backend.read_knob("cpufreq/epp").value == 2.0
    f.write_text("default\n")
    backend.discover()
    kv = backend.read_knob("cpufreq/epp")
    assert (kv.value, kv.status) == (None, Status.OK)
    saved = backend.save_knob("cpufreq/epp")
    backend.write_knob("cpufreq/epp", 3.0)
    backend.restore_knob("cpufreq/epp", saved)
    assert f.read_text() == "default\n"  # exactly what was found


def test_epp_refused_while_the_governor_is_performance_says_what_to_do(tmp_path):
    root = with_epp(tmp_path)
    io = FaultIO()
    io.write_faults["energy_performance_preference"] = OSError(errno.EBUSY, "Device or resource busy")
    backend = CpuKnobBackend(str(root), io=io, managed_by=[])
    backend.discover()
    with pytest.raises(BackendError, match="governor to powersave first") as err:
        backend.write_knob("cpufreq/epp", 3.0)
    assert "2 of 2 files" in str(err.value)


def test_a_driver_refusing_a_profile_is_out_of_range(tmp_path):
    root = with_epp(tmp_path)
    io = FaultIO()
    io.write_faults["platform_profile"] = OSError(errno.EINVAL, "Invalid argument")
    backend = CpuKnobBackend(str(root), io=io, managed_by=[])
    backend.discover()
    with pytest.raises(OutOfRange):
        backend.write_knob("acpi/platform_profile", 2.0)
    assert (root / "firmware" / "acpi" / "platform_profile").read_text() == "balanced\n"


@pytest.mark.parametrize(("rel", "name"), [
    ("systemd/units/invocation:power-profiles-daemon.service", "power-profiles-daemon"),
    ("systemd/units/invocation:tuned.service", "tuned"),
    ("tuned/tuned.pid", "tuned"),
])
def test_a_running_profile_daemon_owns_the_knobs(tmp_path, rel, name):
    root = with_epp(tmp_path)
    run = Path(run_root_of(str(root)))
    assert run == tmp_path / "run"
    assert profile_managers(str(run)) == []
    (run / rel).parent.mkdir(parents=True)
    os.symlink("0123456789abcdef", run / rel)  # systemd's invocation link points at the invocation id
    assert profile_managers(str(run)) == [name]
    backend = CpuKnobBackend(str(root))
    found = knobs(backend)
    assert len(found) == 4 and not any(k.writable for k in found.values())
    assert all(k.why_not.startswith(f"{name} manages the CPU's power profile") for k in found.values())
    for kid in found:
        with pytest.raises(NoPermission):
            backend.write_knob(kid, 0.0)
    assert (root / "firmware" / "acpi" / "platform_profile").read_text() == "balanced\n"


def test_restore_from_another_process_and_a_vanished_policy(tmp_path):
    root = with_epp(tmp_path)
    backend = CpuKnobBackend(str(root), managed_by=[])
    backend.discover()
    saved = backend.save_knob("cpufreq/epp")
    backend.write_knob("cpufreq/epp", 3.0)
    for f in (root / "devices" / "system" / "cpu" / "cpufreq" / "policy1").iterdir():
        f.unlink()  # the CPUs of policy1 went offline: their cpufreq files are gone
    (root / "devices" / "system" / "cpu" / "cpufreq" / "policy1").rmdir()
    other = open_backend(backend.locator())
    other.discover()
    other.restore_knob("cpufreq/epp", saved)
    assert (root / "devices" / "system" / "cpu" / "cpufreq" / "policy0" /
            "energy_performance_preference").read_text() == "balance_performance\n"
    with pytest.raises(BackendError, match="outside the sysfs root"):
        other.restore_knob("cpufreq/epp", {"files": {"../../etc/passwd": "x"}})


POLICY = """
rules:
  - name: feed-the-gpus
    kind: cpu_knobs
    when: {metric: cpu.utilization_pct, below: 50, stat: last}
    epp: power
    boost: false
    platform_profile: quiet          # not offered by this machine: left alone
  - name: otherwise
    kind: cpu_knobs
    epp: balance_performance
    governor: powersave
"""


def test_a_policy_drives_them_and_the_journal_puts_them_back(tmp_path):
    root = with_epp(tmp_path / "m")
    backend = CpuKnobBackend(str(root), managed_by=[])
    devices = tuple(backend.discover())
    policy = load_policy_text(POLICY, name="cpu")
    sample = backend.sample()
    idle = EngineInput(t_mono=0.0, t_wall=1_767_268_800.0, devices=devices, knobs=sample.knobs,
                       readings={"cpu/utilization": Reading("cpu/utilization", 20.0)})
    decisions = evaluate(policy, (), idle, initial_state()).decisions
    assert {k: (d.value, d.rule) for k, d in decisions.items()} == {
        "cpufreq/epp": (3.0, "cpu/feed-the-gpus"), "cpufreq/boost": (0.0, "cpu/feed-the-gpus"),
        "cpufreq/governor": (1.0, "cpu/otherwise")}
    assert decisions["cpufreq/epp"].reason == "cpufreq: epp power"
    errors = check_devices(policy, devices)
    assert len(errors) == 1 and "'quiet' is not offered by this machine's acpi/platform_profile" in str(errors[0])
    assert "(it offers: low-power, balanced, performance)" in str(errors[0])
    journal, boot = Journal(tmp_path / "state"), "boot-1"
    for kid in ("cpufreq/epp", "cpufreq/boost"):
        journal.record(kid, kid.split("/")[0], backend.locator(), backend.save_knob(kid), 0, boot_id=boot)
        backend.write_knob(kid, decisions[kid].value)
    epp = root / "devices" / "system" / "cpu" / "cpufreq" / "policy1" / "energy_performance_preference"
    no_turbo = root / "devices" / "system" / "cpu" / "intel_pstate" / "no_turbo"
    assert (epp.read_text(), no_turbo.read_text()) == ("power\n", "1\n")
    report = restore_journal(journal, boot_id=boot)  # as `aithermd restore` does, from the locators alone
    assert report.ok and sorted(report.restored) == ["cpufreq/boost", "cpufreq/epp"]
    assert (epp.read_text(), no_turbo.read_text()) == ("balance_performance\n", "0\n")


def test_the_shipped_workstation_policy_eases_the_epp_while_the_gpus_train(tmp_path):
    from aithermd.policy.loader import load_policy_file
    from tests.policy.machines import gpu_values, tick, workstation

    backend = CpuKnobBackend(str(with_epp(tmp_path)), managed_by=[])
    devices = (*workstation(1), *backend.discover())
    policy = load_policy_file(Path(__file__).resolve().parents[2] / "policies" / "workstation.yaml")
    knobs = {k: v.value for k, v in backend.sample().knobs.items()}
    state, epp = initial_state(), []
    for t in range(60):
        training = 10 <= t < 40
        values = {**gpu_values(0, 95.0 if training else 0.0, 400.0 if training else 30.0), "cpu/utilization": 20.0}
        result = evaluate(policy, (), tick(devices, float(t), values, knobs=knobs), state)
        state = result.state
        d = result.decisions.get("cpufreq/epp")
        epp.append(None if d is None else d.value)
    # balance_power once gpu0's 20 s mean utilization passes 40 % (from t 20), until it falls back under it
    assert epp[:20] == [None] * 20 and epp[20:51] == [2.0] * 31 and epp[51:] == [None] * 9


def test_aithermd_sensors_shows_each_knob_by_its_name_and_choices(tmp_path, capsys):
    from aithermd.cli import main

    root = with_epp(tmp_path)
    (root / "class" / "hwmon").mkdir(parents=True)
    assert main(["sensors", "--sysfs-root", str(root), "--interval", "0"]) == 0
    out = capsys.readouterr().out
    assert "epp:      balance_performance  epp       one of performance|balance_performance|balance_power|power" \
           "  writable" in out
    assert "platform_profile: balanced  platform_profile  one of low-power|balanced|performance  writable" in out
    assert main(["sensors", "--sysfs-root", str(root), "--interval", "0", "--json"]) == 0
    doc = json.loads(capsys.readouterr().out)
    (epp,) = [k for d in doc["devices"] for k in d["knobs"] if k["id"] == "cpufreq/epp"]
    assert (epp["value"], epp["choices"][int(epp["value"])]) == (1, "balance_performance")


class PstateIO(FaultIO):
    """intel_pstate in active mode as intel_pstate.rst describes it: while a policy's governor is
    ``performance`` its EPP reads ``performance`` and a write to it is refused with EBUSY; back on
    ``powersave``, the EPP found before is in force again."""

    def __init__(self) -> None:
        super().__init__()
        self.before: dict[str, bytes] = {}

    def write(self, path: str, data: bytes) -> None:
        policy, name = os.path.split(path)
        epp, governor = os.path.join(policy, "energy_performance_preference"), os.path.join(policy,
                                                                                           "scaling_governor")
        if name == "energy_performance_preference" and Path(governor).read_text().strip() == "performance":
            raise OSError(errno.EBUSY, "Device or resource busy")
        super().write(path, data)
        if name == "scaling_governor" and os.path.exists(epp):
            if data.strip() == b"performance":
                self.before.setdefault(policy, Path(epp).read_bytes())
                Path(epp).write_text("performance\n")
            elif policy in self.before:
                Path(epp).write_bytes(self.before.pop(policy))


@pytest.mark.parametrize("found", ["powersave", "performance"])
def test_a_restore_puts_the_governor_and_the_epp_back_whichever_intel_pstate_refuses_first(tmp_path, found):
    """EPP cannot be written while the governor is ``performance`` (EBUSY). Governor set last by the daemon:
    restored first (newest first), and the EPP then goes back. Governor found at ``performance``: the EPP
    was journaled first (its first write was refused), so the governor goes back first; the EPP restore then
    failed with EBUSY and stayed journaled, failing every restore after, though the EPP read exactly what
    was found. A file that already reads its saved text is no longer written."""
    root = with_epp(tmp_path)
    policies = sorted((root / "devices" / "system" / "cpu" / "cpufreq").glob("policy*"))
    for p in policies:
        (p / "scaling_governor").write_text(f"{found}\n")
        if found == "performance":
            (p / "energy_performance_preference").write_text("performance\n")
    io = PstateIO()
    backend = CpuKnobBackend(str(root), io=io, managed_by=[])
    found_knobs = knobs(backend)
    governors, epps = found_knobs["cpufreq/governor"].choices, found_knobs["cpufreq/epp"].choices
    journal, boot = Journal(tmp_path / "state"), "boot-1"

    def write(kid: str, value: str) -> None:
        if kid not in journal.entries():
            journal.record(kid, "cpufreq", backend.locator(), backend.save_knob(kid), 0, boot_id=boot)
        backend.write_knob(kid, float((governors if kid.endswith("governor") else epps).index(value)))

    if found == "performance":  # the daemon eases the CPU: the governor first, else EBUSY
        with pytest.raises(BackendError, match="EBUSY"):
            write("cpufreq/epp", "balance_power")
        write("cpufreq/governor", "powersave")
        write("cpufreq/epp", "balance_power")
    else:  # the daemon eases the EPP, then pins the governor at performance
        write("cpufreq/epp", "power")
        write("cpufreq/governor", "performance")
    report = restore_journal(journal, backends=[backend], boot_id=boot)
    assert report.ok and report.failed == {}
    expected_epp = "performance" if found == "performance" else "balance_performance"
    for p in policies:
        assert (p / "scaling_governor").read_text().strip() == found
        assert (p / "energy_performance_preference").read_text().strip() == expected_epp
    assert journal.entries() == {}

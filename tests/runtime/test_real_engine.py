"""The loop with the real hwmon backend, the real engine and the shipped policies, on a copied machine, in
process with a simulated clock: faults drive fans to full, drift, step-back, restore."""

from __future__ import annotations

import pytest

from aithermd.backends.hwmon import HwmonBackend
from aithermd.model import Layer, Status
from aithermd.runtime.daemon import Daemon
from aithermd.settings import DaemonSettings
from tests.support.machines import copy_machine
from tests.support.proc import knob_files

NCT = "devices/platform/nct6775.656/hwmon/hwmon1"
K10 = "hwmon:k10temp-pci-00c3"


@pytest.fixture
def machine(tmp_path):
    root = copy_machine(tmp_path)
    settings = DaemonSettings(sysfs_root=root, state_dir=tmp_path / "state", bus="none",
                              metrics_listen="none", nvml=False)
    return root, settings, knob_files(root)


def tctl_file(root):
    return next(p for p in (root / "devices").rglob("temp1_input")
                if (p.parent / "name").read_text().strip() == "k10temp")


def make(settings, clock, root):
    return Daemon(settings, clock=clock, backends=[HwmonBackend(str(root))], sleep=clock.sleep)


async def test_shipped_balanced_takes_the_board_fans_and_gives_them_back(machine, clock):
    root, settings, original = machine
    d = make(settings, clock, root)
    during = []
    assert await d.run(max_ticks=3, until=lambda: during.append(knob_files(root)) and False) == 0
    manual = {k for k, v in during[0].items() if k.startswith(NCT) and k.endswith("_enable") and v == "1\n"}
    assert len(manual) == 6
    assert all(d.hub.latest.decisions[f"hwmon:nct6798-isa-0290/pwm{i}"].rule == "balanced/board-fans"
               for i in range(1, 7))
    assert knob_files(root) == original


async def test_an_implausible_temperature_drives_its_fans_to_full(machine, clock):
    root, settings, original = machine
    d = make(settings, clock, root)
    tctl = tctl_file(root)

    def step():
        if d.hub.latest.seq == 2:
            tctl.write_text("-128000\n")  # a diode that reads -128 °C: nonsense
        return False

    seen = []
    await d.run(max_ticks=4, until=lambda: step() or seen.append(knob_files(root)) and False)
    snap = d.hub.latest
    assert snap.readings[f"{K10}/temp1"].status is Status.IMPLAUSIBLE
    assert f"{K10}/temp1" in snap.degraded
    for i in range(1, 7):
        decision = snap.decisions[f"hwmon:nct6798-isa-0290/pwm{i}"]
        assert decision.layer is Layer.SAFETY and decision.value == 100.0
        assert seen[-1][f"{NCT}/pwm{i}"] == "255\n"
    faults = [e for e in d.hub.recent_events() if e.kind == "fault"]
    assert [e.subject for e in faults] == [f"{K10}/temp1"]
    assert knob_files(root) == original


async def test_fancontrol_rewriting_a_pwm_makes_the_daemon_step_back(machine, clock):
    root, settings, original = machine
    d = make(settings, clock, root)
    pwm3 = root / NCT / "pwm3"

    def fancontrol(t):
        if d.hub.latest is not None:
            pwm3.write_text("222\n")  # another controller writes its own value every cycle

    d.before_sample = fancontrol
    await d.run(max_ticks=8)
    events = d.hub.recent_events()
    drifts = [e for e in events if e.kind == "drift" and e.subject.endswith("/pwm3")]
    conflicts = [e for e in events if e.kind == "conflict"]
    assert len(drifts) == 3 and "changed behind our back" in drifts[0].message
    assert [e.subject for e in conflicts] == ["hwmon:nct6798-isa-0290/pwm3"]
    assert "hwmon:nct6798-isa-0290/pwm3" in d.hub.latest.degraded
    # stepping back hands the fan back to its original mode at once (never left manual at our last duty);
    # the other controller has it from then on, so its value stays; everything else is put back at the end
    (handed,) = [e for e in events if e.kind == "restore" and e.subject.endswith("/pwm3")]
    assert "handed back while stepped back" in handed.message
    left = knob_files(root)
    pwm3_file = next(k for k in original if k.endswith("hwmon1/pwm3"))
    assert left[pwm3_file] == "222\n" and left == {**original, pwm3_file: "222\n"}


async def test_a_driver_resetting_the_mode_is_drift_and_is_corrected(machine, clock):
    root, settings, original = machine
    d = make(settings, clock, root)
    enable = root / NCT / "pwm1_enable"

    def reset(t):
        if d.hub.latest is not None and d.hub.latest.seq == 2:
            enable.write_text("5\n")  # e.g. after resume the chip is automatic again

    d.before_sample = reset
    seen = []
    await d.run(max_ticks=4, until=lambda: seen.append(enable.read_text()) and False)
    drift = [e for e in d.hub.recent_events() if e.kind == "drift"]
    assert len(drift) == 1 and "mode manual → auto" in drift[0].message
    assert seen[-1] == "1\n"  # taken back once, not a fight
    assert knob_files(root) == original


async def test_one_sentinel_reading_is_held_and_never_moves_the_fans(machine, clock):
    """+127 °C for one sample (a saturated register) on Tctl: held at the last good value; the board fans
    stay on their curve (before sensor trust they went to 100 % and ramped down for a minute)."""
    root, settings, original = machine
    d = make(settings, clock, root)
    tctl = tctl_file(root)
    good = tctl.read_text()
    seen = []

    def step():
        seq = d.hub.latest.seq
        tctl.write_text("127000\n" if seq == 2 else good)
        seen.append({k: v for k, v in d.hub.latest.decisions.items() if k.endswith("pwm1")})
        return False

    await d.run(max_ticks=5, until=step)
    pwm1 = [dec["hwmon:nct6798-isa-0290/pwm1"] for dec in seen]
    assert all(dec.layer is Layer.POLICY and dec.value < 50.0 for dec in pwm1), pwm1
    assert not [e for e in d.hub.recent_events() if e.kind == "fault"]
    assert knob_files(root) == original


async def test_a_policy_without_a_source_here_is_a_warning_at_start_and_reload(machine, clock):
    from structlog.testing import capture_logs

    root, settings, _ = machine
    policies = root.parent / "policies"
    policies.mkdir()
    (policies / "intel.yaml").write_text(
        "curves:\n  board: {kind: points, source: {max: ['Package id *']}, points: [[40, 30], [85, 100]]}\n"
        "rules:\n  - {name: board-fans, kind: fan, fans: {chip: 'nct*'}, curve: board}\n")
    settings = settings.replace(**{"policy_dirs": [policies], "policy": "intel",
                                           "policy_pinned": True})
    d = make(settings, clock, root)

    def step():
        if d.hub.latest.seq == 1:
            d.request_reload()
        return False

    with capture_logs() as logs:
        await d.run(max_ticks=3, until=step)
    warnings = [e for e in logs if e["event"] == "no_temperature_source"]
    assert len(warnings) == 2  # at start and at the reload
    assert warnings[0]["policy"] == "intel" and len(warnings[0]["fans"]) == 6
    assert "run at 100 %" in warnings[0]["message"]


async def test_a_fan_overridden_to_stop_until_cleared_still_goes_to_full_at_a_critical_temperature(machine,
                                                                                                   clock):
    """The operator stops the amdgpu's fan with no end; the GPU then reads 88 °C (its temp1_crit 91 °C less
    the 5 °C margin): safety drives the fan to full over the override."""
    root, settings, original = machine
    d = make(settings, clock, root)
    amdgpu = next(p.parent for p in (root / "devices").rglob("name") if p.read_text().strip() == "amdgpu")
    pwm_id = "hwmon:amdgpu-pci-0700/pwm1"
    seen = []

    def step():
        snap = d.hub.latest
        dec = snap.decisions.get(pwm_id)  # no rule of balanced drives it: undecided until overridden
        seen.append((snap.seq, dec and dec.layer, dec and dec.value, (amdgpu / "pwm1").read_text().strip()))
        if snap.seq == 1:
            d.control.set_override(pwm_id, 0.0, 0.0)
        if snap.seq == 3:
            (amdgpu / "temp1_input").write_text("88000\n")
        return False

    assert await d.run(max_ticks=6, until=step) == 0
    # tick 4 reads 88 °C once: a jump the sensor trust holds for one reading; tick 5 confirms it
    assert seen[1:] == [(2, Layer.OVERRIDE, 0.0, "0"), (3, Layer.OVERRIDE, 0.0, "0"), (4, Layer.OVERRIDE, 0.0, "0"),
                        (5, Layer.SAFETY, 100.0, "255"), (6, Layer.SAFETY, 100.0, "255")]
    assert d.hub.latest.decisions[pwm_id].rule == "safety/critical-temperature"
    assert knob_files(root) == original


async def test_a_journal_that_is_no_journal_is_moved_aside_and_a_fan_left_low_in_manual_goes_to_automatic(
        machine, clock):
    """attack6 G1: a torn journal after a crash made the daemon exit 1 (a restart loop, then failed) with every
    fan left in manual mode at the crash's 16 %; moving the file aside by hand made the next run journal that
    16 % as the originals. Now the file is moved aside, the fans left at a low manual duty go to the driver's
    automatic mode before the first tick, and the daemon runs."""
    root, settings, original = machine
    chip = root / NCT
    settings.state_dir.mkdir()
    (settings.state_dir / "journal.json").write_bytes(b'{"version": 1, "entries": [{"knob_id"')  # torn
    for i in (1, 2):
        (chip / f"pwm{i}_enable").write_text("1\n")
        (chip / f"pwm{i}").write_text("40\n")  # what the crash left: 16 %
    (chip / "pwm3_enable").write_text("1\n")
    (chip / "pwm3").write_text("200\n")  # manual at 78 %: kept as found
    first = []
    d = Daemon(settings, clock=clock, backends=[HwmonBackend(str(root))], sleep=clock.sleep,
               before_sample=lambda t: first.append(knob_files(root)) if not first else None)
    assert await d.run(max_ticks=2) == 0
    assert first[0][f"{NCT}/pwm1_enable"] == first[0][f"{NCT}/pwm2_enable"] == "5\n"  # before the first tick
    assert first[0][f"{NCT}/pwm3_enable"] == "1\n" and first[0][f"{NCT}/pwm3"] == "200\n"
    assert [p.name.startswith("journal.json.corrupt-") for p in settings.state_dir.glob("journal.json*")] == [True]
    after = knob_files(root)  # the stop put back what the first tick found: automatic, and manual 200
    assert after[f"{NCT}/pwm1_enable"] == after[f"{NCT}/pwm2_enable"] == "5\n"
    assert after[f"{NCT}/pwm3_enable"] == "1\n" and after[f"{NCT}/pwm3"] == "200\n"

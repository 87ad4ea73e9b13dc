"""Plain-text output of the CLI: explain paragraphs, energy report, policies, holds."""

import pytest
from fake_client import load

from aithermctl.errors import DaemonError, DaemonNotRunning, NotAuthorized, Rejected, from_dbus
from aithermctl.render import (
    energy_text,
    explain_paragraph,
    hold_ends,
    holds_lines,
    policies_text,
    status_text,
)
from aithermd.publish import wire


def test_explain_paragraph_for_a_held_policys_decision(snapshot_doc):
    knob = next(k for d in snapshot_doc["devices"] for k in d["knobs"] if k["id"] == "gpu0/power_limit")
    entry = load("explain.json")["gpu0/power_limit"]
    text = " ".join(explain_paragraph("gpu0/power_limit", entry, knob).split())
    assert text == ("gpu0/power_limit is 360 W, set by a held policy (quiet/busy-limit): gpu0 in load.busy: "
                    "80% of the default (360 W). Inputs: gpu.utilization_pct.max_90s 100; "
                    "gpu.utilization_pct.max_90s < 10: 0.0s of 1m 30s; state:load busy. "
                    "Range 10 W to 600 W, default 450 W.")


def test_explain_of_a_fan_ramping_down_names_the_ramp(tmp_path):
    """newuser8 #5: a fan ramping down read "curve board → 77 %" beside "curve_pct 28.8", as if the curve
    were wrong. What the daemon itself answers (the recorded board, whose fans ramp down at balanced's
    1 %/s from the duty recorded with the board) names the ramp, and explain shows it."""
    from tests.support import documents

    board = documents.board_without_gpus(tmp_path)
    ramping = sorted((k, e) for k, e in board["explain"].items() if "ramping" in e["reason"])
    assert ramping, "no fan of the recorded board ramps down: pick another producer run"
    knob_id, entry = ramping[0]
    knob = next(k for d in board["snapshot"]["devices"] for k in d["knobs"] if k["id"] == knob_id)
    text = " ".join(explain_paragraph(knob_id, entry, knob).split())
    assert (f", set by the active policy (balanced/board-fans): curve board → {entry['value']:.0f} % (ramping "
            f"down at 1 %/s, ramp_down_pct_s; the curve asks {entry['inputs']['curve_pct']:.1f} %).") in text
    assert entry["value"] > entry["inputs"]["curve_pct"]


@pytest.mark.parametrize("pad", range(0, 40))
def test_explain_never_wraps_a_number_away_from_its_unit(pad):
    """newuser8: "curve board → 29\\n  %", "-7.2\\n  %/J", "override to 80\\n  %"."""
    entry = {"value": 29.0, "requested": 29.0, "layer": "policy", "rule": "p/r",
             "reason": f"{'x' * pad} curve board → 29 % then -7.2 %/J and 450 W at 55 °C, override to 80 %",
             "inputs": {"used:board": "hwmon:k10temp-pci-00c3/temp1,gpu0/temperature", "curve_pct": 28.8}}
    lines = explain_paragraph("hwmon:nct6798-isa-0290/pwm2", entry, {"unit": "%"}).splitlines()
    assert len(lines) > 1
    for line in lines:
        assert not line.strip().startswith(("%", "W ", "°C")), lines
    assert "used:board hwmon:k10temp-pci-00c3/temp1, gpu0/temperature" in " ".join(" ".join(lines).split())


def test_explain_paragraph_says_how_far_the_engines_windows_are():
    from test_app import engine_inputs_3s_after_the_load_stopped

    entry = {"value": 600.0, "requested": 600.0, "layer": "policy", "rule": "t/busy", "reason": "gpu0 in load.busy",
             "inputs": engine_inputs_3s_after_the_load_stopped()}
    text = " ".join(explain_paragraph("gpu0/power_limit", entry, None).split())
    assert "Inputs: gpu.utilization_pct.max_10s 90; gpu.utilization_pct.max_10s < 10: 3.0s of 10s;" in text


def test_explain_paragraph_for_a_safety_decision_clamped_to_the_knob():
    entry = {"value": 100.0, "requested": 140.0, "layer": "safety", "rule": "safety/critical",
             "reason": "gpu0 temperature 89 °C above its slowdown threshold 85 °C: fans to full",
             "inputs": {"gpu0/temperature": 89.0}}
    knob = {"unit": "%", "min": 0.0, "max": 100.0, "default": None, "writable": True, "why_not": None}
    text = " ".join(explain_paragraph("gpu0/fan0", entry, knob).split())
    assert "set by a safety rule (safety/critical)" in text
    assert "It asked for 140.0%, clamped to the knob's limits." in text


def test_explain_paragraph_for_a_knob_nobody_set_and_a_read_only_knob():
    entry = {"value": 30.0, "requested": None, "layer": "default", "rule": "", "reason": "", "inputs": {}}
    knob = {"unit": "%", "min": 30.0, "max": 100.0, "writable": False, "why_not": "NVML_ERROR_NO_PERMISSION"}
    text = " ".join(explain_paragraph("gpu1/fan0", entry, knob).split())
    assert text == ("gpu1/fan0 is 30%, set by no rule (the value found at start is kept). Range 30% to 100%. "
                    "Read-only here: NVML_ERROR_NO_PERMISSION.")


def test_energy_text_of_a_window_closed_before_its_first_sample_says_nothing_was_measured():
    """newuser8: `energy -- true` printed a heading and no rows. The daemon's window of before its first
    sample: its joules empty."""
    doc = dict(load("energy.json"), duration_s=0.012, joules={}, total_j=0.0)
    doc.pop("attributed", None)
    assert energy_text(doc, "true") == (
        "energy while true ran, 0.0s (0.012 s):\n  nothing measured: it ended before the daemon's next energy "
        "sample (one per tick); time a longer command, or see aithermctl energy report\n")


def test_energy_text_gives_mean_power_per_device_and_gpu_total():
    """The daemon's window over the last minute of the simulated training (fixtures/energy.json)."""
    doc = load("energy.json")
    joules = doc["joules"]
    lines = energy_text(doc, "python train.py").splitlines()
    assert lines[0] == "energy while python train.py ran, 1m 00s (60.000 s):"
    assert lines[1].split() == ["gpu0", f"{joules['gpu0']:.1f}", "J", f"{joules['gpu0'] / 60:.1f}", "W", "mean"]
    assert [line.split()[0] for line in lines[1:-2]] == sorted(joules)  # GPUs, then the RAPL zones
    gpus = joules["gpu0"] + joules["gpu1"]
    assert lines[-2].split() == ["all", "GPUs", f"{gpus:.1f}", "J", f"{gpus / 60:.1f}", "W", "mean"]
    # the total counts each package once, without its core subzone: the window's own total_j
    assert lines[-1].split()[:2] == ["total", f"{doc['total_j']:.1f}"]
    assert doc["total_j"] == pytest.approx(sum(joules.values()) - joules["powercap:core"])
    assert 300 < joules["gpu0"] / 60 < 450  # an RTX 4090 training under quiet's 360 W limit


def test_policies_mark_the_active_one():
    lines = policies_text(load("policies.json")).splitlines()
    assert [line[:14] for line in lines] == ["* ai-training ", "  balanced    ", "  quiet       ", "  workstation "]
    assert lines[1].startswith("  balanced     Under sustained load, each GPU's efficient power limit")


def test_holds_lines_say_how_each_hold_ends():
    holds = [{"cookie": 3, "policy": "quiet", "reason": "call", "owner": ":1.9", "detached": False,
              "expires": 1090.0},
             {"cookie": 4, "policy": "ai-training", "reason": "", "owner": "detached", "detached": True,
              "expires": None}]
    assert holds_lines(holds, now=1000.0) == [
        "  cookie 3: quiet — call (until :1.9 leaves, 1m 30s left)",
        "  cookie 4: ai-training — no reason (detached)"]


def test_hold_ends_says_when_a_hold_without_timeout_ends():
    """A hold with no timeout never reads "released" (it is not): it lasts until released, or until its
    owner quits when it is not detached."""
    timed = {"cookie": 3, "detached": False, "expires": 1090.0}
    assert hold_ends(timed, now=1000.0) == "1m 30s"
    assert hold_ends({"cookie": 4, "detached": True, "expires": None}, now=1000.0) == "until released"
    assert hold_ends({"cookie": 5, "detached": False, "expires": None}, now=1000.0) == "until owner quits"


def test_status_text_of_a_machine_without_gpus():
    text = status_text(load("snapshot_nogpu.json"))
    assert "GPUs" not in text and "policy balanced" in text
    assert "failed" in text and text.rstrip().endswith("Degraded: hwmon:nct6798-isa-0290/fan2")


def test_dbus_errors_map_to_classes_and_exit_codes():
    assert isinstance(from_dbus("org.freedesktop.DBus.Error.ServiceUnknown", "", "GetSnapshot", "system"),
                      DaemonNotRunning)
    err = from_dbus(wire.ERROR_NOT_AUTHORIZED, "denied", "Reload", "system")
    assert isinstance(err, NotAuthorized) and err.exit_code == 4
    assert "allow io.github.aithermd.reload" in str(err)
    err = from_dbus("org.freedesktop.DBus.Error.AccessDenied", "bus policy", "HoldPolicy", "system")
    assert isinstance(err, NotAuthorized) and "hold a policy" in str(err)
    err = from_dbus(wire.ERROR_UNKNOWN_KNOB, "no knob 'x'\nsecond line", "SetOverride", "system")
    assert isinstance(err, Rejected) and err.exit_code == 2 and "\n" not in str(err)
    assert isinstance(from_dbus(wire.ERROR_BUSY, "", "Reload", "system"), DaemonError)
    full = from_dbus(wire.ERROR_STATE_NOT_SAVED, "cannot keep the change across a restart: ...", "HoldPolicy",
                     "system")
    assert isinstance(full, DaemonError) and "df and mount show the state directory's disk" in str(full)
    old = from_dbus("org.freedesktop.DBus.Error.UnknownMethod", "x", "Explain", "s")
    assert "update aithermd" in str(old)


def test_a_holds_time_left_is_measured_on_the_daemons_clock():
    """A simulated daemon's wall clock runs ahead of ours: the expiry is compared with the snapshot's t_wall."""
    from aithermctl.render import status_text

    doc = {"t_wall": 1000.0, "devices": [], "policy": {"active": "balanced", "states": {}, "holds": [
        {"cookie": 3, "policy": "quiet", "reason": "r", "owner": ":1.2", "detached": False, "expires": 1600.0}]}}
    assert "cookie 3: quiet — r (until :1.2 leaves, 10m 00s left)" in status_text(doc)


def test_a_range_open_at_one_end_reads_without_a_dash():
    """A knob with a maximum and no minimum (a RAPL PL1: max_power_uw only) read "Range — to 95 W"."""
    from aithermctl.render import explain_paragraph

    text = explain_paragraph("powercap:package-0/pl1", {"value": 65.0, "layer": "default"},
                             {"unit": "W", "min": None, "max": 95.0, "default": None})
    assert "Range up to 95 W." in text and "—" not in text and "None" not in text


def test_out_of_range_words_for_open_ranges():
    from aithermd.publish.dbus_control import range_text

    assert range_text(150.0, 600.0, "W") == "outside 150–600 W"
    assert range_text(None, 95.0, "W") == "above the maximum 95 W"  # was "outside [None, 95.0] W"
    assert range_text(30.0, None, "%") == "below the minimum 30 %"


def test_unknown_knob_hint_names_a_command_that_lists_knob_ids():
    err = from_dbus(wire.ERROR_UNKNOWN_KNOB, "no knob 'gpu9/power_limit'", "SetOverride", "system")
    assert str(err) == "no knob 'gpu9/power_limit' (knob ids: aithermctl explain)"


def test_a_gpu_held_high_while_idle_is_reported_with_what_it_wastes():
    import copy

    from aithermctl.document import overview
    from aithermctl.render import status_text
    from aithermctl.widgets.gpu_card import card_text

    from aithermd.policy.held import HeldIdle
    from aithermd.publish.document import plain
    from aithermd.runtime.tick import with_held_idle

    doc = copy.deepcopy(load("snapshot.json"))
    gpu = next(d for d in doc["devices"] if d["id"] == "gpu1")
    # what the daemon publishes for a GPU held high (the tick's attrs, made JSON as GetSnapshot does)
    held = HeldIdle("gpu1", since=875.0, power_w=68.2, floor_w=27.0, learned=True, pstate="P0", held_w=80.5)
    gpu["attrs"] = plain(with_held_idle({"gpu1": gpu.get("attrs", {})}, {"gpu1": held}, 1000.0)["gpu1"])
    wire.check(doc, wire.SnapshotDoc, strict=True)
    out = status_text(doc)
    holders = [f"pid {p['pid']} ({p['user']}: {p['command']})" for p in doc["processes"]["gpus"]["gpu1"]["processes"]]
    assert holders and "pid 4110 (bob: python -m ipykernel_launcher)" in holders
    assert ("held high while idle for 2m 05s (P0): 68 W against a floor of 27 W (learned), 41 W over; "
            "a clock lock took 12 W off; held by " + ", ".join(holders)) in out
    assert out.count("held high while idle") == 1
    gpu1 = next(g for g in overview(doc).gpus if g.id == "gpu1")
    assert "held high while idle: 41 W over its floor" in card_text(gpu1, 70).plain


def test_explain_paragraph_never_breaks_an_id_at_its_hyphens():
    """`aithermctl explain` printed `hwmon:k10temp-` and `pci-00c3/temp1` on two lines: an id copied from the
    terminal must be the id."""
    source = "hwmon:k10temp-pci-00c3/temp1"
    entry = {"value": 100.0, "requested": 100.0, "layer": "safety", "rule": "safety/failed-source",
             "reason": "the curve's source failed: fans to full " + "x" * 50,
             "inputs": {source: None, "hwmon:nct6798-isa-0290/temp2": 41.0}}
    text = explain_paragraph("hwmon:nct6798-isa-0290/pwm1", entry, None)
    assert any(source in line for line in text.splitlines())


def test_the_energy_report_text_adds_up_and_labels_the_rest():
    """The report the daemon's energy history gives (tests/accounting/test_history.py's two days)."""
    from aithermctl.processes import report_text
    from tests.accounting.test_history import DAY1, _history

    lines = report_text(_history().report(DAY1 - 3600, "job")).splitlines()
    assert lines[:8] == [
        "energy by job since 2026-12-01",
        "  job                     kWh       gpu0       gpu1  package-0",
        "  slurm:7              0.0007     0.0007     0.0000     0.0000",
        "  (none)               0.0004     0.0004     0.0000     0.0000",
        "  (idle)               0.0001     0.0000     0.0001     0.0000",
        "  (unattributed)       0.0001     0.0000     0.0001     0.0000",
        "  " + "-" * 60,
        "  total                0.0012     0.0011     0.0001     0.0000"]
    assert lines[8:] == ["  (none): charged to processes in no job", "  (idle): the idle floor no process held",
                         "  (unattributed): what no process could be charged with"]


def test_the_energy_report_by_day_lists_idle_under_the_total_not_as_days():
    from aithermctl.processes import report_text
    from tests.accounting.test_history import DAY1, _history

    lines = report_text(_history().report(DAY1 - 3600, "day")).splitlines()
    assert [line.split()[0] for line in lines[2:]] == [
        "2026-12-01", "2026-12-02", "-" * 60, "total", "of", "(idle)", "(unattributed)", "(idle):",
        "(unattributed):"]
    assert lines[6] == "  of which"


def test_energy_by_unit_keeps_its_kwh_column_aligned_past_28_characters():
    from aithermctl.processes import process_lines

    long = "ollama-inference-server-for-the-lab.service"  # 43 characters
    from aithermd.accounting.ledger import Group, Ledger

    ledger = Ledger()  # the producer of status's "groups"
    ledger.groups["unit"] = {long: Group({"gpu0": 7_200_000.0}, users={"lab"}),
                             "sshd.service": Group({"gpu0": 3_600_000.0})}
    proc = {"groups": ledger.group_document()}
    lines = process_lines(proc)
    assert lines[0] == "  energy by units (top 2):"
    rows = lines[1:]
    assert [r.index(" kWh") for r in rows] == [rows[0].index(" kWh")] * 2
    assert rows[0].split() == [long, "2.0000", "kWh", "gpu0=7200.0kJ"]
    assert rows[1].split() == ["sshd.service", "1.0000", "kWh", "gpu0=3600.0kJ"]

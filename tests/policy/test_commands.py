"""``aithermd check``, ``aithermd schema`` and ``aithermd replay``: output, JSON shape and exit codes."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from aithermd.cli import main
from aithermd.policy.replay import replay
from aithermd.policy.trace import parse_trace
from aithermd.sim.smi_dump import load_dump

ROOT = Path(__file__).resolve().parents[2]
FIX = ROOT / "tests" / "fixtures"
INVALID = FIX / "policies" / "invalid"
TRACE_4090 = FIX / "traces" / "rtx4090-vlm-workload-padded-10min-idle.csv"
TRACE_WIN = FIX / "traces" / "windows-training-padded-10min-idle.csv"
DUMP_4090 = FIX / "nvidia-smi-q" / "rtx4090-nvidia-smi-q-x-driver535.xml"
DUMP_A100X4 = FIX / "nvidia-smi-q" / "a100-sxm4-x4-nvidia-smi-q.txt"
NCT_MACHINE = FIX / "sysfs" / "asus-rog-strix-x570-f-nct6798-amdgpu-k10temp" / "sys"


def test_check_valid_files_exit_0(capsys):
    assert main(["check", *map(str, sorted((ROOT / "policies").glob("*.yaml")))]) == 0
    out = capsys.readouterr()
    assert out.out.count(": ok\n") == 4 and out.err == ""


def test_check_invalid_exit_1_with_file_line_col_on_stderr(capsys):
    bad = INVALID / "unknown-key-sustain.yaml"
    assert main(["check", str(ROOT / "policies" / "quiet.yaml"), str(bad)]) == 1
    out = capsys.readouterr()
    assert out.err == (f"{bad}:6:83: error: machines.load.states[1].enter.sustain: unknown key "
                       "(hint: did you mean 'sustain_s'?)\n")
    assert "quiet.yaml: ok" in out.out


@pytest.mark.parametrize("key, value, hint", [
    ("min_dwell_s", "1m", "seconds are a bare number here: 60 for a minute, not '1m'"),
    ("ramp_up_pct_s", "5%", "a rate in %/s is a bare number: 5, not '5%'")])
def test_check_says_how_to_write_a_number_given_with_a_unit(tmp_path, capsys, key, value, hint):
    """Durations on the command line take "1m"; in a policy file "1m" was "unable to parse string as a
    number" with no word on what to write instead (newuser8)."""
    p = tmp_path / "unit.yaml"
    if key == "min_dwell_s":
        p.write_text("machines:\n  load:\n    per: machine\n    states:\n      - name: idle\n"
                     f"      - name: busy\n        {key}: {value}\n"
                     "        enter: {metric: utilization_pct, stat: mean, window_s: 10, above: 50}\n"
                     "rules:\n  - {name: f, kind: fan, fans: {chip: 'nct*'}, duty_pct: 40}\n")
    else:
        p.write_text(f"rules:\n  - {{name: f, kind: fan, fans: {{chip: 'nct*'}}, duty_pct: 40, {key}: '{value}'}}\n")
    assert main(["check", str(p)]) == 1
    err = capsys.readouterr().err
    assert f".{key}: should be a valid number, unable to parse string as a number (hint: {hint})\n" in err


def test_check_warns_about_a_file_that_sets_nothing(tmp_path, capsys):
    """An empty file is refused, but one holding only a description passed as plain "ok" (newuser8)."""
    from aithermd.policy.loader import shipped_policy_dir

    p = tmp_path / "only-words.yaml"
    p.write_text("description: x\n")
    assert main(["check", str(p)]) == 0
    out, err = capsys.readouterr()
    assert out == f"{p}: ok\n"
    assert err == (f"{p}: warning: no rules: this policy sets no knob (each keeps what aithermd found at "
                   f"start); add rules (examples: {shipped_policy_dir()})\n")


def test_check_unreadable_file_exit_2(capsys, tmp_path):
    assert main(["check", str(INVALID / "empty.yaml"), str(tmp_path / "missing.yaml")]) == 2
    assert f"{tmp_path / 'missing.yaml'}: error: cannot read: no such file" in capsys.readouterr().err


def test_check_usage_error_exit_2(capsys):
    with pytest.raises(SystemExit) as info:
        main(["check"])
    assert info.value.code == 2


@pytest.mark.skipif(not NCT_MACHINE.is_dir(), reason="recorded machine not present")
def test_check_device_references_against_a_recorded_machine(tmp_path, capsys):
    p = tmp_path / "refs.yaml"
    p.write_text("rules:\n"
                 "  - {name: gpu, kind: gpu_power_limit, gpus: 3, limit: max}\n"
                 "  - {name: fan, kind: fan, fans: {chip: nct6798-isa-0290}, duty_pct: 50}\n"
                 "  - {name: fan2, kind: fan, fans: {chip: it8686-isa-0a40}, duty_pct: 50}\n")
    assert main(["check", str(p)]) == 0
    capsys.readouterr()
    assert main(["check", "--sysfs-root", str(NCT_MACHINE), str(p)]) == 1
    err = capsys.readouterr().err.splitlines()
    assert err == [f"{p}:2:46: error: rules[0].gpus: selects no GPU on this machine (GPUs: gpu0)",
                   f"{p}:4:35: error: rules[2].fans: selects no fan on this machine (fans: "
                   f"hwmon:nct6798-isa-0290/pwm1, hwmon:nct6798-isa-0290/pwm2, hwmon:nct6798-isa-0290/pwm3, "
                   "hwmon:nct6798-isa-0290/pwm4, hwmon:nct6798-isa-0290/pwm5, hwmon:nct6798-isa-0290/pwm6 and "
                   "1 more); name one of them, or write a pattern with * that may select none here"]
    assert main(["check", "--sysfs-root", str(tmp_path / "nope"), str(p)]) == 2


def test_schema_is_json_schema_of_the_policy_document(capsys):
    assert main(["schema"]) == 0
    schema = json.loads(capsys.readouterr().out)
    assert schema["$schema"].endswith("2020-12/schema")
    assert set(schema["properties"]) == {"description", "safety", "curves", "machines", "rules", "budget", "quiet",
                                         "timezone", "holidays", "schedules"}
    assert schema["additionalProperties"] is False
    assert "sustain_s" in schema["$defs"]["MetricCondition"]["properties"]


def limits(doc: dict) -> list[dict]:
    """The power-limit decisions of a replay document."""
    return [d for d in doc["decisions"] if d["knob"] == "power_limit"]


def test_replay_json_shape(capsys):
    code = main(["replay", "--trace", str(TRACE_4090), "--policy", "ai-training", "--gpu-profile", str(DUMP_4090),
                 "--json"])
    assert code == 0
    doc = json.loads(capsys.readouterr().out)
    assert set(doc) == {"decisions", "summary"}
    first = limits(doc)[0]  # (the shipped policy drives the GPU's fans too)
    assert set(first) == {"t", "device", "knob", "old", "new", "rule", "reason"}
    assert (first["device"], first["knob"], first["old"]) == ("gpu0", "power_limit", 450.0)
    assert first["reason"].startswith("gpu0 in load.")
    assert set(doc["summary"]) == {"duration_s", "gpus"}
    assert set(doc["summary"]["gpus"]["gpu0"]) == {"limit_changes", "time_in_state_s", "energy_j",
                                                   "mean_power_limit_w", "energy_above_limit_j", "stale_s",
                                                   "searched"}


def test_replay_text_timeline(capsys):
    assert main(["replay", "--trace", str(TRACE_4090), "--policy", str(ROOT / "policies" / "balanced.yaml")]) == 0
    out = capsys.readouterr().out
    assert "gpu0    power_limit  450 W → 315 W" in out and "balanced/idle-limit" in out
    assert "summary" in out
    # the trace has no temperature.gpu column: the fan curve's source is missing, and the row says so
    rows = out.splitlines()
    fan = next(i for i, row in enumerate(rows) if "safety/failed-source" in row)
    assert "gpu0    fan0         0 % → 100 %" in rows[fan]
    assert rows[fan + 1].strip() == "source gpu0/temperature is missing: fan to full"
    # nor has it clocks.sm: balanced's search cannot read its signal, and the summary says why none ran
    assert rows[-1] == ("  no efficient search: the trace has no clocks.sm column: the efficient search's signal "
                        "(utilization × SM clock) cannot be read, so it does not run")


def test_replay_text_shows_the_fan_steps_that_count_and_says_how_many_it_left_out(capsys):
    """About 190 rows of 0.1 % fan moves buried 13 limit changes: a fan row is printed when its duty
    moved 5 % from the last one printed (or its rule changed); the rest are counted, and --json has all."""
    args = ["replay", "--trace", str(TRACE_WIN), "--policy", "balanced", "--gpu-profile", str(DUMP_4090)]
    assert main([*args, "--json"]) == 0
    fans = [d for d in json.loads(capsys.readouterr().out)["decisions"] if d["knob"] == "fan0"]
    assert main(args) == 0
    out = capsys.readouterr().out
    rows = [r for r in out.splitlines() if " fan0 " in r]
    assert 1 <= len(rows) < len(fans) / 10
    assert (f"({len(fans) - len(rows)} fan change(s) of less than 5 % from the last shown, by the same rule, "
            "not shown: --json lists every one)") in out
    # the rows chain: each row's "old" is the duty the row before it showed (newuser7 #11: "0 % → 50 %" was
    # followed by "46 % → 44 %")
    pairs = [r.split()[3:7:3] for r in rows]  # ["0", "50"] from "3.0  gpu0  fan0  0 % → 50 %  rule"
    assert len(pairs) >= 2 and all(a[1] == b[0] for a, b in zip(pairs, pairs[1:], strict=False)), rows


def test_replay_marks_the_gpus_whose_limit_was_searched(capsys):
    assert main(["replay", "--trace", str(TRACE_WIN), "--policy", "balanced", "--gpu-profile", str(DUMP_4090),
                 "--json"]) == 0
    summary = json.loads(capsys.readouterr().out)["summary"]
    assert summary["gpus"]["gpu0"]["searched"] is True and "no_search" not in summary
    assert main(["replay", "--trace", str(TRACE_WIN), "--policy", "ai-training", "--gpu-profile",
                 str(DUMP_4090), "--json"]) == 0
    summary = json.loads(capsys.readouterr().out)["summary"]
    assert summary["gpus"]["gpu0"]["searched"] is False and "no_search" not in summary  # nothing to search


def test_replay_without_name_column_or_profile_exits_2(capsys):
    assert main(["replay", "--trace", str(TRACE_WIN), "--policy", "balanced"]) == 2
    assert "has no 'name' column" in capsys.readouterr().err


def test_replay_unknown_model_exits_2(tmp_path, capsys):
    t = tmp_path / "t.csv"
    t.write_text("timestamp, name, power.draw [W]\n2025/06/01 10:00:00.000, NVIDIA Imaginary 9999, 10 W\n")
    assert main(["replay", "--trace", str(t), "--policy", "balanced"]) == 2
    assert "no shipped GPU profile matches 'NVIDIA Imaginary 9999'" in capsys.readouterr().err


def test_replay_malformed_trace_exits_1_with_line(tmp_path, capsys):
    t = tmp_path / "t.csv"
    t.write_text("timestamp, power.draw [W]\n2025/06/01 10:00:00.000, 10 W\n2025/06/01 10:00:01.000, x W\n")
    assert main(["replay", "--trace", str(t), "--policy", "balanced", "--gpu-profile", str(DUMP_4090)]) == 1
    assert f"malformed trace: {t}:3: power.draw: 'x W' is not a number" in capsys.readouterr().err


@pytest.mark.parametrize("args, message", [
    (["--policy", "nonesuch"], "no policy named 'nonesuch'"),
    # the dump's own error, said once: not "not an nvidia-smi -q dump" for a file that is not there
    (["--policy", "balanced", "--gpu-profile", "/nonexistent.xml"],
     "aithermd replay: /nonexistent.xml: error: cannot read: No such file or directory\n"),
    (["--policy", "./nonexistent.yaml"], "./nonexistent.yaml: no such policy file"),
    (["--policy", str(FIX / "traces")], f"{FIX / 'traces'}: error: cannot read"),  # a directory
])
def test_replay_usage_problems_exit_2(args, message, capsys):
    assert main(["replay", "--trace", str(TRACE_4090), *args]) == 2
    assert message in capsys.readouterr().err


def test_replay_a_dump_without_a_gpu_says_so_once(tmp_path, capsys):
    dump = tmp_path / "notes.txt"
    dump.write_text("hello\n")
    assert main(["replay", "--trace", str(TRACE_4090), "--policy", "balanced", "--gpu-profile", str(dump)]) == 2
    assert capsys.readouterr().err == (f"aithermd replay: {dump}: error: no GPU found: expected the output of "
                                       "`nvidia-smi -q` or `nvidia-smi -q -x`\n")


def test_replay_invalid_policy_exits_1(capsys):
    assert main(["replay", "--trace", str(TRACE_4090), "--policy", str(INVALID / "misspelt-kind.yaml")]) == 1
    assert "unknown kind 'gpu_power_limt'" in capsys.readouterr().err


def test_replay_missing_trace_exits_2(capsys, tmp_path):
    assert main(["replay", "--trace", str(tmp_path / "no.csv"), "--policy", "balanced"]) == 2


def _trace(lines: list[str]):
    return parse_trace("timestamp, index, power.draw [W], utilization.gpu [%]\n" + "\n".join(lines) + "\n")


def test_energy_above_limit_stale_time_and_profiles_beyond_the_dump():
    rows = []
    for k in range(6):
        stamp = f"2025/06/01 10:00:{k:02d}.000"
        for g in range(2):
            power = 500.0 if k >= 1 else 100.0  # 500 W from the second sample on, identical rows: stale
            rows.append(f"{stamp}, {g}, {power} W, 90 %")
    trace = _trace(rows)
    a100 = load_dump(DUMP_A100X4)
    policy_text = "rules:\n  - {name: cap, kind: gpu_power_limit, limit: 300}\n"
    from aithermd.policy.loader import load_policy_text
    doc = replay(trace, [a100[0], a100[1]], load_policy_text(policy_text, name="cap"))
    s = doc["summary"]["gpus"]["gpu0"]
    # cap set at t=0; from t=1 to t=5 the trace drew 500 W against a 300 W limit: 5 s × 200 W
    assert s["energy_above_limit_j"] == pytest.approx(1000.0)
    assert s["energy_j"] == pytest.approx(2500.0)
    assert s["stale_s"] == pytest.approx(4.0)
    assert s["mean_power_limit_w"] == pytest.approx(300.0)
    assert [(d["t"], d["device"], d["old"], d["new"], d["rule"]) for d in doc["decisions"]] == \
        [(0.0, "gpu0", 500.0, 300.0, "cap/cap"), (0.0, "gpu1", 500.0, 300.0, "cap/cap")]


def test_readme_reference_is_the_generated_one_and_its_examples_are_valid(capsys):
    import re

    from aithermd.policy.loader import load_policy_text
    from aithermd.policy.schema import json_schema
    from aithermd.policy.schemadoc import BEGIN, END, markdown
    readme = (ROOT / "policies" / "README.md").read_text()
    assert readme.split(BEGIN, 1)[1].split(END, 1)[0] == "\n" + markdown(json_schema())
    assert main(["schema", "--markdown"]) == 0
    assert capsys.readouterr().out == markdown(json_schema())
    blocks = re.findall(r"```yaml\n(.*?)```", readme, re.S)
    full = [b for b in blocks if b.startswith(("description:", "rules:", "machines:", "curves:"))
            and "NAME" not in b]
    assert len(full) >= 4
    for block in full:
        load_policy_text(block, name="readme")


def test_check_against_the_simulated_workstation(capsys):
    valid = FIX / "policies" / "valid" / "fan-curves.yaml"
    assert main(["check", "--simulate", *map(str, sorted((ROOT / "policies").glob("*.yaml")))]) == 0
    capsys.readouterr()
    assert main(["check", "--simulate", "-q", str(valid)]) == 1
    # once, at its line, with what the machine has and what to do (newuser8 #4)
    assert capsys.readouterr().err == (
        f"{valid}:27:11: error: rules[0].fans: selects no fan on this machine (fans: hwmon:amdgpu-pci-0700/pwm1, "
        "hwmon:nct6798-isa-0290/pwm1, hwmon:nct6798-isa-0290/pwm2, hwmon:nct6798-isa-0290/pwm3, "
        "hwmon:nct6798-isa-0290/pwm4, hwmon:nct6798-isa-0290/pwm5 and 3 more); name one of them, or write a "
        "pattern with * that may select none here\n")


def test_check_only_warns_about_permissions(tmp_path, capsys):
    import os
    f = tmp_path / "open.yaml"
    f.write_text("rules: []\n")
    os.chmod(f, 0o666)
    assert main(["check", str(f)]) == 0
    err = capsys.readouterr().err
    assert f"{f}: warning: file {f} is writable by every user (the daemon running as root refuses it)" in err


def test_replay_two_gpus_without_index_on_a_one_gpu_dump(tmp_path, capsys):
    t = tmp_path / "two.csv"
    rows = ["timestamp, utilization.gpu [%], power.draw [W]"]
    for s in range(120):
        for g in range(2):
            util = 90 if (g == 0 and 10 <= s < 80) else 0
            rows.append(f"2025/06/01 10:{s // 60:02d}:{s % 60:02d}.{g * 4:03d}, {util} %, {300 if util else 30} W")
    t.write_text("\n".join(rows) + "\n")
    assert main(["replay", "--trace", str(t), "--policy", "ai-training", "--gpu-profile", str(DUMP_4090),
                 "--json"]) == 0
    doc = json.loads(capsys.readouterr().out)
    assert set(doc["summary"]["gpus"]) == {"gpu0", "gpu1"}
    gpu0 = [(d["old"], d["new"]) for d in limits(doc) if d["device"] == "gpu0"]
    gpu1 = [(d["old"], d["new"]) for d in limits(doc) if d["device"] == "gpu1"]
    assert gpu0 == [(450.0, 600.0)]  # loaded from 10 s: raised at 30 s; the idle minute never completes
    assert gpu1 == [(450.0, 360.0)]  # idle all along: relaxed once its 60 s idle window held
    assert doc["summary"]["gpus"]["gpu1"]["time_in_state_s"] == {"idle": pytest.approx(119.0, abs=0.1)}


def test_every_yaml_example_in_the_readme_passes_aithermd_check(tmp_path, capsys):
    """Each ```yaml block of policies/README.md goes through ``aithermd check``: whole policies as they are,
    the one-line conditions as the ``when`` of a rule; only the skeleton with NAME placeholders is skipped."""
    import re
    blocks = re.findall(r"```yaml\n(.*?)```", (ROOT / "policies" / "README.md").read_text(), re.S)
    files, skeletons = [], 0
    for i, block in enumerate(blocks):
        if "{NAME:" in block:
            skeletons += 1
            continue
        if block.lstrip().startswith("{"):  # condition snippets, one per line
            for j, line in enumerate(ln for ln in block.splitlines() if ln.strip()):
                files.append(tmp_path / f"block{i}-cond{j}.yaml")
                files[-1].write_text("rules:\n  - name: c\n    kind: gpu_power_limit\n    limit: default\n"
                                     f"    when: {line.strip()}\n")
            continue
        files.append(tmp_path / f"block{i}.yaml")
        files[-1].write_text(block)
    assert skeletons == 1 and len(files) >= 7
    assert main(["check", *map(str, files)]) == 0, capsys.readouterr().err
    assert capsys.readouterr().out.count(": ok\n") == len(files)


def test_an_editor_validating_with_the_schema_agrees_with_check(capsys):
    jsonschema = pytest.importorskip("jsonschema")  # a dev dependency (through kubernetes-validate)
    from ruamel.yaml import YAML
    assert main(["schema", "--compact"]) == 0
    validator = jsonschema.Draft202012Validator(json.loads(capsys.readouterr().out))
    good = sorted((ROOT / "policies").glob("*.yaml")) + sorted((FIX / "policies" / "valid").glob("*.yaml"))
    for path in good:
        assert list(validator.iter_errors(YAML(typ="safe").load(path.read_text()))) == [], path
    for name, where in (("unknown-key-sustain.yaml", "sustain"), ("misspelt-kind.yaml", "gpu_power_limt"),
                        ("unknown-metric.yaml", "gpu.utilisation_pct")):
        errors = list(validator.iter_errors(YAML(typ="safe").load((INVALID / name).read_text())))
        assert errors and any(where in str(e.message) or any(where in str(c.message) for c in e.context)
                              for e in errors), name


def test_trace_gpu_i_takes_the_dumps_gpu_i_or_gpu_0_beyond_it(tmp_path, capsys):
    dump = FIX / "nvidia-smi-q" / "rtx3090-x2-rtx3090ti-x2-nvidia-smi-q-d-power-clock.txt"
    defaults = [p.default_power_limit_w for p in load_dump(dump)]
    assert len(set(defaults)) > 1  # the dump's GPUs differ: the mapping shows
    t = tmp_path / "five.csv"
    rows = ["timestamp, index, utilization.gpu [%], power.draw [W]"]
    rows += [f"2025/06/01 10:{s // 60:02d}:{s % 60:02d}.000, {g}, 0 %, 20 W"
             for s in range(70) for g in range(5)]
    t.write_text("\n".join(rows) + "\n")
    assert main(["replay", "--trace", str(t), "--policy", "ai-training", "--gpu-profile", str(dump),
                 "--json"]) == 0
    doc = json.loads(capsys.readouterr().out)
    relaxed = {d["device"]: (d["old"], d["new"]) for d in limits(doc)}  # idle: 80 % of each default
    expected = [*defaults, defaults[0]]
    assert relaxed == {f"gpu{i}": (load_dump(dump)[i if i < 4 else 0].power_limit_w, 0.8 * w)
                       for i, w in enumerate(expected)}


def test_replay_at_100_ms_without_units_by_uuid_with_a_gap(tmp_path, capsys):
    t = tmp_path / "fast.csv"
    rows = ["uuid, power.draw, timestamp, utilization.gpu"]  # --format=csv,nounits, any column order
    for k in range(1000):  # 100 s at 10 Hz, nothing logged from 40 s to 50 s
        if 400 <= k < 500:
            continue
        stamp = f"2025/06/01 10:{k // 600:02d}:{k // 10 % 60:02d}.{k % 10}00"
        for uuid, util in (("GPU-b", 0), ("GPU-a", 90 if k < 300 else 0)):
            rows.append(f"{uuid}, {300 if util else 30}, {stamp}, {util}")
    t.write_text("\n".join(rows) + "\n")
    assert main(["replay", "--trace", str(t), "--policy", "ai-training", "--gpu-profile", str(DUMP_4090),
                 "--json"]) == 0
    doc = json.loads(capsys.readouterr().out)
    steps = [(d["t"], d["device"], d["old"], d["new"]) for d in limits(doc)]
    # gpu0 (GPU-b, first seen) idle: its 60 s window holds at 60 s, across the gap; gpu1 (GPU-a) loaded for
    # 30 s: raised once its 20 s mean held, relaxed once the last loaded sample (29.9 s) left the idle minute
    assert steps == [(20.0, "gpu1", 450.0, 600.0), (60.0, "gpu0", 450.0, 360.0), (89.9, "gpu1", 600.0, 360.0)]
    assert doc["summary"]["duration_s"] == 99.9


def test_check_warns_about_what_this_machine_will_not_do_as_written(tmp_path, capsys):
    """A fan rule whose wildcard selects no fan, and limits in W or % that the devices clamp, are warnings
    at their line (exit 0); a limit within the constraints, and one given as max, say nothing."""
    p = tmp_path / "mine.yaml"
    p.write_text("rules:\n"
                 "  - {name: big, kind: gpu_power_limit, limit: 1000}\n"
                 "  - {name: half, kind: gpu_power_limit, gpus: 1, limit: 150%}\n"
                 "  - {name: fits, kind: gpu_power_limit, gpus: 0, limit: 300}\n"
                 "  - {name: top, kind: gpu_power_limit, limit: max}\n"
                 "  - {name: ite, kind: fan, fans: {chip: 'it87*'}, duty_pct: 50}\n"
                 "  - {name: cpu, kind: cpu_power_limit, pl1_w: 5000, pl2_w: 100}\n")
    assert main(["check", "--simulate", str(p)]) == 0
    out = capsys.readouterr()
    assert out.out == f"{p}: ok\n"
    assert out.err.splitlines() == [
        f"{p}:2:47: warning: rules[0].limit: clamped to the devices' own constraints: "
        "gpu0/power_limit 1000 W → 600 W, gpu1/power_limit 1000 W → 300 W",
        f"{p}:3:57: warning: rules[1].limit: clamped to the devices' own constraints: "
        "gpu1/power_limit 450 W → 300 W",
        f"{p}:6:34: warning: rules[4].fans: selects no fan on this machine, so this rule does nothing here "
        "(fans: hwmon:amdgpu-pci-0700/pwm1, hwmon:nct6798-isa-0290/pwm1, hwmon:nct6798-isa-0290/pwm2, "
        "hwmon:nct6798-isa-0290/pwm3, hwmon:nct6798-isa-0290/pwm4, hwmon:nct6798-isa-0290/pwm5 and 3 more)",
        f"{p}:7:47: warning: rules[5].pl1_w: clamped to the devices' own constraints: "
        "powercap:package-0/pl1 5000 W → 95 W"]
    assert main(["check", str(p)]) == 0  # without a machine: nothing to compare with
    assert capsys.readouterr().err == ""


def test_check_warns_about_a_locked_clock_the_cards_clamp(tmp_path, capsys):
    """`max_mhz: 99999` passed `check --simulate` silently, though a clamped power limit was warned about."""
    p = tmp_path / "clocks.yaml"
    p.write_text("rules:\n"
                 "  - {name: fast, kind: gpu_clocks, max_mhz: 99999}\n"
                 "  - {name: fits, kind: gpu_clocks, gpus: 0, max_mhz: 1500}\n"
                 "  - {name: low, kind: gpu_clocks, max_mhz: min}\n")
    assert main(["check", "--simulate", str(p)]) == 0
    out = capsys.readouterr()
    assert out.out == f"{p}: ok\n"
    assert out.err.splitlines() == [
        f"{p}:2:45: warning: rules[0].max_mhz: clamped to the devices' own constraints: "
        "gpu0/sm_clock_lock 99999 MHz → 3120 MHz, gpu1/sm_clock_lock 99999 MHz → 3105 MHz"]


def test_replay_leaves_a_gap_in_the_log_out_of_the_totals_and_says_where(tmp_path, capsys):
    """The recorded Windows trace with its samples from line 102 on moved a year later (a logger stopped
    and restarted): the year is not integrated as power × time, and the warning names the lines."""
    lines = TRACE_WIN.read_text().splitlines()
    gapped = tmp_path / "gap.csv"
    later = [str(int(line[:4]) + 1) + line[4:] for line in lines[101:]]
    gapped.write_text("\n".join(lines[:101] + later) + "\n")
    args = ["replay", "--policy", "balanced", "--gpu-profile", str(DUMP_4090), "--json"]
    assert main([*args, "--trace", str(TRACE_WIN)]) == 0
    whole = json.loads(capsys.readouterr().out)["summary"]
    assert main([*args, "--trace", str(gapped)]) == 0
    out, err = capsys.readouterr()
    summary = json.loads(out)["summary"]
    (gap,) = summary["gaps"]
    assert (gap["after_line"], gap["line"]) == (101, 102) and gap["seconds"] > 365 * 86_400 - 10
    assert err == (f"aithermd replay: warning: {gapped}:102: 365 d since the sample of line 101: the log "
                   "stopped; that time is left out of the energy and state totals\n")
    # one interval of ~1 s is missing from the totals, nothing else: no year of idle power, no year idle
    assert summary["duration_s"] == pytest.approx(whole["duration_s"] - 1.0, abs=0.05)
    gpu, ref = summary["gpus"]["gpu0"], whole["gpus"]["gpu0"]
    assert gpu["energy_j"] == pytest.approx(ref["energy_j"], abs=25.0)
    assert sum(gpu["time_in_state_s"].values()) == pytest.approx(summary["duration_s"], abs=0.01)
    assert "gaps" not in whole


def test_a_gap_is_found_even_when_most_intervals_are_gaps():
    """Two samples a year apart: the period estimated from the trace is the year itself; a gap is still
    anything over an hour."""
    from aithermd.policy.trace import gaps

    trace = _trace(["2026/01/01 00:00:00, 0, 30 W, 0 %", "2027/01/01 00:00:00, 0, 30 W, 0 %"])
    assert [(g["after_line"], g["line"]) for g in gaps(trace)] == [(2, 3)]
    from aithermd.policy.loader import load_policy_text

    cap = load_policy_text("rules:\n  - {name: cap, kind: gpu_power_limit, limit: 300}\n", name="cap")
    assert replay(trace, [load_dump(DUMP_4090)[0]], cap)["summary"]["duration_s"] == 0.0



def test_check_warns_about_a_quiet_ceiling_below_the_rules_minimum_and_over_a_fixed_duty(tmp_path, capsys):
    """attack4 B3: a 0 % ceiling over a fixed-duty rule with min_duty_pct 40 passed `check` as "ok" and
    stopped every board fan. The engine now holds the rule's minimum and lets the fans go near danger;
    check says both."""
    p = tmp_path / "quiet0.yaml"
    p.write_text("quiet:\n"
                 "  fans:\n"
                 "    - {fans: {chip: ['nct*']}, max_duty_pct: 0}\n"
                 "rules:\n"
                 "  - {name: f, kind: fan, fans: {chip: ['nct*']}, duty_pct: 60, min_duty_pct: 40}\n")
    assert main(["check", "--simulate", str(p)]) == 0
    err = capsys.readouterr().err.splitlines()
    assert err[0].startswith(f"{p}:3:46: warning: quiet.fans[0].max_duty_pct: below the minimum duty of the "
                             "rule driving these fans, which hold that instead: 40 % (rule f) for "
                             "hwmon:nct6798-isa-0290/pwm1, hwmon:nct6798-isa-0290/pwm2")
    assert err[1] == (f"{p}:3:7: warning: quiet.fans[0]: rule f reads no temperature (a fixed duty): quiet "
                      "cannot lower power for these fans and holds them at the ceiling until a watched "
                      "temperature comes within danger_margin_c of its safety threshold; give the rule a curve")
    assert len(err) == 2


def test_check_warns_about_a_curve_whose_duty_falls_as_it_heats(tmp_path, capsys):
    """attack4 B7: two duties swapped by a typo (80 % at 60 °C, 35 % at 80 °C) passed check silently; the fans
    slowed down as the GPU heated. Named and inline curves, no machine needed; a rising curve says nothing."""
    p = tmp_path / "swapped.yaml"
    p.write_text("curves:\n"
                 "  board: {kind: points, source: 'gpu*/temperature', points: [[40, 30], [60, 80], [80, 35]]}\n"
                 "rules:\n"
                 "  - {name: f, kind: fan, fans: {chip: ['nct*']}, curve: board}\n"
                 "  - name: g\n"
                 "    kind: fan\n"
                 "    fans: {chip: ['it87*']}\n"
                 "    curve: {kind: points, source: 'k10temp*/Tctl', points: [[30, 50], [70, 40], [80, 100]]}\n")
    assert main(["check", str(p)]) == 0
    assert capsys.readouterr().err.splitlines() == [
        f"{p}:2:82: warning: curves.board.points[2]: the duty falls from 80 % at 60 °C to 35 % at 80 °C: the "
        "fans would slow down as it heats (two points swapped?)",
        f"{p}:8:71: warning: rules[1].curve.points[1]: the duty falls from 50 % at 30 °C to 40 % at 70 °C: the "
        "fans would slow down as it heats (two points swapped?)"]
    p.write_text(p.read_text().replace("[60, 80], [80, 35]", "[60, 35], [80, 80]").replace("[70, 40]", "[70, 60]"))
    assert main(["check", str(p)]) == 0 and capsys.readouterr().err == ""


def test_check_does_not_call_a_curve_rule_whose_source_matches_nothing_a_fixed_duty(tmp_path, capsys):
    """A curve whose source matches no sensor is the unsourced-fans warning (its fans run at 100 %), not a
    rule 'that reads no temperature (a fixed duty)' (first said so for both)."""
    p = tmp_path / "q.yaml"
    p.write_text("curves:\n"
                 "  cpu: {kind: points, source: 'nosuch*/temp1', points: [[40, 30], [80, 100]], optional: true}\n"
                 "quiet:\n"
                 "  fans: [{fans: {chip: ['nct*']}, max_duty_pct: 30}]\n"
                 "rules:\n"
                 "  - {name: board, kind: fan, fans: {chip: ['nct*']}, curve: cpu}\n")
    main(["check", "--simulate", str(p)])
    assert "reads no temperature" not in capsys.readouterr().err


def test_check_warns_about_a_pid_curve_with_a_negative_gain(tmp_path, capsys):
    """attack5 C9: a PID curve with kp/ki negative (duty falls as the temperature rises: the fans at 100 %
    while cool, toward 0 % over the setpoint) passed check silently. Named and inline, at the gain."""
    p = tmp_path / "pidneg.yaml"
    p.write_text("curves:\n"
                 "  board: {kind: pid, source: 'gpu*/temperature', setpoint_c: 60, kp: -4, ki: -0.2}\n"
                 "rules:\n"
                 "  - {name: f, kind: fan, fans: {chip: ['nct*']}, curve: board}\n"
                 "  - name: g\n"
                 "    kind: fan\n"
                 "    fans: {chip: ['it87*']}\n"
                 "    curve: {kind: pid, source: 'k10temp*/Tctl', setpoint_c: 70, kp: 3, ki: -0.1}\n")
    assert main(["check", str(p)]) == 0
    assert capsys.readouterr().err.splitlines() == [
        f"{p}:2:70: warning: curves.board.kp: kp -4 and ki -0.2 are negative: the duty would fall as the "
        "temperature rises (e = temperature − setpoint); drop the minus sign",
        f"{p}:8:76: warning: rules[1].curve.ki: ki -0.1 is negative: the duty would fall as the temperature "
        "rises (e = temperature − setpoint); drop the minus sign"]
    p.write_text(p.read_text().replace("-4", "4").replace("-0.2", "0.2").replace("-0.1", "0.1"))
    assert main(["check", str(p)]) == 0 and capsys.readouterr().err == ""

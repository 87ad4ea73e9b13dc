"""``aithermd restore`` and ``aithermd run`` argument handling, in process through the CLI."""

from __future__ import annotations

import json

import pytest

from aithermd.actuate.journal import JOURNAL_FILE, Journal
from aithermd.backends.hwmon import HwmonBackend
from aithermd.cli import main
from aithermd.errors import EXIT_CONFIG
from tests.support.machines import copy_machine
from tests.support.proc import knob_files


@pytest.fixture
def journaled(tmp_path):
    """A copied machine whose fans were taken (journal written, pwm changed), as after a crash."""
    root = copy_machine(tmp_path)
    original = knob_files(root)
    state = tmp_path / "state"
    backend = HwmonBackend(str(root))
    backend.discover()
    journal = Journal(state)
    for i in (1, 2, 5):
        kid = f"hwmon:nct6798-isa-0290/pwm{i}"
        journal.record(kid, "hwmon:nct6798-isa-0290", backend.locator(), backend.save_knob(kid), 0.0)
        backend.write_knob(kid, 100.0)
    backend.close()
    assert knob_files(root) != original
    return root, state, original


def test_restore_puts_everything_back_and_is_idempotent(journaled, capsys):
    root, state, original = journaled
    assert main(["restore", "--state-dir", str(state)]) == 0
    assert knob_files(root) == original and not (state / JOURNAL_FILE).exists()
    assert "restored 3 knob(s)" in capsys.readouterr().out
    assert main(["restore", "--state-dir", str(state)]) == 0
    assert "nothing to restore" in capsys.readouterr().out


def test_restore_with_another_sysfs_root(journaled, tmp_path):
    root, state, original = journaled
    moved = tmp_path / "moved"
    root.rename(moved)
    assert main(["restore", "--state-dir", str(state), "--sysfs-root", str(moved)]) == 0
    assert knob_files(moved) == original


def test_restore_on_a_root_that_is_no_sysfs_tree_keeps_the_journal_and_exits_2(journaled, tmp_path, capsys):
    """A new user's typo: 14 lines of 'UnknownKnob' said nothing about the root; now one line does."""
    root, state, _ = journaled
    assert main(["restore", "--state-dir", str(state), "--sysfs-root", str(tmp_path / "nowhere")]) == 2
    err = capsys.readouterr().err
    assert "nowhere: not a sysfs tree (no class/ directory)" in err and len(err.splitlines()) == 1
    assert len(Journal(state).entries()) == 3


def test_restore_failure_keeps_the_journal_and_exits_1(journaled, capsys):
    root, state, _ = journaled
    chip = root / "devices" / "platform" / "nct6775.656" / "hwmon" / "hwmon1"
    for f in ("pwm1", "pwm1_enable"):  # the chip is there but its pwm1 cannot be written
        (chip / f).unlink()
        (chip / f).mkdir()
    assert main(["restore", "--state-dir", str(state)]) == 1
    assert "error: hwmon:nct6798-isa-0290/pwm1" in capsys.readouterr().err
    assert list(Journal(state).entries()) == ["hwmon:nct6798-isa-0290/pwm1"]


def test_restore_with_a_corrupt_journal_moves_it_aside_hands_low_manual_fans_to_automatic_and_exits_2(
        journaled, capsys):
    """attack6 G1: restore exited 2 and left every fan in manual mode at the crash's duty; its advice (move the
    journal aside) made the next daemon journal that duty as the originals."""
    root, state, original = journaled
    chip = root / "devices" / "platform" / "nct6775.656" / "hwmon" / "hwmon1"
    (state / JOURNAL_FILE).write_text("nope")
    (chip / "pwm1").write_text("40\n")  # manual 16 %: what the crash left
    assert main(["restore", "--state-dir", str(state), "--sysfs-root", str(root)]) == 2
    err = capsys.readouterr().err
    assert "not a journal" in err and "moved to journal.json.corrupt-" in err
    assert f"made safe under {root} (" in err and "another root: run again with --sysfs-root DIR" in err
    assert "pwm1: found in manual mode at 16 %" in err and "automatic mode (enable 5)" in err
    assert (chip / "pwm1_enable").read_text() == "5\n"
    assert (chip / "pwm2_enable").read_text() == "1\n" and (chip / "pwm2").read_text() == "255\n"  # full
    assert not (state / JOURNAL_FILE).exists() and len(list(state.glob("journal.json.corrupt-*"))) == 1
    assert main(["restore", "--state-dir", str(state), "--sysfs-root", str(root)]) == 0  # nothing left


def test_run_with_an_invalid_config_names_file_and_line(tmp_path, capsys):
    """Configuration errors exit 78 (EX_CONFIG), which the unit's RestartPreventExitStatus= names: systemd
    does not restart into the same error (a restart loop of ~21 starts a minute before)."""
    cfg = tmp_path / "aithermd.yaml"
    cfg.write_text("tick_s: 1\ntick_s_: 2\n")
    assert main(["run", "--config", str(cfg)]) == EXIT_CONFIG == 78
    expected = f"{cfg}:2:1: error: tick_s_: unknown setting (hint: did you mean 'tick_s'?)"
    assert expected in capsys.readouterr().err


def test_a_bad_names_entry_is_reported_at_its_own_line_in_plain_words(tmp_path, capsys):
    """newuser7 6: the error pointed at line 2 (the 'names:' key) in pydantic's words."""
    cfg = tmp_path / "aithermd.yaml"
    cfg.write_text('tick_s: 1\nnames:\n  "hwmon:nct6798-isa-0290/fan1": CPU fan\n'
                   '  "hwmon:nct6798-isa-0290/fan3": [not, a, string]\n')
    assert main(["run", "--config", str(cfg)]) == EXIT_CONFIG
    assert (f"{cfg}:4:3: error: names.hwmon:nct6798-isa-0290/fan3: must be text (got ['not', 'a', 'string'])"
            in capsys.readouterr().err)


def test_run_with_an_unreadable_config_exits_78(tmp_path, capsys):
    said = "error: cannot read the config file"
    assert main(["run", "--config", str(tmp_path / "missing.yaml")]) == EXIT_CONFIG
    assert capsys.readouterr().err == f"{tmp_path / 'missing.yaml'}: {said}: no such file\n"
    assert main(["run", "--config", str(tmp_path)]) == EXIT_CONFIG
    assert capsys.readouterr().err == f"{tmp_path}: {said}: not a regular file\n"


def test_run_with_an_unknown_policy_flag_is_a_usage_error_and_touches_nothing(tmp_path, capsys):
    root = copy_machine(tmp_path)
    before = knob_files(root)
    args = ["run", "--sysfs-root", str(root), "--state-dir", str(tmp_path / "s"), "--bus", "none",
            "--metrics-listen", "none", "--no-nvml", "--policy", "no-such-policy", "--log-format", "json"]
    assert main(args) == 2
    assert capsys.readouterr().err.splitlines() == [
        "aithermd run: --policy no-such-policy: no policy named 'no-such-policy' (known: ai-training, balanced, "
        "quiet, workstation; or give a policy file's path)"]
    assert knob_files(root) == before and not (tmp_path / "s").exists()


def test_run_with_an_unknown_policy_in_its_configuration_exits_78(tmp_path, monkeypatch):
    root = copy_machine(tmp_path)
    monkeypatch.setenv("AITHERMD_POLICY", "no-such-policy")  # the configuration, not a flag
    args = ["run", "--sysfs-root", str(root), "--state-dir", str(tmp_path / "s"), "--bus", "none",
            "--metrics-listen", "none", "--no-nvml", "--log-format", "json"]
    assert main(args) == EXIT_CONFIG


def test_run_refuses_a_state_dir_it_cannot_write_and_touches_nothing(tmp_path, capsys):
    root = copy_machine(tmp_path)
    before = knob_files(root)
    blocker = tmp_path / "a-file"
    blocker.write_text("")
    code = main(["run", "--sysfs-root", str(root), "--state-dir", str(blocker / "state"), "--bus", "none",
                 "--metrics-listen", "none"])
    assert code == EXIT_CONFIG
    assert "cannot create the state directory" in capsys.readouterr().err
    assert knob_files(root) == before


def test_a_simulated_run_refuses_a_state_dir_it_cannot_create_in_one_line(tmp_path, capsys):
    """`aithermd run --simulate --state-dir /proc/nope` ended in a FileNotFoundError traceback."""
    blocker = tmp_path / "a-file"
    blocker.write_text("")
    code = main(["run", "--simulate", "--state-dir", str(blocker / "state"), "--bus", "none",
                 "--metrics-listen", "none"])
    assert code == EXIT_CONFIG
    err = capsys.readouterr().err
    assert err.startswith(f"{blocker / 'state'}: error: cannot create the state directory")
    assert "Traceback" not in err and list(tmp_path.iterdir()) == [blocker]


def test_a_bad_flag_value_is_a_usage_error_in_plain_words(capsys):
    """--tick 0 exited 1 with pydantic's "Input should be greater than or equal to 0.05"."""
    assert main(["run", "--tick", "0", "--simulate"]) == 2
    assert capsys.readouterr().err == "aithermd run: --tick must be at least 0.05 (got 0)\n"
    # a validator's own sentence, without pydantic's "Value error, "
    assert main(["run", "--metrics-listen", "1.2.3.4:99999", "--simulate"]) == 2
    assert capsys.readouterr().err == ("aithermd run: --metrics-listen '1.2.3.4:99999' is not HOST:PORT (a port "
                                       "0-65535, e.g. 127.0.0.1:8736) or 'none'\n")


def test_a_missing_trace_or_dump_is_one_line_naming_it_and_what_to_give(tmp_path, capsys):
    """`--trace missing.csv` printed Python's "[Errno 2] No such file or directory: 'missing.csv'"; a bad
    --gpu-profile said "error:" twice."""
    missing = tmp_path / "missing.csv"
    assert main(["run", "--simulate", "--trace", str(missing)]) == 2
    assert capsys.readouterr().err == (
        f"aithermd run --simulate: --trace {missing}: error: cannot read: no such file or directory (give the "
        "CSV file that `nvidia-smi --query-gpu=timestamp,utilization.gpu,power.draw --format=csv -l 1` wrote)\n")
    assert main(["run", "--simulate", "--gpu-profile", str(tmp_path / "gone.xml")]) == 2
    err = capsys.readouterr().err
    assert err == f"aithermd run --simulate: --gpu-profile {tmp_path / 'gone.xml'}: error: cannot read: No such file " \
                  "or directory\n"
    assert list(tmp_path.iterdir()) == []


def test_run_policy_takes_a_file_as_replay_does(tmp_path, capsys):
    """`aithermd run --policy FILE` runs that file, named by its stem; nothing beside it is loaded."""
    from pathlib import Path

    shipped = Path(__file__).parents[2] / "policies" / "quiet.yaml"
    mine = tmp_path / "lab.yaml"
    mine.write_text(shipped.read_text())
    (tmp_path / "broken.yaml").write_text("not: [a policy\n")  # beside it, never loaded
    code = main(["run", "--simulate", "--policy", str(mine), "--duration", "20", "--speedup", "0",
                 "--summary-json"])
    out = capsys.readouterr()
    assert code == 0, out.err
    assert json.loads(out.out)["policy"] == "lab"
    assert main(["run", "--simulate", "--policy", str(tmp_path / "missing.yaml")]) == 2
    assert "no such policy file" in capsys.readouterr().err


def test_a_rule_that_selects_nothing_here_is_warned_about_at_start(tmp_path, capsys):
    """A fan named exactly but absent from this machine (as `aithermd check --sysfs-root` reports it) was
    accepted silently by the daemon."""
    from pathlib import Path

    text = (Path(__file__).parents[2] / "policies" / "quiet.yaml").read_text()
    mine = tmp_path / "lab.yaml"
    mine.write_text(text.replace('fans: {chip: ["nct*", "it87*", "f71*", "w83*"]}',
                                 'fans: {chip: ["it8688e"]}'))
    assert main(["run", "--simulate", "--policy", str(mine), "--duration", "5", "--speedup", "0",
                 "--log-format", "json"]) == 0
    warned = [json.loads(line) for line in capsys.readouterr().err.splitlines()
              if '"policy_selects_nothing"' in line]
    assert len(warned) == 1 and warned[0]["level"] == "warning" and warned[0]["policy"] == "lab"
    assert "lab.yaml:67:" in warned[0]["error"] and "selects no fan on this machine" in warned[0]["error"]


def test_restore_refuses_a_state_dir_that_is_a_file_with_exit_2(tmp_path, capsys):
    """The unit's ExecStopPost= runs restore: a --state-dir naming a file (a typo) passed for "nothing to
    restore" with exit 0. A missing directory still is (the daemon may never have started)."""
    not_dir = tmp_path / "journal.json"
    not_dir.write_text("{}")
    assert main(["restore", "--state-dir", str(not_dir)]) == 2
    assert capsys.readouterr().err == (f"aithermd restore: error: {not_dir}: not a directory (give the "
                                       "--state-dir the daemon ran with)\n")
    assert main(["restore", "--state-dir", str(tmp_path / "missing")]) == 0


@pytest.mark.parametrize("argv", [
    ["run", "--state-dir", ""], ["run", "--policy-dir", " "], ["run", "--config", ""], ["run", "--policy", ""],
    ["run", "--simulate", "--trace", ""], ["run", "--simulate", "--gpu-profile", ""],
    ["restore", "--state-dir", ""], ["fans", "show", "--state-dir", ""], ["check", ""],
    ["replay", "--trace", "", "--policy", "balanced"], ["sensors", "--sysfs-root", ""],
])
def test_an_empty_path_is_a_usage_error_not_the_current_directory(argv, tmp_path, monkeypatch, capsys):
    """``--state-dir ""`` wrote the lock, energy and parsed-policy files into the working directory."""
    monkeypatch.chdir(tmp_path)
    with pytest.raises(SystemExit) as info:
        main(argv)
    assert info.value.code == 2
    flag = next(a for a in argv if a.startswith("--") and a != "--simulate") if argv[0] != "check" else "FILE"
    assert f"error: argument {flag}: is empty: give a path or a name" in capsys.readouterr().err
    assert list(tmp_path.iterdir()) == []


@pytest.mark.parametrize(("flags", "named"), [(["--sysfs-root", "/nonexistent"], "--sysfs-root"),
                                              (["--no-nvml"], "--no-nvml")])
def test_a_simulated_run_refuses_flags_it_would_ignore(flags, named, tmp_path, capsys):
    """--simulate makes its own board and GPUs: --sysfs-root and --no-nvml were silently ignored."""
    assert main(["run", "--simulate", "--duration", "5", "--state-dir", str(tmp_path / "s"), *flags]) == 2
    assert capsys.readouterr().err.startswith(f"aithermd run: {named} cannot go with --simulate")
    assert not (tmp_path / "s").exists()

"""What a new user sees when the files and directories they name are wrong: the errors name their paths as
they gave them, and a directory that is not there is said so (in process, through the CLI)."""

from __future__ import annotations

import json
from pathlib import Path

from aithermd.cli import main
from aithermd.errors import EXIT_CONFIG
from tests.support.machines import copy_machine
from tests.support.proc import knob_files

SHIPPED = Path(__file__).resolve().parents[2] / "policies"


def _typo_policy(tmp_path: Path) -> tuple[Path, int]:
    """balanced.yaml with `limit: 70%` misspelt `limt:` in its second rule, in tmp/bad/; and that line."""
    lines = (SHIPPED / "balanced.yaml").read_text().splitlines(keepends=True)
    line = next(i for i, text in enumerate(lines, 1) if text == "    limit: 70%\n")
    lines[line - 1] = "    limt: 70%\n"
    bad = tmp_path / "bad"
    bad.mkdir()
    (bad / "typo-key.yaml").write_text("".join(lines))
    work = tmp_path / "work"
    work.mkdir()
    return bad / "typo-key.yaml", line


def test_a_broken_policy_file_in_a_simulation_is_one_usage_error_at_the_users_path(
    tmp_path, monkeypatch, capsys
):
    """It named /tmp/aithermd-policy-XXXX/typo-key.yaml (a private link to the file) in the daemon's log,
    then 'the daemon stopped with 78'."""
    _, line = _typo_policy(tmp_path)
    monkeypatch.chdir(tmp_path / "work")
    monkeypatch.setenv("TMPDIR", str(tmp_path / "work"))
    assert (
        main(["run", "--simulate", "--policy", "../bad/typo-key.yaml", "--duration", "10", "--speedup", "0"])
        == 2
    )
    out = capsys.readouterr()
    assert out.err.splitlines() == [
        f"../bad/typo-key.yaml:{line}:5: error: rules[1].limt: unknown key (hint: did you mean 'limit'?)"
    ]
    assert out.out == "" and list((tmp_path / "work").iterdir()) == []


def test_a_broken_policy_file_for_the_daemon_is_logged_at_the_users_file_and_exits_78(
    tmp_path, monkeypatch, capsys
):
    path, line = _typo_policy(tmp_path)
    root = copy_machine(tmp_path)
    before = knob_files(root)
    monkeypatch.chdir(tmp_path / "work")
    args = [
        "run",
        "--sysfs-root",
        str(root),
        "--state-dir",
        str(tmp_path / "s"),
        "--bus",
        "none",
        "--metrics-listen",
        "none",
        "--no-nvml",
        "--policy",
        "../bad/typo-key.yaml",
        "--log-format",
        "json",
    ]
    assert main(args) == EXIT_CONFIG
    events = [json.loads(x) for x in capsys.readouterr().err.splitlines() if x.startswith("{")]
    skipped = [e for e in events if e["event"] == "policy_skipped"]
    assert [(e["path"], e["line"]) for e in skipped] == [(str(path), line)]
    assert skipped[0]["error"].startswith(f"{path}:{line}:5: error: rules[1].limt: unknown key")
    assert not any("aithermd-policy-" in json.dumps(e) for e in events)
    assert knob_files(root) == before


def test_a_policy_file_given_relative_still_runs_named_by_its_stem(tmp_path, monkeypatch, capsys):
    mine = tmp_path / "lab.yaml"
    mine.write_text((SHIPPED / "quiet.yaml").read_text())
    (tmp_path / "broken.yaml").write_text("not: [a policy\n")  # beside it, never loaded
    monkeypatch.chdir(tmp_path)
    assert (
        main(
            [
                "run",
                "--simulate",
                "--policy",
                "lab.yaml",
                "--duration",
                "20",
                "--speedup",
                "0",
                "--summary-json",
                "--log-level",
                "error",
            ]
        )
        == 0
    )
    assert json.loads(capsys.readouterr().out)["policy"] == "lab"


def test_a_policy_dir_flag_that_does_not_exist_is_a_usage_error(tmp_path, capsys):
    """It was skipped silently: the daemon ran balanced from the shipped policies."""
    assert main(["run", "--simulate", "--policy-dir", str(tmp_path / "nope"), "--duration", "5"]) == 2
    assert capsys.readouterr().err.splitlines() == [
        f"aithermd run: --policy-dir {tmp_path / 'nope'}: no such directory (give a directory of policy "
        ".yaml "
        "files)"
    ]
    (tmp_path / "file").write_text("")
    assert main(["run", "--simulate", "--policy-dir", str(tmp_path / "file"), "--duration", "5"]) == 2
    assert capsys.readouterr().err.startswith(
        f"aithermd run: --policy-dir {tmp_path / 'file'}: not a directory"
    )


def test_a_policy_dir_of_the_configuration_that_does_not_exist_exits_78(tmp_path, monkeypatch, capsys):
    monkeypatch.setenv("AITHERMD_POLICY_DIRS", json.dumps([str(tmp_path / "gone")]))
    assert main(["run", "--simulate", "--duration", "5"]) == EXIT_CONFIG
    assert capsys.readouterr().err.splitlines() == [
        f"{tmp_path / 'gone'}: error: policy directory (policy_dirs in the configuration) does not exist "
        "(create it, or take it out of policy_dirs)"
    ]


def test_restore_of_a_state_dir_that_does_not_exist_says_so_and_exits_0(tmp_path, capsys):
    """It said 'nothing to restore' as if the directory were the daemon's; 0 stays for ExecStopPost=."""
    assert main(["restore", "--state-dir", str(tmp_path / "nope")]) == 0
    out = capsys.readouterr()
    assert out.out == "" and out.err == (
        f"aithermd restore: warning: {tmp_path / 'nope'}: no such state "
        "directory, so nothing to restore (give the --state-dir the daemon "
        "ran with)\n"
    )
    assert not (tmp_path / "nope").exists()

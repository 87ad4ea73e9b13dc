"""Policies validated from the documents of earlier parses (loader ``parsed=``, runtime/parsed.py): the same
policies without parsing the YAML again, and never a different answer than a full parse would give."""

from __future__ import annotations

import json
import os
from pathlib import Path

import pytest

from aithermd.errors import PolicyErrors
from aithermd.policy import loader
from aithermd.policy.loader import load_policies, shipped_policy_dir, text_digest
from aithermd.runtime import parsed
from aithermd.runtime.daemon import Daemon
from aithermd.settings import DaemonSettings
from tests.support.fake_backend import FakeBackend

BROKEN = "description: broken\nrules:\n  - name: fans\n    fan: '*'\n    curve: nowhere\n"


def no_parsing(monkeypatch):
    calls = []

    def refuse(text, where):
        calls.append(where)
        raise AssertionError(f"{where} parsed again")

    monkeypatch.setattr(loader, "parse_yaml", refuse)
    return calls


def test_a_second_load_from_the_parsed_documents_gives_the_same_policies_without_parsing(monkeypatch):
    found: dict = {}
    first = load_policies([shipped_policy_dir()], parsed=found)
    assert set(found) == {text_digest(p.source) for p in first.values()}
    no_parsing(monkeypatch)
    second = load_policies([shipped_policy_dir()], parsed=found)
    assert set(second) == set(first)
    for name, p in first.items():
        assert second[name].document == p.document and second[name].source == p.source
        assert second[name].tree is None  # parsed only when a position is asked for


def test_a_position_after_a_load_from_parsed_documents_parses_then(tmp_path):
    found: dict = {}
    full = load_policies([shipped_policy_dir()], parsed=found)["balanced"]
    policy = load_policies([shipped_policy_dir()], parsed=found)["balanced"]
    assert policy.tree is None
    line, col, key = policy.position(("rules", 0, "name"))
    assert (line, col, key) == full.position(("rules", 0, "name"))
    assert key == "rules[0].name" and "name:" in policy.source.splitlines()[line - 1]


def test_an_entry_that_does_not_validate_takes_the_full_path_and_its_file_line_error(tmp_path):
    path = tmp_path / "bad.yaml"
    path.write_text(BROKEN)
    with pytest.raises(PolicyErrors) as plain_err:
        load_policies([tmp_path])
    # an entry under the broken text's digest that does not validate (a schema that changed since, a torn
    # file) is no excuse: the file is parsed and its error says where
    found = {text_digest(BROKEN): {"description": "broken", "rules": "none"}}
    with pytest.raises(PolicyErrors) as cached_err:
        load_policies([tmp_path], parsed=found)
    assert str(cached_err.value) == str(plain_err.value)
    assert str(cached_err.value).startswith(f"{path}:3:5: error: rules[0]: ")
    assert text_digest(BROKEN) not in found


def test_an_entry_is_only_found_by_the_text_read_now(tmp_path, monkeypatch):
    path = tmp_path / "mine.yaml"
    path.write_text((shipped_policy_dir() / "quiet.yaml").read_text())
    found: dict = {}
    load_policies([tmp_path], parsed=found)
    path.write_text(path.read_text() + "\n" + "bogus_key: 1\n")  # edited: a new digest, parsed in full
    with pytest.raises(PolicyErrors) as err:
        load_policies([tmp_path], parsed=found)
    assert f"{path}:" in str(err.value) and "bogus_key" in str(err.value)


def test_the_state_file_keeps_only_the_loaded_files_and_only_what_json_carries(tmp_path):
    state = tmp_path / "state"
    parsed.keep(state, {}, {"a": {"x": [1, 2.5, True, None]}, "b": {"when": object()}, "old": {}}, ["a", "b"])
    path = state / parsed.FILE_NAME
    assert json.loads(path.read_text()) == {"format": 1, "entries": {"a": {"x": [1, 2.5, True, None]}}}
    assert path.stat().st_mode & 0o777 == 0o600
    assert parsed.read(state, strict_permissions=False) == {"a": {"x": [1, 2.5, True, None]}}
    mtime = path.stat().st_mtime_ns
    parsed.keep(state, {"a": {"x": [1, 2.5, True, None]}}, {"a": {"x": [1, 2.5, True, None]}}, ["a"])
    assert path.stat().st_mtime_ns == mtime  # unchanged: not written again


@pytest.mark.parametrize("content", [b"not json", b'{"format": 99, "entries": {}}', b"[]"])
def test_a_state_file_that_is_not_ours_is_ignored(tmp_path, content):
    (tmp_path / parsed.FILE_NAME).write_bytes(content)
    assert parsed.read(tmp_path, strict_permissions=False) == {}


def test_root_ignores_a_state_file_others_can_write(tmp_path):
    parsed.keep(tmp_path, {}, {"a": {}}, ["a"])
    os.chmod(tmp_path / parsed.FILE_NAME, 0o666)
    assert parsed.read(tmp_path, strict_permissions=True) == {}


def _settings(tmp_path: Path, **kw) -> DaemonSettings:
    return DaemonSettings(sysfs_root=tmp_path / "sys", state_dir=tmp_path / "state", bus="none",
                          metrics_listen="none", nvml=False, policy_dirs=[shipped_policy_dir()], **kw)


async def test_the_daemon_starts_again_from_the_parsed_documents(tmp_path, clock, monkeypatch):
    settings = _settings(tmp_path)
    d = Daemon(settings, clock=clock, backends=[FakeBackend()], sleep=clock.sleep)
    assert await d.run(max_ticks=1) == 0
    assert (tmp_path / "state" / parsed.FILE_NAME).is_file()
    calls = no_parsing(monkeypatch)
    d = Daemon(settings, clock=clock, backends=[FakeBackend()], sleep=clock.sleep)
    assert await d.run(max_ticks=1) == 0
    assert calls == [] and set(d.world.policies) == {"balanced", "ai-training", "quiet", "workstation"}


async def test_a_dry_run_writes_no_parsed_documents(tmp_path, clock):
    d = Daemon(_settings(tmp_path, dry_run=True), clock=clock, backends=[FakeBackend()], sleep=clock.sleep)
    assert await d.run(max_ticks=1) == 0
    assert not (tmp_path / "state" / parsed.FILE_NAME).exists()


def mine(tmp_path: Path) -> Path:
    """Copies of the shipped policies, each text not the shipped one (so not in the package's documents)."""
    directory = tmp_path / "mine"
    directory.mkdir()
    for p in shipped_policy_dir().glob("*.yaml"):
        (directory / p.name).write_text(p.read_text() + "\n# mine\n")
    return directory


def test_a_file_not_yet_parsed_is_parsed_by_a_child_and_then_taken_from_its_document(tmp_path, monkeypatch):
    found: dict = {}
    policies = parsed.load_lean(load_policies, [mine(tmp_path)], strict_permissions=False, skip=(),
                                found=found)
    assert set(policies) == {"balanced", "ai-training", "quiet", "workstation"}
    # the child's documents (beside the shipped ones, which no file here has)
    assert set(found) - set(parsed.shipped()) == {text_digest(p.source) for p in policies.values()}
    assert policies["balanced"].document == load_policies([tmp_path / "mine"])["balanced"].document


def test_a_broken_file_parsed_by_the_child_gives_its_file_line_error(tmp_path):
    (tmp_path / "bad.yaml").write_text(BROKEN)
    (tmp_path / "good.yaml").write_text((shipped_policy_dir() / "quiet.yaml").read_text())
    with pytest.raises(PolicyErrors) as in_process:
        load_policies([tmp_path])
    found: dict = {}
    with pytest.raises(PolicyErrors) as from_child:
        parsed.load_lean(load_policies, [tmp_path], strict_permissions=False, skip=(), found=found)
    assert str(from_child.value) == str(in_process.value)
    assert str(from_child.value).startswith(f"{tmp_path / 'bad.yaml'}:3:5: error: rules[0]: ")
    good = parsed.load_lean(load_policies, [tmp_path], strict_permissions=False,
                            skip={str(tmp_path / "bad.yaml")}, found=found)
    assert set(good) == {"good"}


def test_a_child_that_cannot_run_leaves_the_load_to_the_caller(tmp_path, monkeypatch):
    mine = (shipped_policy_dir() / "quiet.yaml").read_text() + "\n# mine\n"  # not the shipped text
    (tmp_path / "quiet.yaml").write_text(mine)
    monkeypatch.setattr(parsed.sys, "executable", str(tmp_path / "no-python"))
    assert parsed.load_lean(load_policies, [tmp_path], strict_permissions=False, skip=(), found={}) is None


@pytest.mark.slow
def test_the_daemon_process_never_loads_pydantic_first_start_or_restart(tmp_path):
    """A long-running daemon keeps what it imports: pydantic (~12 MB) must not be among it."""
    from tests.support.machines import copy_machine
    from tests.support.proc import NotifySocket, run_args, start

    root = copy_machine(tmp_path)
    for attempt in ("first", "restart"):
        (tmp_path / attempt).mkdir()
        notify = NotifySocket(tmp_path / attempt)
        proc = start(run_args(root, tmp_path / "state"), env={"NOTIFY_SOCKET": str(notify.path)})
        try:
            notify.wait_for("READY=1")
            maps = Path(f"/proc/{proc.pid}/maps").read_text()
            proc.terminate()
            _, err = proc.communicate(timeout=60)
        finally:
            notify.close()
            if proc.poll() is None:
                proc.kill()
        assert proc.returncode == 0, err
        assert "pydantic_core" not in maps, attempt  # its compiled core, mapped by any import of pydantic
        assert (tmp_path / "state" / parsed.FILE_NAME).is_file(), attempt


def test_the_child_parses_only_the_files_whose_documents_are_missing(tmp_path):
    # the daemon hands the child the documents it has: a file found there is taken from it, not validated
    # again (a marked document shows which), and the child answers with the new documents only
    found: dict = {}
    directory = mine(tmp_path)
    parsed.load_lean(load_policies, [directory], strict_permissions=False, skip=(), found=found)
    quiet = text_digest((directory / "quiet.yaml").read_text())
    balanced = text_digest((directory / "balanced.yaml").read_text())
    known = {k: v for k, v in found.items() if k != balanced}
    known[quiet] = {**known[quiet], "f": {**known[quiet]["f"], "description": "taken from the known document"}}
    given = dict(known)
    policies = parsed.load_lean(load_policies, [directory], strict_permissions=False, skip=(), found=given)
    assert policies["quiet"].document.description == "taken from the known document"
    assert set(given) == set(known) | {balanced}  # balanced parsed by the child, and only it
    assert given[balanced] == found[balanced]
    assert policies["balanced"].document == load_policies([directory])["balanced"].document


def test_the_parser_child_imports_no_logging_stack(tmp_path):
    """The child's start is the first start's cost (CPU to READY, issue 22): structlog and asyncio were
    ~70 ms of it and it logs nothing the daemon keeps. It still answers, warnings included."""
    import subprocess
    import sys

    (tmp_path / "p").mkdir()
    (tmp_path / "p" / "quiet.yaml").write_text((shipped_policy_dir() / "quiet.yaml").read_text())
    request = json.dumps({"dirs": [str(tmp_path / "p")], "strict": False, "skip": [], "known": {}})
    report = ("rc = _child(); print(file=sys.stderr); "
              "print(sorted(m for m in ('structlog', 'asyncio', 'rich') if m in sys.modules), file=sys.stderr); "
              "sys.exit(rc)")
    code = parsed._child_command()[-1].replace("sys.exit(_child())", report)
    done = subprocess.run([sys.executable, "-P", "-c", code], input=request, capture_output=True, text=True,
                          timeout=60, check=True, cwd="/")
    digest = text_digest((tmp_path / "p" / "quiet.yaml").read_text())
    assert set(json.loads(done.stdout)["entries"]) == {digest}
    assert done.stderr.splitlines()[-1] == "[]"

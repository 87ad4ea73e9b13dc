"""The validated-policy cache at a first start and a restart (issue 22, runtime/parsed.py): the shipped
policies' documents shipped as package data, an entry found only by the digest of the text, the schema's
sources and the version, a state file that is not ours ignored and written anew, and a broken file's
FILE:LINE:COL error whichever way its neighbours were loaded."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

import aithermd
from aithermd.errors import PolicyErrors
from aithermd.policy import loader
from aithermd.policy.loader import load_policies, shipped_policy_dir, text_digest
from aithermd.runtime import parsed
from aithermd.runtime.daemon import Daemon
from aithermd.settings import DaemonSettings
from tests.support.fake_backend import FakeBackend

ROOT = Path(__file__).resolve().parents[2]
SHIPPED = {"balanced", "ai-training", "quiet", "workstation"}
BROKEN = "description: broken\nrules:\n  - name: fans\n    fan: '*'\n    curve: nowhere\n"


def no_child(monkeypatch) -> list[object]:
    runs: list[object] = []

    def refuse(*args, **kw):
        runs.append(args)
        raise AssertionError("the parser child was started")

    monkeypatch.setattr(subprocess, "run", refuse)
    return runs


def count_children(monkeypatch) -> list[object]:
    runs: list[object] = []
    real = subprocess.run

    def counted(*args, **kw):
        runs.append(args)
        return real(*args, **kw)

    monkeypatch.setattr(subprocess, "run", counted)
    return runs


def test_the_shipped_documents_are_those_of_the_shipped_policies_now():
    current = ROOT.joinpath("aithermd", *parsed.SHIPPED).read_text()
    assert current == parsed.shipped_text([ROOT / "policies"]), (
        "aithermd/data/shipped-policies.parsed.json is out of date (a shipped policy, the schema or the "
        "version changed): run .venv/bin/python scripts/shipped-parsed")
    texts = {p.stem: p.read_text() for p in (ROOT / "policies").glob("*.yaml")}
    assert set(texts) == SHIPPED
    assert set(parsed.shipped()) == {text_digest(t) for t in texts.values()}


def test_a_first_start_takes_the_shipped_policies_from_the_package_without_a_child(monkeypatch):
    full = load_policies([shipped_policy_dir()])
    no_child(monkeypatch)
    found: dict = {}
    policies = parsed.load_lean(load_policies, [shipped_policy_dir()], strict_permissions=False, skip=(),
                                found=found)
    assert set(policies) == SHIPPED
    for name, p in full.items():
        assert policies[name].document == p.document
    assert set(found) == {text_digest(p.source) for p in full.values()}  # kept in the state dir after


def test_an_admin_edit_of_a_shipped_policy_is_parsed_not_taken_from_the_package(tmp_path, monkeypatch):
    text = (shipped_policy_dir() / "quiet.yaml").read_text()
    edited = text.replace("description:", "description: edited", 1)
    assert edited != text
    (tmp_path / "quiet.yaml").write_text(edited)
    runs = count_children(monkeypatch)
    policies = parsed.load_lean(load_policies, [shipped_policy_dir(), tmp_path], strict_permissions=False,
                                skip=(), found={})
    assert len(runs) == 1  # the edited file (only it: the shipped ones came from the package)
    assert policies["quiet"].document.description.startswith("edited")
    assert policies["quiet"].document == load_policies([tmp_path])["quiet"].document


def test_a_broken_file_named_like_a_shipped_one_gives_its_file_line_error(tmp_path):
    (tmp_path / "quiet.yaml").write_text(BROKEN)
    with pytest.raises(PolicyErrors) as in_process:
        load_policies([shipped_policy_dir(), tmp_path])
    with pytest.raises(PolicyErrors) as lean:
        parsed.load_lean(load_policies, [shipped_policy_dir(), tmp_path], strict_permissions=False, skip=(),
                         found={})
    assert str(lean.value) == str(in_process.value)
    assert str(lean.value).startswith(f"{tmp_path / 'quiet.yaml'}:3:5: error: rules[0]: ")


@pytest.mark.parametrize("change", ["version", "schema"])
def test_an_entry_is_not_found_after_the_version_or_the_schema_changes(tmp_path, monkeypatch, change):
    path = tmp_path / "mine.yaml"
    path.write_text((shipped_policy_dir() / "quiet.yaml").read_text())
    text = path.read_text()
    before = text_digest(text)
    real = load_policies([tmp_path])["mine"].document
    # a document kept by the other version or schema, marked so that taking it would show
    found = {before: {**load_and_keep(tmp_path)[before]}}
    found[before]["f"] = {**found[before]["f"], "description": "kept by the other version"}
    taken = load_policies([tmp_path], parsed=dict(found))["mine"].document
    assert taken.description == "kept by the other version"
    monkeypatch.setattr(loader, "_schema_digest", [])
    if change == "version":
        monkeypatch.setattr(aithermd, "__version__", aithermd.__version__ + ".1")
    else:  # one more byte in a schema source: read_bytes of the schema files, one of them changed
        real_read = Path.read_bytes
        monkeypatch.setattr(Path, "read_bytes", lambda self: real_read(self) + (
            b"\n# changed\n" if self.name == "schema.py" else b""))
    assert text_digest(text) != before
    again = load_policies([tmp_path], parsed=dict(found))["mine"].document
    assert again == real and again.description != "kept by the other version"


def load_and_keep(directory: Path) -> dict:
    found: dict = {}
    load_policies([directory], parsed=found)
    return found


def _settings(tmp_path: Path) -> DaemonSettings:
    return DaemonSettings(sysfs_root=tmp_path / "sys", state_dir=tmp_path / "state", bus="none",
                          metrics_listen="none", nvml=False, policy_dirs=[tmp_path / "p"], policy="mine")


@pytest.mark.skipif(os.geteuid() != 0, reason="the owner and mode checks are a root daemon's")
@pytest.mark.parametrize("problem", ["foreign-owned", "world-writable", "corrupt"])
async def test_a_state_file_not_ours_is_ignored_and_written_anew(tmp_path, clock, problem):
    (tmp_path / "p").mkdir(mode=0o755)
    text = (shipped_policy_dir() / "quiet.yaml").read_text() + "\n# mine\n"
    (tmp_path / "p" / "mine.yaml").write_text(text)
    os.chmod(tmp_path / "p" / "mine.yaml", 0o644)
    os.chmod(tmp_path, 0o755)
    digest = text_digest(text)
    kept = load_and_keep(tmp_path / "p")[digest]
    marked = {**kept, "f": {**kept["f"], "description": "planted"}}
    state = tmp_path / "state"
    parsed.keep(state, {}, {digest: marked}, [digest])
    path = state / parsed.FILE_NAME
    if problem == "foreign-owned":
        os.chown(path, 65534, 65534)
    elif problem == "world-writable":
        os.chmod(path, 0o666)
    else:
        path.write_bytes(b'{"format": 1, "entries": {"' + digest.encode() + b'": {"$": ')
    d = Daemon(_settings(tmp_path), clock=clock, backends=[FakeBackend()], sleep=clock.sleep)
    assert await d.run(max_ticks=1) == 0
    assert d.world.policies["mine"].document.description != "planted"
    st = path.stat()
    assert (st.st_uid, st.st_mode & 0o777) == (0, 0o600)  # written anew, ours
    assert json.loads(path.read_text())["entries"] == {digest: kept}


def test_the_schema_builds_no_validator_at_import_and_the_parser_child_loads_no_plugins(tmp_path):
    """A first start parses the admin's files in a child, whose CPU is counted in the start (issue 22): the
    models' validators are built at the first validation, as one (defer_build), and pydantic's plugin
    loader (importlib.metadata over every installed distribution) is not run there."""
    code = ("import sys; from aithermd.policy.schema import PolicyDocument, Budget; "
            "print(PolicyDocument.__pydantic_complete__, Budget.__pydantic_complete__)")
    done = subprocess.run([sys.executable, "-P", "-c", code], capture_output=True, text=True, timeout=60,
                          check=True, cwd=ROOT)
    assert done.stdout.split() == ["False", "False"]
    (tmp_path / "p").mkdir()
    text = (shipped_policy_dir() / "balanced.yaml").read_text() + "\n# mine\n"
    (tmp_path / "p" / "balanced.yaml").write_text(text)
    request = json.dumps({"dirs": [str(tmp_path / "p")], "strict": False, "skip": [], "known": {}})
    report = ("rc = _child(); print(file=sys.stderr); "
              "print(sorted(m for m in ('importlib.metadata', 'email') if m in sys.modules), gc.isenabled(), "
              "file=sys.stderr); "
              "sys.exit(rc)")
    code = parsed._child_command()[-1].replace("sys.exit(_child())", report)
    done = subprocess.run([sys.executable, "-P", "-c", code], input=request, capture_output=True, text=True,
                          timeout=60, check=True, cwd="/")
    assert done.stderr.splitlines()[-1] == "[] False"  # nor does it collect cyclic garbage (short-lived)
    entries = json.loads(done.stdout)["entries"]
    assert list(entries) == [text_digest(text)]
    assert entries[text_digest(text)] == load_and_keep(tmp_path / "p")[text_digest(text)]


@pytest.mark.parametrize("problem", ["foreign-owned", "world-writable"])
def test_a_daemon_not_as_root_ignores_a_state_file_another_user_could_have_written(tmp_path, problem,
                                                                                    monkeypatch):
    parsed.keep(tmp_path, {}, {"a": {}}, ["a"])
    path = tmp_path / parsed.FILE_NAME
    assert parsed.read(tmp_path, strict_permissions=False) == {"a": {}}  # ours: taken
    if problem == "world-writable":
        os.chmod(path, 0o666)
    else:  # the daemon runs as a user other than the file's owner (nor is root the owner)
        if os.geteuid() == 0:
            os.chown(path, 4242, 4242)
        monkeypatch.setattr(os, "geteuid", lambda: 4343)
    assert parsed.read(tmp_path, strict_permissions=False) == {}

"""Loading policies: shipped and admin directories, overrides by name, permissions, the Policy object."""

from __future__ import annotations

import os
from pathlib import Path

import pytest

from aithermd.errors import PolicyErrors
from aithermd.policy import loader
from aithermd.policy.loader import (
    ADMIN_POLICY_DIR,
    load_policies,
    load_policy_file,
    load_policy_text,
    permission_problems,
    resolve_policy,
    shipped_policy_dir,
)

ROOT = Path(__file__).resolve().parents[2]
VALID = ROOT / "tests" / "fixtures" / "policies" / "valid"
IS_ROOT = os.geteuid() == 0


def test_shipped_policies_load_and_describe_themselves():
    assert shipped_policy_dir() == ROOT / "policies"
    policies = load_policies([shipped_policy_dir()])
    assert set(policies) == {"balanced", "ai-training", "quiet", "workstation"}
    for name, p in policies.items():
        assert p.name == name and p.path == ROOT / "policies" / f"{name}.yaml"
        assert p.description and p.source == p.path.read_text()
    assert ADMIN_POLICY_DIR == Path("/etc/aithermd/policies.d")


def test_shipped_sustain_and_relax_windows_are_as_promised():
    policies = load_policies([shipped_policy_dir()])
    for name in ("balanced", "ai-training"):
        machine = policies[name].document.machines["load"]
        enter = machine.states[1].enter
        windows = [c.window_s + c.sustain_s for c in enter.any]
        assert max(windows) <= 30, name
        exit_windows = [c.window_s for c in machine.states[1].exit.all]
        assert all(30 <= w <= 90 for w in exit_windows), name


@pytest.mark.parametrize("path", sorted(VALID.glob("*.yaml")), ids=lambda p: p.name)
def test_worked_examples_are_valid(path):
    assert load_policy_file(path).name == path.stem


def test_admin_file_replaces_the_shipped_one_of_the_same_name(tmp_path):
    shipped, admin = tmp_path / "shipped", tmp_path / "admin"
    shipped.mkdir(), admin.mkdir()
    (shipped / "balanced.yaml").write_text("description: shipped\nrules: []\n")
    (shipped / "quiet.yaml").write_text("description: quiet\nrules: []\n")
    (admin / "balanced.yaml").write_text("description: mine\nrules: []\n")
    (admin / "lab.yml").write_text("description: lab\nrules: []\n")
    (admin / "notes.txt").write_text("not a policy")
    policies = load_policies([shipped, admin, tmp_path / "missing"])
    assert {n: p.description for n, p in policies.items()} == {"balanced": "mine", "quiet": "quiet", "lab": "lab"}


def test_a_broken_shipped_file_replaced_by_the_admin_does_not_matter(tmp_path):
    shipped, admin = tmp_path / "shipped", tmp_path / "admin"
    shipped.mkdir(), admin.mkdir()
    (shipped / "balanced.yaml").write_text("rules: [\n")
    (admin / "balanced.yaml").write_text("rules: []\n")
    assert set(load_policies([shipped, admin])) == {"balanced"}


def test_resolve_by_name_or_file(tmp_path):
    assert resolve_policy("quiet").name == "quiet"
    f = tmp_path / "mine.yaml"
    f.write_text("rules: []\n")
    assert resolve_policy(str(f)).path == f
    with pytest.raises(FileNotFoundError, match="no policy named 'loud'"):
        resolve_policy("loud")


def test_policy_text_without_a_path_names_itself():
    with pytest.raises(PolicyErrors) as info:
        load_policy_text("rules: 3\n", name="x")
    assert info.value.errors[0].format() == "<x>:1:8: error: rules: should be a valid list"


def _own(path: Path, uid: int, mode: int) -> None:
    os.chown(path, uid, 0)
    os.chmod(path, mode)


@pytest.mark.skipif(not IS_ROOT, reason="needs root to give files to root and to other users")
@pytest.mark.parametrize("uid, mode, problem", [
    (0, 0o644, None),
    (0, 0o664, None),  # group root
    (0, 0o646, "file {f} is writable by every user"),
    (1000, 0o644, "file {f} is owned by uid 1000, not root"),
])
def test_file_permissions(tmp_path, uid, mode, problem):
    _own(tmp_path, 0, 0o755)
    f = tmp_path / "p.yaml"
    f.write_text("rules: []\n")
    _own(f, uid, mode)
    expected = [] if problem is None else [problem.format(f=f)]
    assert permission_problems(f) == expected
    if problem is None:
        assert load_policy_file(f, strict_permissions=True).warnings == ()
        return
    with pytest.raises(PolicyErrors) as info:
        load_policy_file(f, strict_permissions=True)
    err = info.value.errors[0]
    assert err.format() == (f"{f}: error: refusing a policy a non-root user can change: {expected[0]} "
                            f"(hint: chown root:root {f} {tmp_path} && chmod go-w {f} {tmp_path})")
    relaxed = load_policy_file(f)  # check and replay only warn
    assert len(relaxed.warnings) == 1 and expected[0] in relaxed.warnings[0]


@pytest.mark.skipif(not IS_ROOT, reason="needs root to chown")
def test_a_directory_writable_by_others_is_refused(tmp_path):
    d = tmp_path / "policies.d"
    d.mkdir()
    _own(tmp_path, 0, 0o755)
    f = d / "p.yaml"
    f.write_text("rules: []\n")
    _own(f, 0, 0o644)
    _own(d, 0, 0o777)
    with pytest.raises(PolicyErrors, match="directory .* is writable by every user"):
        load_policies([d], strict_permissions=True)
    os.chown(d, 0, 1000)
    os.chmod(d, 0o775)
    assert permission_problems(d) == [f"directory {d} is writable by group gid 1000"]
    os.chmod(d, 0o755)
    assert set(load_policies([d], strict_permissions=True)) == {"p"}


def test_unreadable_and_oversized_files(tmp_path):
    with pytest.raises(PolicyErrors, match="cannot read"):
        load_policy_file(tmp_path / "nope.yaml")
    big = tmp_path / "big.yaml"
    big.write_text("#" * (loader.MAX_BYTES + 10))
    with pytest.raises(PolicyErrors, match="larger than"):
        load_policy_file(big)
    binary = tmp_path / "bin.yaml"
    binary.write_bytes(b"rules: \xff\xfe\n")
    with pytest.raises(PolicyErrors, match="not UTF-8"):
        load_policy_file(binary)


def test_load_policies_leaves_out_the_files_it_is_told_to_skip(tmp_path):
    import shutil

    from aithermd.errors import PolicyErrors
    from aithermd.policy.loader import load_policies

    shipped = Path(__file__).parents[2] / "policies"
    shutil.copy(shipped / "quiet.yaml", tmp_path / "quiet.yaml")
    (tmp_path / "typo.yaml").write_text("rules: [unclosed\n")
    with pytest.raises(PolicyErrors):
        load_policies([tmp_path])
    assert list(load_policies([tmp_path], skip={str(tmp_path / "typo.yaml")})) == ["quiet"]

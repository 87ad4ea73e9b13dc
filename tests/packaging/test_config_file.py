"""packaging/aithermd.yaml (installed as /etc/aithermd/aithermd.yaml): loads as-is, and the defaults it
documents in comments are the daemon's real defaults."""

from __future__ import annotations

import re
from pathlib import Path

from _ship import PACKAGING

from aithermd.settings import FIELDS, DaemonSettings, load_settings, read_config

CONFIG = PACKAGING / "aithermd.yaml"


def test_shipped_file_sets_nothing() -> None:
    assert read_config(CONFIG) == ({}, {})
    assert load_settings(CONFIG) == load_settings(CONFIG).replace()


def test_documented_defaults_are_the_real_ones(tmp_path: Path) -> None:
    text = CONFIG.read_text()
    documented = re.findall(r"^#(\w+): .*$", text, re.M)
    assert documented, "no commented-out keys found"
    uncommented = tmp_path / "aithermd.yaml"
    uncommented.write_text(re.sub(r"^#(\w+: )", r"\1", text, flags=re.M))
    settings = load_settings(uncommented)
    defaults = DaemonSettings()
    for key in documented:
        assert getattr(settings, key) == getattr(defaults, key), key
    internal = {"config_file", "policy_pinned", "sysfs_root"}
    assert set(FIELDS) - internal - set(documented) == set(), "document these keys"

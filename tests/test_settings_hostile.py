"""Hostile config files (``--config``): each is a one-line FILE[:LINE] error, never a traceback, a hang or
a memory blow-up; ``aithermd restore`` still works with the default state directory."""

from __future__ import annotations

import argparse
import os
from pathlib import Path

import pytest

from aithermd.commands.restore import _settings
from aithermd.errors import PolicyErrors
from aithermd.settings import MAX_CONFIG_VALUES, load_settings

BOMB = "\n".join(['a: &a ["lol","lol","lol","lol","lol","lol","lol","lol","lol"]']
                 + [f"{k}: &{k} [" + ",".join([f"*{j}"] * 9) + "]"
                    for j, k in zip("abcdefgh", "bcdefghi", strict=True)]) + "\n"


def error_of(path) -> str:
    with pytest.raises(PolicyErrors) as info:
        load_settings(path)
    return info.value.errors[0].format()


def test_not_utf8(tmp_path):
    cfg = tmp_path / "c.yaml"
    cfg.write_bytes(b"tick_s: \xff\n")
    assert error_of(cfg) == f"{cfg}: error: not UTF-8 text (invalid start byte at byte 8)"


def test_alias_bomb(tmp_path):
    cfg = tmp_path / "c.yaml"
    cfg.write_text(BOMB)
    assert error_of(cfg) == (f"{cfg}:1:1: error: expands to more than {MAX_CONFIG_VALUES} values (anchors "
                             "and aliases repeating each other?): not a config file")


def test_fifo_and_device(tmp_path):
    fifo = tmp_path / "c.yaml"
    os.mkfifo(fifo)
    assert error_of(fifo) == f"{fifo}: error: cannot read: not a regular file"
    assert error_of("/dev/zero") == "/dev/zero: error: cannot read: not a regular file"


def test_control_character_at_its_line(tmp_path):
    cfg = tmp_path / "c.yaml"
    cfg.write_text("tick_s: 1\nbus: \x07\n")
    assert error_of(cfg) == (f"{cfg}:2:6: error: not valid YAML: a control character is not allowed "
                             "(hint: remove it)")


def test_restore_with_a_broken_config_falls_back_to_the_default_state_dir(tmp_path, capsys):
    cfg = tmp_path / "c.yaml"
    cfg.write_bytes(b"\x98\x00garbage")
    args = argparse.Namespace(state_dir=None, config=cfg, sysfs_root=None)
    assert _settings(args) == (Path("/var/lib/aithermd"), Path("/sys"))  # before: UnicodeDecodeError
    assert capsys.readouterr().err.startswith(f"aithermd restore: warning: {cfg}: error: not UTF-8 text")


@pytest.mark.parametrize(("flags", "expected"), [
    ({"tick_s": 0.0}, "--tick: error: tick_s: must be at least 0.05 (got 0)"),
    ({"tick_s": float("nan")}, "--tick: error: tick_s: must be a finite number (got nan)"),
    ({"tick_s": float("inf")}, "--tick: error: tick_s: must be a finite number (got inf)"),
])
def test_flag_errors_name_the_flag_as_typed(flags, expected):
    with pytest.raises(PolicyErrors) as info:
        load_settings(None, flags)
    assert [e.format() for e in info.value.errors] == [expected]


def test_run_with_a_sysfs_root_that_is_not_a_directory_exits_78(tmp_path, capsys):
    from aithermd.cli import main
    missing = tmp_path / "no-such-sys"  # before: the daemon ran controlling nothing, silently
    assert main(["run", "--sysfs-root", str(missing), "--state-dir", str(tmp_path / "s"), "--bus", "none",
                 "--metrics-listen", "none", "--no-nvml"]) == 78
    assert capsys.readouterr().err == (f"{missing}: error: sysfs root is not a directory (give the root of a "
                                       "sysfs tree, e.g. /sys)\n")

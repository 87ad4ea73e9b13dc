"""The CLI stays light: its verbs never import textual, and only wire from the daemon's package."""

import ast
import subprocess
import sys
from pathlib import Path

TUI = Path(__file__).resolve().parents[2] / "tui"


def test_cli_verbs_do_not_import_textual():
    code = ("import sys, aithermctl.cli, aithermctl.verbs, aithermctl.client, aithermctl.render, "
            "aithermctl.doctor, aithermctl.document, aithermctl.history; "
            "print(sorted(m for m in sys.modules if m.split('.')[0] in ('textual', 'rich')))")
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True).stdout
    assert out.strip() == "[]"


def test_aithermctl_imports_only_wire_from_the_daemon_package():
    imported = set()
    for path in TUI.rglob("*.py"):
        for node in ast.walk(ast.parse(path.read_text())):
            if isinstance(node, ast.ImportFrom) and node.module and node.module.startswith("aithermd"):
                if node.module == "aithermd.publish" and [a.name for a in node.names] == ["wire"]:
                    imported.add("aithermd.publish.wire")
                else:
                    imported.add(node.module)  # from aithermd.publish.wire import SnapshotDoc, ...
            elif isinstance(node, ast.Import):
                imported.update(a.name for a in node.names if a.name.startswith("aithermd"))
    assert imported == {"aithermd.publish.wire"}


def test_help_lists_verbs_and_exit_codes():
    out = subprocess.run([sys.executable, "-m", "aithermctl", "--help"], capture_output=True, text=True,
                         check=True).stdout
    for verb in ("status", "policy", "hold", "release", "run", "override", "explain", "energy", "doctor",
                 "demo", "top"):
        assert f"    {verb}" in out
    assert "3    aithermd is not running" in out and "4    not authorized" in out

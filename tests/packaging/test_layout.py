"""The project layout the build backend relies on."""

import tomllib
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]


def test_every_package_is_listed_in_pyproject():
    conf = tomllib.loads((ROOT / "pyproject.toml").read_text())["tool"]["setuptools"]
    listed = set(conf["packages"])
    found = set()
    for top, name in (("aithermd", "aithermd"), ("tui", "aithermctl")):
        for init in (ROOT / top).rglob("__init__.py"):
            rel = init.parent.relative_to(ROOT / top)
            found.add(".".join((name, *rel.parts)))
    assert found - listed == set(), "add these to [tool.setuptools] packages"


def test_daemon_never_imports_the_tui():
    offenders = [str(p) for p in (ROOT / "aithermd").rglob("*.py")
                 if any(line.lstrip().startswith(("import textual", "from textual", "import aithermctl",
                                                  "from aithermctl", "import tui", "from tui"))
                        for line in p.read_text().splitlines())]
    assert offenders == []


def test_a_wheel_installs_every_shipped_policy():
    conf = tomllib.loads((ROOT / "pyproject.toml").read_text())["tool"]["setuptools"]
    installed = {Path(p).name for p in conf["data-files"]["share/aithermd/policies"]}
    assert installed == {p.name for p in (ROOT / "policies").glob("*.yaml")}

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


def test_the_top_of_the_daemon_holds_at_most_12_modules():
    """The shared vocabulary only (docs/design.md, the tree); everything else lives in a package."""
    top = sorted(p.name for p in (ROOT / "aithermd").glob("*.py"))
    assert len(top) <= 12, top


def test_no_module_is_over_400_lines():
    long = {str(p.relative_to(ROOT)): n for top in ("aithermd", "tui") for p in (ROOT / top).rglob("*.py")
            if (n := len(p.read_text().splitlines())) > 400}
    assert long == {}, "split these by what they do"


def test_the_tests_mirror_the_packages():
    """Each folder of tests/ is a package of aithermd/ (its tests), tui/ (aithermctl's), packaging/ (the
    shipped artifacts), or support/ and fixtures/ (shared by all); a sub-folder inside one groups the tests
    that share a conftest (nvml/, fusefault/, dbus/, metrics/, fleet/)."""
    packages = {p.parent.name for p in (ROOT / "aithermd").glob("*/__init__.py")}
    folders = {p.name for p in (ROOT / "tests").iterdir()
               if p.is_dir() and p.name != "__pycache__" and any(p.rglob("*.py"))}
    assert folders - packages - {"tui", "packaging", "support", "fixtures"} == set()

"""Static checks of packaging/debian and packaging/rpm, fast enough for every test run (the build itself is
packaging/check deb|rpm): every file they install exists, both packages install the same files, the
maintainer scripts are sound, and the policies land where the loader looks."""

from __future__ import annotations

import glob
import re
import subprocess

import pytest
from _ship import PACKAGING, ROOT, need_tool

DEBIAN = PACKAGING / "debian"
SPEC = PACKAGING / "rpm" / "aithermd.spec"
STANDIN = PACKAGING / "rpm" / "macros.systemd-standin"


def debian_sources() -> set[str]:
    """Repository paths the Debian package installs (install, manpages, bash-completion, docs lists)."""
    sources: set[str] = set()
    for name in ("aithermd.install", "aithermd.manpages", "aithermd.bash-completion", "aithermd.docs"):
        for line in (DEBIAN / name).read_text().splitlines():
            if line.strip() and not line.startswith("#"):
                sources.add(line.split()[0])
    return sources


def test_every_debian_source_exists() -> None:
    missing = [s for s in debian_sources() if not glob.glob(str(ROOT / s))]
    assert missing == []


def test_rpm_installs_the_same_sources() -> None:
    spec = SPEC.read_text()
    install = spec.split("%install", 1)[1].split("%check", 1)[0]
    for source in debian_sources() - {"packaging/README.md"}:
        stem = source.rstrip("/")
        assert stem in install, f"the RPM spec does not install {source}"
    assert "packaging/README.md" in spec


def test_policies_are_conffiles_where_the_loader_looks() -> None:
    install = (DEBIAN / "aithermd.install").read_text()
    assert re.search(r"^policies/\*\.yaml etc/aithermd/policies/$", install, re.M)
    links = (DEBIAN / "aithermd.links").read_text().split("\n")
    assert "etc/aithermd/policies usr/share/aithermd/policies" in links
    assert "%config(noreplace) %{_sysconfdir}/aithermd/policies/*.yaml" in SPEC.read_text()
    # the loader's last candidate for the shipped policies is that link (packaging/check --install runs it)
    from aithermd.policy import loader
    source = (ROOT / "aithermd" / "policy" / "loader.py").read_text()
    assert 'Path("/usr/share/aithermd/policies")' in source
    assert loader.ADMIN_POLICY_DIR.as_posix() == "/etc/aithermd/policies.d"
    assert "etc/aithermd/policies.d" in (DEBIAN / "aithermd.dirs").read_text()


@pytest.mark.parametrize("script", ["aithermd.prerm", "aithermd.postinst", "aithermd.postrm"])
def test_maintainer_scripts(script: str) -> None:
    text = (DEBIAN / script).read_text()
    assert text.startswith("#!/bin/sh\n") and "#DEBHELPER#" in text and "set -e" in text
    done = subprocess.run(["sh", "-n", str(DEBIAN / script)], capture_output=True, text=True, timeout=30)
    assert (done.returncode, done.stderr) == (0, "")
    shellcheck = need_tool("shellcheck")
    done = subprocess.run([shellcheck, "-s", "sh", str(DEBIAN / script)], capture_output=True, text=True,
                          timeout=30)
    assert done.returncode == 0, done.stdout


def test_prerm_stops_then_restores_on_remove() -> None:
    text = (DEBIAN / "aithermd.prerm").read_text()
    remove = text.split("remove|deconfigure)", 1)[1].split(";;", 1)[0]
    assert remove.index("deb-systemd-invoke stop aithermd.service") < remove.index("aithermd restore")


def test_rules_bundle_a_virtualenv() -> None:
    rules = (DEBIAN / "rules").read_text()
    assert "--with python-virtualenv" in rules and "DH_VIRTUALENV_INSTALL_ROOT = /usr/lib" in rules
    assert "--extras tui" in rules
    control = (DEBIAN / "control").read_text()
    assert "dh-virtualenv" in control and "${aithermd:Python}" in control


def test_rpmspec_parses_with_systemd_macros() -> None:
    rpmspec = need_tool("rpmspec")
    load = [] if subprocess.run(["rpm", "--eval", "%{_unitdir}"], capture_output=True, text=True
                                ).stdout.strip() != "%{_unitdir}" else ["--load", str(STANDIN)]
    done = subprocess.run([rpmspec, *load, "--parse", str(SPEC)], capture_output=True, text=True, timeout=60)
    assert done.returncode == 0, done.stderr
    parsed = done.stdout
    assert "%systemd_" not in parsed and "%{_unitdir}" not in parsed
    post = parsed.split("\n%post\n", 1)[1].split("\n%preun\n", 1)[0]
    assert "aithermd.service" in post
    preun = parsed.split("\n%preun\n", 1)[1].split("\n%postun\n", 1)[0]
    assert "aithermd.service" in preun and "/usr/lib/aithermd/bin/aithermd restore" in preun
    assert "/usr/lib/systemd/system/aithermd.service" in parsed.split("%files", 1)[1]


def test_version_matches_the_code() -> None:
    from aithermd import __version__
    assert (DEBIAN / "changelog").read_text().startswith(f"aithermd ({__version__})")
    assert re.search(rf"^Version:\s+{re.escape(__version__)}$", SPEC.read_text(), re.M)

"""Man pages and shell completions agree with the real argument parsers of both commands.

The parsers are the source of truth: every subcommand and option they accept must be documented in the man
page section of that subcommand and offered by the bash, zsh and fish completions, and the completions must
offer nothing the parsers refuse. Bash and fish are asked for real completions; zsh is parsed per case arm.
"""

from __future__ import annotations

import argparse
import importlib
import importlib.util
import re
import subprocess
from pathlib import Path

import pytest
from _ship import PACKAGING, need_tool

from aithermd import cli as aithermd_cli

MAN = PACKAGING / "man"
COMPLETIONS = PACKAGING / "completions"
BASH_COMPLETION = Path("/usr/share/bash-completion/bash_completion")


def options(parser: argparse.ArgumentParser) -> set[str]:
    return {o for a in parser._actions for o in a.option_strings  # noqa: SLF001
            if o.startswith("--") and o not in ("--help", "--version")}


def subparsers(parser: argparse.ArgumentParser) -> dict[str, argparse.ArgumentParser]:
    for action in parser._actions:  # noqa: SLF001
        if isinstance(action, argparse._SubParsersAction):  # noqa: SLF001
            return dict(action.choices)
    return {}


def aithermd_options(command: str) -> set[str]:
    """The long options of ``aithermd COMMAND``. A command the CLI lists without a module is a failure, never
    a skip: ``aithermd COMMAND`` would crash for users while its documentation test passed."""
    name = f"aithermd.commands.{command}"
    assert importlib.util.find_spec(name) is not None, (
        f"aithermd.cli.COMMANDS lists {command!r} but {name} does not exist")
    module = importlib.import_module(name)
    parser = argparse.ArgumentParser()
    module.add_arguments(parser)
    found = options(parser)
    for nested in subparsers(parser).values():  # fans detect|calibrate|show
        found |= options(nested)
    return found


def aithermctl_verbs() -> dict[str, set[str]]:
    from aithermctl import cli  # installed with aithermd: a missing aithermctl fails here, never skips

    verbs: dict[str, set[str]] = {}
    for verb, parser in subparsers(cli.build_parser()).items():
        found = options(parser)
        for nested in subparsers(parser).values():  # policy list|show|set|reload
            found |= options(nested)
        verbs[verb] = found
    return verbs


def bash_complete(script: str, words: list[str]) -> set[str]:
    need_tool("bash")
    if not BASH_COMPLETION.exists():
        pytest.skip("bash-completion is not installed")
    program = f"""
source {BASH_COMPLETION}
source {COMPLETIONS / "bash" / script}
COMP_WORDS=("$@"); COMP_CWORD=$((${{#COMP_WORDS[@]}} - 1)); COMP_LINE="$*"; COMP_POINT=${{#COMP_LINE}}
_{script} "$1" "${{COMP_WORDS[COMP_CWORD]}}" "${{COMP_WORDS[COMP_CWORD-1]}}" 2>/dev/null
printf '%s\\n' "${{COMPREPLY[@]}}"
"""
    done = subprocess.run(["bash", "-c", program, "bash", *words], capture_output=True, text=True, timeout=30,
                          env={"PATH": "/usr/bin:/bin", "HOME": "/nonexistent"})
    assert done.returncode == 0, done.stderr
    return {w for w in done.stdout.split() if w}


def fish_complete(script: str, line: str) -> set[str]:
    fish = need_tool("fish")
    program = f"source {COMPLETIONS / 'fish' / script}; complete -C '{line}'"
    done = subprocess.run([fish, "--no-config", "-c", program],
                          capture_output=True, text=True, timeout=30)
    assert done.returncode == 0, done.stderr
    return {row.split("\t")[0] for row in done.stdout.splitlines() if row}


def zsh_arm(script: str, name: str) -> str:
    text = (COMPLETIONS / "zsh" / script).read_text()
    match = re.search(rf"^\s+(?:[\w|]+\|)?{name}(?:\|[\w|]+)?\)(.*?);;", text, re.M | re.S)
    assert match, f"no case arm for {name} in {script}"
    return match.group(1)


def man_section(page: str, name: str) -> str:
    text = (MAN / page).read_text()
    parts = re.split(r'^\.SS "?([^"\n]+)"?$', text, flags=re.M)
    sections = dict(zip(parts[1::2], parts[2::2], strict=True))
    assert name in sections, f"{page} has no .SS section for {name}"
    return sections[name]


def man_options(roff: str) -> set[str]:
    """Long options a roff fragment documents: those on the tag line after each .TP (written there as
    \\-\\-name\\-part); options only mentioned in prose do not count."""
    tags = re.findall(r"^\.TP\n(.*)$", roff, re.M)
    return {o.replace("\\-", "-") for tag in tags for o in re.findall(r"\\-\\-[a-z](?:[a-z]|\\-)*[a-z]", tag)}


def zsh_options(arm: str) -> set[str]:
    """Long options a zsh _arguments spec offers: '--name[...]', '*--name[...]', {-q,--name}'[...]'."""
    return set(re.findall(r"(--[a-z][a-z-]*)(?:\[|\}')", arm))


AITHERMD_COMMANDS = sorted(aithermd_cli.COMMANDS)


def test_bash_offers_every_aithermd_command() -> None:
    assert bash_complete("aithermd", ["aithermd", ""]) == {*AITHERMD_COMMANDS, "--help", "--version"}


@pytest.mark.parametrize("command", AITHERMD_COMMANDS)
def test_aithermd_options_everywhere(command: str) -> None:
    want = aithermd_options(command)
    assert bash_complete("aithermd", ["aithermd", command, "--"]) - {"--help"} == want
    assert man_options(man_section("aithermd.8", command)) == want
    assert zsh_options(zsh_arm("_aithermd", command)) == want
    assert fish_complete("aithermd.fish", f"aithermd {command} --") - {"--help"} == want


def test_every_aithermctl_verb_is_offered_and_documented() -> None:
    from aithermctl import cli

    verbs = set(aithermctl_verbs())
    top = options(cli.build_parser()) | {"--version"}  # the global options: --bus, --no-ask-password, ...
    assert {"--bus", "--no-ask-password"} <= top
    assert bash_complete("aithermctl", ["aithermctl", ""]) == {*verbs, *top, "--help"}
    man = (MAN / "aithermctl.1").read_text()
    man_options = man.split(".SH OPTIONS", 1)[1].split(".SH", 1)[0]
    assert {o for o in top if o.replace("-", "\\-") not in man_options} == set()
    assert top <= set(fish_complete("aithermctl.fish", "aithermctl --"))
    verbs_section = man.split(".SH VERBS", 1)[1].split(".SH", 1)[0]
    documented = set(re.findall(r"^\.B[IR]? \"?([a-z]+)", verbs_section, re.M))
    assert verbs <= documented
    assert {w for w in fish_complete("aithermctl.fish", "aithermctl ") if not w.startswith("-")} == verbs
    zsh = (COMPLETIONS / "zsh" / "_aithermctl").read_text()
    assert set(re.findall(r"^\s+'([a-z]+):", zsh, re.M)) == verbs


@pytest.mark.parametrize("verb", ["status", "policy", "hold", "release", "run", "override", "explain",
                                  "energy", "doctor", "demo", "top"])
def test_aithermctl_options_everywhere(verb: str) -> None:
    verbs = aithermctl_verbs()
    want = verbs[verb] - {"--sysfs-root"}  # doctor's is hidden (argparse.SUPPRESS)
    got = bash_complete("aithermctl", ["aithermctl", verb, "--"]) - {"--help", "--"}
    assert got == want
    assert zsh_options(zsh_arm("_aithermctl", verb)) == want
    assert fish_complete("aithermctl.fish", f"aithermctl {verb} --") - {"--help", "--bus"} == want
    man = (MAN / "aithermctl.1").read_text().split(".SH VERBS", 1)[1].split(".SH", 1)[0]
    for option in want:
        assert option.replace("-", "\\-") in man


def test_aithermctl_policy_and_global_bus() -> None:
    assert bash_complete("aithermctl", ["aithermctl", "policy", ""]) == {"list", "show", "set", "reload"}
    assert bash_complete("aithermctl", ["aithermctl", "--bus", ""]) == {"system", "session"}
    assert bash_complete("aithermd", ["aithermd", "run", "--bus", ""]) == {"system", "session", "none"}


@pytest.mark.parametrize("page", ["aithermd.8", "aithermctl.1"])
def test_man_page_renders_without_warnings(page: str) -> None:
    groff = need_tool("groff")
    done = subprocess.run([groff, "-man", "-ww", "-z", str(MAN / page)], capture_output=True, text=True,
                          timeout=30)
    assert (done.returncode, done.stderr) == (0, "")


def test_zsh_completions_parse() -> None:
    zsh = need_tool("zsh")
    for script in ("_aithermd", "_aithermctl"):
        done = subprocess.run([zsh, "-n", str(COMPLETIONS / "zsh" / script)], capture_output=True, text=True,
                              timeout=30)
        assert (done.returncode, done.stderr) == (0, "")


def test_metrics_port_matches_the_daemon_default() -> None:
    from aithermd.settings import DEFAULT_METRICS_LISTEN
    assert DEFAULT_METRICS_LISTEN in (MAN / "aithermd.8").read_text()
    for script in ("bash/aithermd", "zsh/_aithermd", "fish/aithermd.fish"):
        assert DEFAULT_METRICS_LISTEN.replace(":", "\\:" if "zsh" in script else ":") in (
            COMPLETIONS / script).read_text()

"""A curve source's pattern that matches no sensor on the machine (a misspelt channel, an absent GPU) was
accepted silently: `aithermd check --simulate` said ok and the daemon ran the curve on the other inputs. Now
`check` warns at the line, the daemon warns at start and on reload, and a required one that names a device
the machine has (or one device exactly) fails the source as the policies document it: fans to full."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from aithermd.backends.hwmon import HwmonBackend
from aithermd.cli import main
from aithermd.model import Layer, Reading, Status
from aithermd.policy import sources
from aithermd.policy.loader import load_policy_text
from aithermd.runtime.daemon import Daemon
from aithermd.settings import DaemonSettings
from tests.support.machines import copy_machine
from tests.support.proc import knob_files

SHIPPED = Path(__file__).resolve().parents[2] / "policies"
GPU_LINE = '        - "gpu*/temperature"       # every NVIDIA GPU'


def _balanced_with(tmp_path: Path, pattern: str) -> tuple[Path, int]:
    """The shipped balanced policy with its board curve's GPU pattern replaced; that line."""
    lines = (SHIPPED / "balanced.yaml").read_text().splitlines(keepends=True)
    line = next(i for i, text in enumerate(lines, 1) if text.startswith(GPU_LINE))
    lines[line - 1] = f'        - "{pattern}"\n'
    path = tmp_path / "mine.yaml"
    path.write_text("".join(lines))
    return path, line


@pytest.mark.parametrize("pattern", ["gpu*/temprature", "gpu9/temperature"])
def test_check_on_the_simulated_machine_warns_at_the_line(tmp_path, capsys, pattern):
    path, line = _balanced_with(tmp_path, pattern)
    assert main(["check", "--simulate", str(path)]) == 0
    out = capsys.readouterr()
    assert out.out == f"{path}: ok\n"
    assert out.err.splitlines() == [
        f"{path}:{line}:11: warning: curves.board.source.max[1]: '{pattern}' matches no temperature sensor "
        "on "
        "this machine: a required input, so the fans of this curve run at 100 % here (name a sensor "
        "`aithermd sensors` shows, or mark it optional: true)"
    ]


def test_the_shipped_policies_draw_no_such_warning_on_the_simulated_machine(capsys):
    """workstation.yaml listed Tctl, Tdie and 'Package id *' as plain entries: one always missed."""
    assert main(["check", "--simulate", "-q", *map(str, sorted(SHIPPED.glob("*.yaml")))]) == 0
    assert capsys.readouterr().err == ""


def test_the_simulated_daemon_sends_the_board_fans_to_full_and_says_why(tmp_path, capsys):
    path, line = _balanced_with(tmp_path, "gpu9/temperature")  # a 2-GPU machine
    assert (
        main(
            [
                "run",
                "--simulate",
                "--policy",
                str(path),
                "--duration",
                "5",
                "--speedup",
                "0",
                "--summary-json",
                "--log-format",
                "json",
            ]
        )
        == 0
    )
    out = capsys.readouterr()
    events = [json.loads(x) for x in out.err.splitlines() if x.startswith("{")]
    warned = [e for e in events if e["event"] == "source_matches_nothing"]
    assert len(warned) == 1 and warned[0]["level"] == "warning"
    assert warned[0]["error"].startswith(
        f"{path}:{line}:11: warning: curves.board.source.max[1]: "
        "'gpu9/temperature' matches no temperature sensor"
    )
    board = [
        a for a in json.loads(out.out)["actuations"] if a["knob"].startswith("hwmon:nct6798-isa-0290/pwm")
    ]
    assert {a["knob"][-4:] for a in board} == {f"pwm{i}" for i in range(1, 7)}
    assert all(a["new"] == 100.0 and a["rule"] == "safety/failed-source" for a in board)
    assert board[0]["reason"] == "source gpu9/temperature is missing: fan to full"


def _devices_without_gpus():
    from tests.policy.test_no_source_warning import devices

    return [d for d in devices() if not d.id.startswith("gpu") and "amdgpu" not in d.id]


def test_a_pattern_for_hardware_the_machine_lacks_requires_nothing():
    """gpu*/temperature on a machine without a GPU (the shipped policies on a CPU-only box): no input, no
    failure; a label ('Package id 0', Intel's) the machine lacks neither; gpu9/... names one device
    exactly: required."""
    devices = _devices_without_gpus()
    policy = load_policy_text(
        "curves:\n  c: {kind: points, source: {max: [Tctl, 'Package id 0', 'gpu*/temperature', "
        "'gpu9/temperature', 'hwmon:k10temp-*/tmep2']}, points: [[40, 30], [85, 100]]}\n",
        name="t",
    )
    agg = policy.document.curves["c"].source
    fn, inputs = sources.compile_source(agg, devices)
    assert [(i.channel, i.optional) for i in inputs] == [
        ("hwmon:k10temp-pci-00c3/temp1", False),
        ("gpu9/temperature", False),
        ("hwmon:k10temp-*/tmep2", False),
    ]
    assert sources.unmatched(agg, devices) == [
        (1, "Package id 0", False),
        (2, "gpu*/temperature", False),
        (3, "gpu9/temperature", True),
        (4, "hwmon:k10temp-*/tmep2", True),
    ]
    tctl = {"hwmon:k10temp-pci-00c3/temp1": Reading("hwmon:k10temp-pci-00c3/temp1", 50.0, Status.OK)}
    resolved = sources.resolve(fn, inputs, tctl)
    assert resolved.value is None and resolved.failed == ("gpu9/temperature", "missing")
    fine = (
        load_policy_text(
            "curves:\n  c: {kind: points, source: {max: [Tctl, 'Package id 0', 'gpu*/temperature']}, "
            "points: [[40, 30], [85, 100]]}\n",
            name="t",
        )
        .document.curves["c"]
        .source
    )
    fn, inputs = sources.compile_source(fine, devices)
    assert sources.resolve(fn, inputs, tctl).value == 50.0


async def test_the_daemon_warns_at_start_and_reload_and_runs_the_fans_full_for_a_misspelt_channel(
    tmp_path, clock
):
    root = copy_machine(tmp_path)
    original = knob_files(root)
    policies = tmp_path / "policies"
    policies.mkdir()
    (policies / "typo.yaml").write_text(
        "curves:\n  board:\n    kind: points\n    source:\n      max:\n        - hwmon:k10temp-*/temp1\n"
        "        - hwmon:k10temp-*/tmep2\n    points: [[40, 30], [85, 100]]\n"
        "rules:\n  - {name: board-fans, kind: fan, fans: {chip: 'nct*'}, curve: board}\n"
    )
    settings = DaemonSettings(
        sysfs_root=root,
        state_dir=tmp_path / "state",
        bus="none",
        metrics_listen="none",
        nvml=False,
        policy_dirs=[policies],
        policy="typo",
        policy_pinned=True,
    )
    d = Daemon(settings, clock=clock, backends=[HwmonBackend(str(root))], sleep=clock.sleep)
    seen = []

    def step():
        seen.append(d.hub.latest.decisions.get("hwmon:nct6798-isa-0290/pwm1"))
        if d.hub.latest.seq == 1:
            d.request_reload()
        return False

    from structlog.testing import capture_logs

    with capture_logs() as logs:
        assert await d.run(max_ticks=3, until=step) == 0
    warned = [e for e in logs if e["event"] == "source_matches_nothing"]
    assert len(warned) == 2  # at start and at the reload
    assert warned[0]["error"] == (
        f"{policies / 'typo.yaml'}:7:11: warning: curves.board.source.max[1]: "
        "'hwmon:k10temp-*/tmep2' matches no temperature sensor on this machine: a "
        "required input, so the fans of this curve run at 100 % here (name a sensor "
        "`aithermd sensors` shows, or mark it optional: true)"
    )
    assert all(dec.layer is Layer.SAFETY and dec.value == 100.0 for dec in seen), seen
    assert knob_files(root) == original

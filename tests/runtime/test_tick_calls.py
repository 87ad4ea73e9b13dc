"""The tick's work around the engine, counted in Python calls, not time (issue 22: a tick runs from cold
caches after each sleep, so its cost follows the bytecode it runs), on the reference chip of
``benchmarks/bench_process.py`` (6 temperatures, 3 fans, 3 pwm; benchmarks/reference-policy.yaml) with the
real hwmon backend, the real engine and the fast lane, on the fake clock:

- a still tick's actuation (arbitration, the apply path down to each pwm knob, every knob in place);
- its publish (the hub and each listener the daemon adds: the fast lane's re-arming, the energy meter);
- the inbox's sources at the tick's start and the checks after it;
- reading the world's fields.

Each budget is between what the code does now and what it did before the change that added the test.
"""

from __future__ import annotations

import random
import sys
from pathlib import Path

from aithermd import units
from aithermd.backends.hwmon import HwmonBackend
from aithermd.backends.pwm import pct_to_pwm_up
from aithermd.backends.registry import discover
from aithermd.publish.hub import StateHub
from aithermd.runtime.changes import Changes
from aithermd.runtime.daemon import Daemon
from aithermd.runtime.tick import Tick
from aithermd.runtime.world import PolicySet, World, with_policies
from aithermd.settings import DaemonSettings
from aithermd.watchers.fastlane import FastLaneOptions
from aithermd.watchers.options import WatcherOptions

BENCHMARKS = Path(__file__).resolve().parents[2] / "benchmarks"
REFERENCE = BENCHMARKS / "reference-policy.yaml"
sys.path.insert(0, str(BENCHMARKS))
from reference_tree import reference_chip  # noqa: E402, I001  (the bench's reference tree)
SETTLE = 6  # ticks before counting: the fans have reached their duty, the knobs read back in place
TICKS = 12


class Counts:
    """Python function calls per named part, per tick counted: the profile hook's ``call`` events between
    :meth:`start` and :meth:`stop`, less the part's own function and ``stop`` itself."""

    def __init__(self) -> None:
        self.parts: dict[str, list[int]] = {}
        self.on = False
        self._count = 0

    def _hook(self, _frame, event, _arg) -> None:
        if event == "call":
            self._count += 1

    def start(self, own: int = 1) -> None:
        """Count from now; ``own``: calls that belong to the counting (the part's own function)."""
        self._count = -own - 1  # and stop()
        sys.setprofile(self._hook)

    def stop(self, name: str) -> None:
        sys.setprofile(None)
        self.parts.setdefault(name, []).append(self._count)

    def median(self, name: str) -> int:
        got = sorted(self.parts[name])
        assert len(got) >= TICKS - 1, got
        return got[len(got) // 2]


async def run_counted(tmp_path, clock, monkeypatch) -> tuple[Counts, Daemon]:
    """The daemon on the reference chip for SETTLE + TICKS still ticks, the parts counted after SETTLE."""
    root = tmp_path / "sys"
    reference_chip(root)
    policies = tmp_path / "policies"
    policies.mkdir()
    (policies / "reference.yaml").write_text(REFERENCE.read_text())
    settings = DaemonSettings(sysfs_root=root, state_dir=tmp_path / "state", bus="none",
                              metrics_listen="none", nvml=False, policy_dirs=[policies], policy="reference")
    counts = Counts()
    actuate, publish, take, warn = Tick._actuate, StateHub.publish, Changes.take, Changes.warn_unmatched

    async def counted_actuate(self, *args):
        coro = actuate(self, *args)
        if counts.on:
            counts.start()
        try:
            coro.send(None)  # inline knobs only: it runs to its end without awaiting anything
        except StopIteration as done:
            return done.value
        finally:
            if counts.on:
                counts.stop("actuate")
        coro.close()
        raise AssertionError("the actuation of inline knobs awaited")

    def counted(name, fn):
        def wrapper(*args, **kwargs):
            if not counts.on:
                return fn(*args, **kwargs)
            counts.start()
            try:
                return fn(*args, **kwargs)
            finally:
                counts.stop(name)
        return wrapper

    monkeypatch.setattr(Tick, "_actuate", counted_actuate)
    monkeypatch.setattr(StateHub, "publish", counted("publish", publish))
    monkeypatch.setattr(Changes, "take", counted("take", take))
    monkeypatch.setattr(Changes, "warn_unmatched", counted("after", warn))
    d = Daemon(settings, clock=clock, backends=[HwmonBackend(str(root))], sleep=clock.sleep,
               watchers=WatcherOptions(fastlane=FastLaneOptions()))

    def until() -> bool:
        counts.on = d.hub.latest is not None and d.hub.latest.seq >= SETTLE
        return False

    assert await d.run(max_ticks=SETTLE + TICKS, until=until) == 0
    return counts, d


async def test_a_still_tick_actuates_publishes_and_checks_within_its_python_call_budget(tmp_path, clock,
                                                                                        monkeypatch):
    """Medians over 12 ticks, measured when this test was added (main bf4f2ed, before that change, in
    brackets): actuation of the three knobs in place 37 (72), publish 12 (17), the inbox's sources 5 (12),
    the check after the tick 0 (3)."""
    counts, d = await run_counted(tmp_path, clock, monkeypatch)
    assert d.fastlane is not None  # its re-arming is one of publish's listeners
    assert counts.median("actuate") <= 45
    assert counts.median("publish") <= 14
    assert counts.median("take") <= 8
    assert counts.median("after") <= 1


def test_reading_the_worlds_fields_makes_no_python_call(tmp_path, clock):
    """A tick reads the world's knobs, owners, devices and backends some 35 times: plain attributes."""
    root = tmp_path / "sys"
    reference_chip(root)

    world = World(discover([HwmonBackend(str(root))]), PolicySet({"p": object()}))
    counts = Counts()
    counts.start(own=0)
    got = [world.backends, world.inline, world.threaded, world.devices, world.knobs, world.owner,
           world.device_owner, world.policies, world.policy_dirs, world.needs_processes]
    counts.stop("read")
    assert counts.parts["read"] == [0]
    inv = world.inventory
    assert got == [inv.backends, inv.inline, inv.threaded, inv.devices, inv.knobs, inv.owner,
                   inv.device_owner, world.policy_set.policies, (), False]
    assert len(world.knobs) == 3 and world.inline == world.backends
    other = with_policies(world, PolicySet({"q": object()}, needs_processes=True))
    assert set(other.policies) == {"q"} and other.needs_processes and other.knobs is world.knobs


def test_a_pwm_knobs_duty_held_is_what_its_helpers_give(tmp_path):
    """``PwmKnob.settles_at`` (written out for the tick) gives ``pwm_to_pct(levels.holds(pct_to_pwm_up(d)))``
    for duties across and beyond the range, on a knob that learnt no level and on one whose driver keeps
    three (dell_smm: 0, 128, 255)."""
    root = tmp_path / "sys"
    reference_chip(root)
    backend = HwmonBackend(str(root))
    backend.discover()
    knob = backend.pwm_knob("hwmon:nct6798-virtual-0/pwm1")
    rng = random.Random(7)
    duties = [-5.0, 0.0, 0.1, 8.0, 33.3, 50.0, 99.9, 100.0, 120.0,
              *(rng.uniform(-1.0, 101.0) for _ in range(300))]

    def helpers(d: float) -> float:
        return units.pwm_to_pct(knob.levels.holds(pct_to_pwm_up(d)))

    assert [knob.settles_at(d) for d in duties] == [helpers(d) for d in duties]
    for written in range(0, 256, 3):
        knob.levels.learn(written, 0 if written < 64 else 128 if written < 191 else 255)
    assert knob.levels.quantised and not knob.levels.blind
    assert [knob.settles_at(d) for d in duties] == [helpers(d) for d in duties]
    assert knob.settles_at(20.0) == units.pwm_to_pct(128)

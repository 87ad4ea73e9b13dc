"""An inline write that blocks (a driver's ``store()`` stuck on its lock, attack10 W1) is given up on after
the writer's deadline: its device is held (neither written nor read back, an ``uncontrollable`` alarm, a
``write_hung`` fault), every other device's decision — a safety one included — is still written in the same
apply, and the final restore neither waits for the hung write nor writes its chip: it puts every other knob
back and leaves the hung chip's journaled for ``aithermd restore``. Once the write returns, the chip is
written again."""

from __future__ import annotations

import asyncio
import threading

from aithermd.actuate.applier import Applier
from aithermd.actuate.execute import Executor
from aithermd.actuate.journal import Journal
from aithermd.model import Decision, KnobValue, Layer
from tests.support.executor import InstantWorker, KnobWorld, pwm_fan

A, B = "hwmon:a/pwm1", "hwmon:b/pwm1"


class Fans:
    """An inline backend of fan duties (%); with ``block`` armed, its writes wait for ``release``."""

    def __init__(self, name: str, values: dict[str, float]) -> None:
        self.name, self.values, self.writes = name, values, []
        self.block, self.release, self.entered = False, threading.Event(), threading.Event()

    def locator(self) -> dict:
        return {"kind": "test", "name": self.name}

    def save_knob(self, knob_id: str) -> dict:
        return {"duty": self.values[knob_id]}

    def write_knob(self, knob_id: str, value: float) -> None:
        if self.block:
            self.entered.set()
            self.release.wait(30)
        self.writes.append((knob_id, value))
        self.values[knob_id] = value

    def read_knob(self, knob_id: str) -> KnobValue:
        return KnobValue(knob_id, self.values[knob_id], "manual")

    def restore_knob(self, knob_id: str, saved: dict) -> None:
        self.write_knob(knob_id, saved["duty"])





def test_a_hung_write_holds_its_chip_the_others_are_written_and_the_stop_does_not_wait_for_it(tmp_path):
    a, b = Fans("a", {A: 40.0}), Fans("b", {B: 40.0})
    world = KnobWorld({A: pwm_fan(A), B: pwm_fan(B)}, {A: a, B: b}, (a, b))
    journal = Journal(tmp_path / "state")
    executor = Executor(Applier(journal), InstantWorker())
    executor.inline.deadline_s = 0.05

    async def go() -> None:
        def apply(duty: float, layer: Layer = Layer.POLICY):
            wanted = [(k, Decision(k, duty, layer, "p/fans")) for k in (A, B)]
            current = {A: a.read_knob(A), B: b.read_knob(B)}
            return executor.apply(world, wanted, current=current, t_wall=1.0)

        await apply(50.0)
        assert a.values[A] == 50.0 and b.values[B] == 50.0
        a.block = True
        out = await apply(100.0, Layer.SAFETY)  # A's write blocks: given up on, B written all the same
        assert a.entered.is_set() and b.values[B] == 100.0 and executor.inline.hangs == 1
        assert "hwmon:a" in executor.unanswered.devices
        hung = [e for e in out.events if e.data.get("why") == "write_hung"]
        assert [e.subject for e in hung] == [A]
        await apply(60.0)  # the chip is held: not touched; the others are
        assert b.values[B] == 60.0 and a.writes == [(A, 50.0)]
        assert executor.unanswered.alarms(world.knobs, [A, B])[A].kind == "uncontrollable"
        report = await executor.restore_all([a, b], timeout_s=0.05)  # the write still hangs
        assert report.restored == (B,) and b.values[B] == 40.0
        assert A in report.failed and "does not answer" in report.failed[A]
        assert A in journal.entries() and B not in journal.entries()  # left for 'aithermd restore'
        a.release.set()

    try:
        asyncio.run(go())
    finally:
        a.release.set()


def test_the_chip_is_written_again_once_the_hung_write_returns(tmp_path):
    a, b = Fans("a", {A: 40.0}), Fans("b", {B: 40.0})
    world = KnobWorld({A: pwm_fan(A), B: pwm_fan(B)}, {A: a, B: b}, (a, b))
    executor = Executor(Applier(Journal(tmp_path / "state")), InstantWorker())
    executor.inline.deadline_s = 0.05

    async def go() -> None:
        def apply(duty: float):
            wanted = [(k, Decision(k, duty, Layer.POLICY, "p/fans")) for k in (A, B)]
            return executor.apply(world, wanted, current={A: a.read_knob(A), B: b.read_knob(B)}, t_wall=1.0)

        a.block = True
        await apply(50.0)
        assert "hwmon:a" in executor.unanswered.devices and b.values[B] == 50.0
        a.block = False
        a.release.set()
        for _ in range(1000):  # the thread's return reaches the loop (events, not durations)
            if not executor.unanswered.writes:
                break
            await asyncio.sleep(0.01)
        events = executor.unanswered.update({}, 2.0)
        assert [(e.kind, e.subject) for e in events] == [("recovered", "hwmon:a")]
        await apply(70.0)
        assert a.values[A] == 70.0

    try:
        asyncio.run(go())
    finally:
        a.release.set()

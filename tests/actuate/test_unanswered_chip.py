"""The apply path leaves a device whose chip does not answer alone (attack10 W2, W1r): a decision or hand-back
for one of its knobs neither writes nor reads it (on the loop, either would block on the driver's lock),
whoever asks; every other device is written as asked; its knobs carry an ``uncontrollable`` alarm; once it
answers, it is written again and the journal still holds the original found before the first write."""

from __future__ import annotations

import asyncio

from aithermd.actuate.applier import Applier
from aithermd.actuate.execute import Executor
from aithermd.actuate.journal import Journal
from aithermd.model import Decision, KnobValue, Layer
from tests.support.executor import InstantWorker, KnobWorld, pwm_fan

A, B = "hwmon:a/pwm1", "hwmon:b/pwm1"


class Fans:
    """An inline backend of fan duties (%); ``hung`` makes every call an error (it would block for ever)."""

    def __init__(self, values: dict[str, float]) -> None:
        self.values, self.hung, self.writes = values, False, []

    def locator(self) -> dict:
        return {"kind": "test"}

    def _touch(self) -> None:
        assert not self.hung, "a hung chip was touched on the loop"

    def save_knob(self, knob_id: str) -> dict:
        self._touch()
        return {"duty": self.values[knob_id]}

    def write_knob(self, knob_id: str, value: float) -> None:
        self._touch()
        self.writes.append((knob_id, value))
        self.values[knob_id] = value

    def read_knob(self, knob_id: str) -> KnobValue:
        self._touch()
        return KnobValue(knob_id, self.values[knob_id], "manual")





def test_a_chip_that_does_not_answer_is_neither_written_nor_read_and_control_resumes_after(tmp_path):
    a, b = Fans({A: 40.0}), Fans({B: 40.0})
    world = KnobWorld({A: pwm_fan(A), B: pwm_fan(B)}, {A: a, B: b}, (a, b))
    journal = Journal(tmp_path / "state")
    executor = Executor(Applier(journal), InstantWorker())

    def apply(duty: float, layer: Layer = Layer.POLICY, back: tuple[str, ...] = ()):
        wanted = [(k, Decision(k, duty, layer, "p/fans")) for k in (A, B) if k not in back]
        return asyncio.run(executor.apply(world, wanted, back=back, t_wall=1.0))

    apply(50.0)
    assert a.values[A] == 50.0 and b.values[B] == 50.0 and journal.entries()[A].saved == {"duty": 40.0}
    events = executor.unanswered.update({"hwmon:a": "read hung: no answer within 0.5 s"}, 2.0)
    assert [(e.kind, e.subject) for e in events] == [("fault", "hwmon:a")]
    assert "does not answer" in events[0].message
    a.hung = True
    out = apply(100.0, Layer.SAFETY)  # the safety layer's full duty: written where it can be
    assert b.values[B] == 100.0 and a.writes == [(A, 50.0)]
    assert [r.knob_id for r in out.results] == [B]
    out = apply(0.0, back=(A,))  # a hand-back of the hung chip's knob: left for when it answers
    assert a.writes == [(A, 50.0)] and A in journal.entries()
    alarms = executor.unanswered.alarms(world.knobs, [A, B])
    assert list(alarms) == [A] and alarms[A].kind == "uncontrollable" and alarms[A].since == 2.0
    assert executor.unanswered.update({"hwmon:a": "read hung"}, 3.0) == []  # said once
    a.hung = False
    events = executor.unanswered.update({}, 4.0)
    assert [(e.kind, e.subject) for e in events] == [("recovered", "hwmon:a")]
    assert executor.unanswered.alarms(world.knobs, [A, B]) == {}
    apply(70.0)
    assert a.values[A] == 70.0 and journal.entries()[A].saved == {"duty": 40.0}  # the first original kept

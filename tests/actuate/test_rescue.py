"""A chip that stops answering gets one try at full duty for the fans the daemon holds there (attack12
W1r-res; rule 3: a failed sensor drives its fans to full, never zero): off the loop in a thread of its own
(``Executor.hold`` returns while the write is still inside the backend), write only (nothing read back),
once per episode, the journal kept; never for a fan the daemon does not hold, another device, a chip whose
*write* alone hung (its reads answer), or once the executor is closed."""

from __future__ import annotations

import asyncio
import threading

from aithermd.actuate.applier import Applier
from aithermd.actuate.execute import Executor
from aithermd.actuate.journal import Journal
from aithermd.actuate.rescue import AFTER_S, THREAD_NAME
from aithermd.model import Decision, KnobValue, Layer
from tests.support.executor import InstantWorker, KnobWorld, pwm_fan

A1, A2, AX, B = "hwmon:a/pwm1", "hwmon:a/pwm2", "hwmon:a/pwm3", "hwmon:b/pwm1"
HUNG = {"hwmon:a": "read hung: no answer within 0.5 s"}


class Fans:
    """An inline fan backend (duties in %). Once ``hung``, a read is an error (it would block for ever) and a
    write waits for ``release`` (a store() held in the driver), noting the thread it ran in."""

    def __init__(self, values: dict[str, float]) -> None:
        self.values, self.hung, self.writes = values, False, []
        self.release, self.threads = threading.Event(), []

    def locator(self) -> dict:
        return {"kind": "test", "name": id(self)}

    def restore_knob(self, knob_id: str, saved: dict) -> None:
        self.write_knob(knob_id, saved["duty"])

    def save_knob(self, knob_id: str) -> dict:
        assert not self.hung, "read of a hung chip"
        return {"duty": self.values[knob_id]}

    def write_knob(self, knob_id: str, value: float) -> None:
        if self.hung:
            self.threads.append(threading.current_thread().name)
            assert self.release.wait(30)
        self.writes.append((knob_id, value))
        self.values[knob_id] = value

    def read_knob(self, knob_id: str) -> KnobValue:
        assert not self.hung, "read of a hung chip"
        return KnobValue(knob_id, self.values[knob_id], "manual")


def setup(tmp_path):
    a, b = Fans({A1: 40.0, A2: 40.0, AX: 40.0}), Fans({B: 40.0})
    world = KnobWorld({k: pwm_fan(k) for k in (A1, A2, AX, B)}, {A1: a, A2: a, AX: a, B: b}, (a, b))
    journal = Journal(tmp_path / "state")
    executor = Executor(Applier(journal), InstantWorker())
    executor.rescue.after_s = 0.0  # a try at the first tick held (the hold before it: its own test below)
    wanted = [(k, Decision(k, 30.0, Layer.POLICY, "p/fans")) for k in (A1, A2, B)]  # pwm3 never written
    asyncio.run(executor.apply(world, wanted, t_wall=1.0))
    assert a.values == {A1: 30.0, A2: 30.0, AX: 40.0} and sorted(journal.entries()) == sorted([A1, A2, B])
    return a, b, world, journal, executor


def settle(executor: Executor) -> None:
    for future in list(executor.rescue.pending.values()):
        future.exception(timeout=30)


def test_the_held_fans_of_a_chip_that_stops_answering_get_one_full_duty_write_off_the_loop(tmp_path):
    a, b, world, journal, executor = setup(tmp_path)
    a.hung = True  # from now on its writes block until released, its reads fail
    events = executor.hold(world, HUNG, 2.0, 2.0)  # returns while both writes are held in the "driver"
    assert [(e.kind, e.data.get("why")) for e in events] == [("fault", "unanswered"),
                                                              ("fault", "unanswered_full")]
    assert events[1].data["knobs"] == [A1, A2] and "full duty" in events[1].message
    assert sorted(executor.rescue.pending) == [A1, A2]
    assert executor.hold(world, HUNG, 3.0, 3.0) == []  # once: no second try while it is held
    a.release.set()
    settle(executor)
    assert a.values == {A1: 100.0, A2: 100.0, AX: 40.0}  # pwm3 is not the daemon's: never touched
    assert a.threads == [THREAD_NAME, THREAD_NAME] and b.values == {B: 30.0}
    assert {k: e.saved for k, e in journal.entries().items()} == {A1: {"duty": 40.0}, A2: {"duty": 40.0},
                                                                  B: {"duty": 40.0}}  # originals kept
    assert executor.hold(world, HUNG, 4.0, 4.0) == [] and executor.rescue.pending == {}
    a.hung = False
    assert [e.kind for e in executor.hold(world, {}, 5.0, 5.0)] == ["recovered"]
    # what the chip reads once it answers again (full duty) is no drift of another program
    assert executor.applier.observe(world.knobs[A1], KnobValue(A1, 100.0, "manual"), 5.0, 5.0) == []
    asyncio.run(executor.apply(world, [(A1, Decision(A1, 35.0, Layer.POLICY, "p/fans"))], t_wall=6.0,
                               current={A1: KnobValue(A1, 100.0, "manual")}))
    assert a.values[A1] == 35.0 and journal.entries()[A1].saved == {"duty": 40.0}
    a.hung = True  # a new episode: a new try
    episode = executor.hold(world, HUNG, 7.0, 7.0)
    assert [e.data.get("why") for e in episode] == ["unanswered", "unanswered_full"]
    settle(executor)
    assert a.values[A1] == 100.0


def test_no_try_for_a_chip_whose_write_alone_hung_nor_once_the_executor_is_closed(tmp_path):
    a, b, world, journal, executor = setup(tmp_path)
    executor.unanswered.write_hung("hwmon:a", A1, 0.5, 2.0)  # its store() blocks, its reads answer
    assert [e.data.get("why") for e in executor.hold(world, {}, 2.0, 2.0)] == []
    assert executor.rescue.pending == {} and a.values[A1] == 30.0
    # the read guard holds it too (the batch may have hung in its read-back): a try, write only
    assert [e.data.get("why") for e in executor.hold(world, HUNG, 3.0, 3.0)] == ["unanswered_full"]
    settle(executor)
    assert a.values == {A1: 100.0, A2: 100.0, AX: 40.0}
    executor.unanswered.returned("hwmon:a")
    executor.hold(world, {}, 4.0, 4.0)
    asyncio.run(executor.close(1.0))
    writes = len(a.writes)
    assert [e.data.get("why") for e in executor.hold(world, HUNG, 5.0, 5.0)] == ["unanswered"]
    assert executor.rescue.pending == {} and len(a.writes) == writes


def test_a_try_still_in_the_driver_at_the_stop_leaves_its_knob_journaled(tmp_path):
    """The stop restores a fan whose full-duty try has not returned, and keeps its entry: the try may land
    after the restore, and ``aithermd restore`` (ExecStopPost, once the process is gone) puts it back."""
    a, b, world, journal, executor = setup(tmp_path)
    a.hung = True
    executor.hold(world, HUNG, 2.0, 2.0)  # both tries held in the driver
    a.hung = False  # the restore's own writes get through (the order the stop must not lose)
    report = asyncio.run(executor.restore_all([a, b], 0.05))
    assert sorted(report.restored) == [A1, A2, B] and sorted(report.kept) == [A1, A2]
    assert b.values[B] == 40.0 and sorted(journal.entries()) == [A1, A2]
    a.release.set()
    settle(executor)
    assert a.values[A1] == 100.0 and journal.entries()[A1].saved == {"duty": 40.0}  # left for the restore


def test_a_chip_held_for_less_than_a_glitch_may_last_gets_no_try_one_held_longer_gets_one(tmp_path):
    """A chip merely slow is held until its read returns (a tick or two): no burst of full duty at each
    overrun (safety13's slowhold.py: 2-4 bursts of 255 in 30-40 s). A hold of AFTER_S (3 s, how long a
    suspect reading may stand in: TrustOptions.max_hold_s) without a break gets the try, once a hold."""
    a, b, world, journal, executor = setup(tmp_path)
    executor.rescue.after_s = AFTER_S
    assert AFTER_S == 3.0
    t_wall = 1_000_000.0  # epoch s: the wall clock plays no part in the hold
    for t in (10.0, 11.0, 12.5):  # held 2.5 s, then answers again
        assert "unanswered_full" not in [e.data.get("why") for e in executor.hold(world, HUNG, t_wall, t)]
    executor.hold(world, {}, t_wall, 13.0)
    for t in (14.0, 15.0, 16.0):  # a new hold from 14 s: 2 s, no try yet
        assert "unanswered_full" not in [e.data.get("why") for e in executor.hold(world, HUNG, t_wall, t)]
    assert executor.rescue.pending == {} and a.writes == [(A1, 30.0), (A2, 30.0)]
    assert [e.data.get("why") for e in executor.hold(world, HUNG, t_wall, 17.0)] == ["unanswered_full"]
    settle(executor)
    assert a.values == {A1: 100.0, A2: 100.0, AX: 40.0}
    assert executor.hold(world, HUNG, t_wall, 30.0) == []  # once a hold
    executor.hold(world, {}, t_wall, 31.0)
    a.values.update({A1: 30.0, A2: 30.0})
    executor.hold(world, HUNG, t_wall, 32.0)
    assert [e.data.get("why") for e in executor.hold(world, HUNG, t_wall, 35.0)] == ["unanswered_full"]
    settle(executor)
    assert a.values[A1] == 100.0

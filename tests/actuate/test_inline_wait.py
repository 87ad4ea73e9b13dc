"""The inline writer's wait (hang8): a batch past its last knob's deadline but inside no backend call (between
two knobs, or not begun on a busy CPU: ``writing`` None) is waited for, not polled in a busy loop, and is
not given up on."""

from __future__ import annotations

import threading
import time

from aithermd.actuate.inline import InlineWrites

READS = 200  # the spin read ``writing`` this many times in well under a millisecond


class Job:
    """A batch's progress as :meth:`InlineWrites.run` reads it; counts the reads of ``writing``; its
    ``READS``-th read lets the batch end (so the old busy loop ends the test rather than spinning on)."""

    def __init__(self, done: threading.Event) -> None:
        self.since = time.monotonic() - 10.0  # the last knob began long ago and returned
        self.stuck, self.cut, self.reads, self.done = None, False, 0, done

    @property
    def writing(self) -> None:
        self.reads += 1
        if self.reads >= READS:
            self.done.set()
        return None


def test_a_batch_between_knobs_past_the_deadline_is_waited_for_not_polled():
    done = threading.Event()
    job = Job(done)
    writes = InlineWrites(deadline_s=0.05)
    timer = threading.Timer(0.3, done.set)  # the batch's Python between two knobs ends
    timer.start()
    try:
        assert writes.run(lambda: done.wait(30), job) is None  # over, not given up on
    finally:
        timer.cancel()
        writes.close()
    assert job.stuck is None and not job.cut and writes.hangs == 0
    assert job.reads < READS, f"{job.reads} reads of job.writing: a busy loop"

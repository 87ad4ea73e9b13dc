"""One slow read is a glitch, not a failed sensor (attack13 A3; product rule: a confirmed failed sensor drives
its fans to full, a single glitch does not). One read of a chip that overran the read guard's deadline made
its channels stale, and the sensor trust passed stale readings through: the safety layer sent the board
fans to full at once (then a minute of ramp-down), while the devices the same pass could not read
(``ETIMEDOUT``) were held for one reading. Now the slow device's own readings are held the same way; a chip
still hung at the next reading is confirmed (stale: fans to full), and one held for a back-off is stale as
it comes.

Through the real ReadGuard, HwmonBackend and SensorTrust; the slow read blocks on an event the test sets
(no wall-clock figure)."""

from __future__ import annotations

from structlog.testing import capture_logs

from aithermd.backends.trust import SensorTrust
from aithermd.model import Status

from .test_read_slow import NCT, Rig, read_in_time


def test_one_overrun_is_held_for_one_reading_and_a_hang_that_stays_is_confirmed(tmp_path):
    rig = Rig(tmp_path)
    trust = SensorTrust()
    t = [0.0]

    def tick():
        t[0] += 1.0
        return trust.filter(t[0], rig.tick())
    try:
        assert tick()[f"{NCT}/temp1"].value == 28.0
        rig.io.slow = True
        with capture_logs() as logs:
            r = tick()  # the read overran: a glitch, the last good value stands in for one reading
        read_in_time(r)
        # one line for the device (the guard's read_hung), not one per channel held (attack13 A4: log volume)
        assert [e["event"] for e in logs if e["event"] in ("read_hung", "sensor_held")] == ["read_hung"]
        assert rig.guard.hangs == 1
        assert r[f"{NCT}/temp1"].status is Status.OK and r[f"{NCT}/temp1"].value == 28.0
        assert "held" in (r[f"{NCT}/temp1"].detail or "")
        rig.returned()
        rig.io.slow = False
        r = tick()  # read in time again: back as it comes
        assert r[f"{NCT}/temp1"].status is Status.OK and r[f"{NCT}/temp1"].detail is None
        rig.io.slow = True
        assert tick()[f"{NCT}/temp1"].status is Status.OK  # a new overrun: held once
        r = tick()  # still hung at the next reading: confirmed, stale (its fans to full)
        assert rig.guard.hangs == 2
        assert r[f"{NCT}/temp1"].status is Status.STALE and r[f"{NCT}/fan1"].status is Status.STALE
    finally:
        rig.close()

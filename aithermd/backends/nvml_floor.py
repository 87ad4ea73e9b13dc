"""Power-limit floors learned from a driver's refusals (the first pass's F16; attack4 B10).

A driver may answer ``NVML_ERROR_INVALID_ARGUMENT`` to a power limit inside the constraints it reports
(vGPU, notebooks under Dynamic Boost, some driver branches: nvidia-smi's "not a valid power limit"). A cut
it refuses then goes as deep as it takes, found by bisection (to :data:`FLOOR_STEP_W`) between the value
and the limit in force (:meth:`~aithermd.backends.nvml_knobs.NvmlKnobs._set_limit`). What that search found
is remembered here, per knob, so that the same refused call is not made every tick, with these bounds (a
refusal may be of a moment: a Dynamic Boost range moving, a driver busy, attack4 B10):

- a floor **expires**: below it is asked again after :data:`FLOOR_RETRY_S` (2 s, doubling up to 60 s while
  each retry finds the same floor); a limit taken under it drops it at once;
- a floor above a limit the driver **took before** (since the GPU was probed) is not trusted: below it is
  asked again every 2 s, never later;
- a search that got **nothing under the limit in force** learns no floor: the cut cannot be made now, and
  the write raises :class:`Uncontrollable` (the applier's ``uncontrollable`` alarm) every time it is asked;
  the value asked is tried each time, the search again after the same backoff;
- a floor is **never a raise**: it is used only while it is at or under the limit in force, so a write is
  never above both the value asked and the limit in force;
- it belongs to the GPU's probe (its reader): a re-probe (a GPU back after a reset or a loss, at its
  driver's default) or constraints read again (:meth:`LimitFloors.drop`) forget it.

Units: W; times: monotonic s.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

from aithermd import units
from aithermd.errors import BackendError, OutOfRange

FLOOR_STEP_W = 1.0  # how close the search for the lowest limit a driver takes comes to it
SET_LIMIT = "nvmlDeviceSetPowerManagementLimit"
FLOOR_RETRY_S = (2.0, 60.0)  # below a floor is asked again 2 s later, doubling up to 60 s while it holds


class Uncontrollable(BackendError):
    """The driver takes no power limit under the one in force (a cut cannot be made now). The applier
    holds an ``uncontrollable`` alarm on the knob while it lasts (it keys on this class's name)."""


@dataclass
class Floor:
    """What the last search found on ``knob``: ``w`` the lowest limit the driver took (W; None: nothing
    under ``in_force_w``, the limit in force then), asked below again from ``retry_at`` (monotonic s);
    ``delay`` the backoff that set it; ``reader`` the GPU's probe it was found on."""

    reader: Any
    w: float | None
    in_force_w: float
    retry_at: float
    delay: float
    why: str = ""


class LimitFloors:
    """Knob id → :class:`Floor`, and knob id → the lowest limit the driver took since the GPU's probe."""

    def __init__(self) -> None:
        self._floors: dict[str, Floor] = {}
        self._low: dict[str, tuple[Any, float]] = {}

    def get(self, reader: Any, knob_id: str) -> Floor | None:
        """The floor of ``knob_id`` found on ``reader`` (one found on an earlier probe is dropped)."""
        floor = self._floors.get(knob_id)
        if floor is not None and floor.reader is not reader:
            self.drop(knob_id)
            return None
        return floor

    def held(self, reader: Any, knob_id: str, now: float) -> Floor | None:
        """The floor of ``knob_id`` while it holds (not yet expired), else None."""
        floor = self.get(reader, knob_id)
        return floor if floor is not None and now < floor.retry_at else None

    def lowest_taken(self, reader: Any, knob_id: str) -> float | None:
        """The lowest limit (W) the driver took on ``knob_id`` since ``reader``'s probe, or None."""
        low = self._low.get(knob_id)
        return low[1] if low is not None and low[0] is reader else None

    def took(self, reader: Any, knob_id: str, w: float) -> Floor | None:
        """The driver took ``w`` W: remembered; returns the floor this drops (``w`` under it), else None."""
        low = self.lowest_taken(reader, knob_id)
        if low is None or w < low:
            self._low[knob_id] = (reader, w)
        floor = self.get(reader, knob_id)
        if floor is not None and (floor.w is None or w < floor.w - FLOOR_STEP_W / 2):
            del self._floors[knob_id]
            return floor
        return None

    def searched(self, reader: Any, knob_id: str, w: float | None, in_force_w: float, now: float,
                 low: float | None) -> Floor:
        """A search under ``in_force_w`` found ``w`` (None: nothing taken under it); ``low`` the lowest limit
        taken before it. The same finding again doubles the wait before the next retry, unless it is above
        ``low`` (not trusted: 2 s, always)."""
        old = self.get(reader, knob_id)
        same = old is not None and (
            (w is None and old.w is None and abs(old.in_force_w - in_force_w) <= FLOOR_STEP_W)
            or (w is not None and old.w is not None and abs(old.w - w) <= FLOOR_STEP_W))
        trusted = w is None or low is None or w <= low + FLOOR_STEP_W / 2
        delay = min(old.delay * 2.0, FLOOR_RETRY_S[1]) if same and trusted and old else FLOOR_RETRY_S[0]
        floor = self._floors[knob_id] = Floor(reader, w, in_force_w, now + delay, delay)
        return floor

    def drop(self, knob_id: str) -> None:
        """Forget ``knob_id``'s floor and the limits it took (its constraints were read again)."""
        self._floors.pop(knob_id, None)
        self._low.pop(knob_id, None)


class LimitWrites:
    """The power-limit write of :class:`~aithermd.backends.nvml_knobs.NvmlKnobs` (a mixin: it provides
    ``_do``, ``_reread_limits``, ``clock`` and ``_log``)."""

    clock: Any
    _log: Any
    _do: Any
    _reread_limits: Any

    def _set_limit(self, slot: Any, knob_id: str, value: float) -> None:
        """Set the power limit to ``value`` W. A driver may refuse (INVALID_ARGUMENT) a value inside the
        constraints it reports; a refused cut then goes as deep as the driver takes, found by bisection
        between it and the limit in force, and what that found is kept for a while (a floor: the value is
        asked again under it with backoff; :mod:`aithermd.backends.nvml_floor`). Nothing taken under the
        limit in force raises :class:`~aithermd.backends.nvml_floor.Uncontrollable` (the cut cannot be made
        now: an alarm). Never writes above both ``value`` and the limit in force."""
        floors: LimitFloors = self.__dict__.setdefault("_limit_floors", LimitFloors())
        reader, now = slot.reader, self.clock.monotonic()
        held, asked = floors.held(reader, knob_id, now), value
        if held is not None and held.w is not None and held.w > value:
            in_force = self._limit_in_force(slot, knob_id)
            if in_force is not None and held.w <= in_force:  # else the floor would raise the limit
                asked = held.w
        try:
            self._do(slot, f"{knob_id} := {asked:g} W", SET_LIMIT, units.w_to_mw(asked))
        except OutOfRange:
            if self._reread_limits(slot, knob_id):  # the constraints changed: clamped to the new ones (B2)
                floors.drop(knob_id)
                asked = slot.reader.knobs["power_limit"].clamp(value)
                self._do(slot, f"{knob_id} := {asked:g} W", SET_LIMIT, units.w_to_mw(asked))
                floors.took(reader, knob_id, asked)
                return
            in_force = self._limit_in_force(slot, knob_id)
            if in_force is None or asked >= in_force - FLOOR_STEP_W:
                if asked > value:
                    floors.drop(knob_id)  # the floor itself refused now: searched again next time
                raise
            if held is not None and held.w is None and abs(held.in_force_w - in_force) <= FLOOR_STEP_W:
                raise Uncontrollable(held.why) from None  # the value asked again; searched after the backoff
            self._search(slot, knob_id, floors, value, asked, in_force, now)
            return
        gone = floors.took(reader, knob_id, asked)
        if gone is not None:
            self._log.warning("power_limit_floor_gone", knob=knob_id, value_w=asked, floor_w=gone.w,
                              message=f"{knob_id}: the driver took {asked:g} W, under the floor found before")

    def _limit_in_force(self, slot: Any, knob_id: str) -> float | None:
        return units.mw_to_w(self._do(slot, f"{knob_id}: read", "nvmlDeviceGetPowerManagementLimit"))

    def _search(self, slot: Any, knob_id: str, floors: LimitFloors, value: float, refused: float,
                in_force: float, now: float) -> None:
        """Bisect between ``refused`` W (the driver refused it) and the ``in_force`` W for the lowest limit
        it takes; keep what was found (:meth:`LimitFloors.searched`)."""
        reader, low = slot.reader, floors.lowest_taken(slot.reader, knob_id)
        old, taken = floors.get(reader, knob_id), in_force
        while taken - refused > FLOOR_STEP_W:
            mid = round((refused + taken) / 2.0)
            try:
                self._do(slot, f"{knob_id} := {mid:g} W", SET_LIMIT, units.w_to_mw(mid))
                taken = mid
            except OutOfRange:
                refused = mid
        if taken < in_force:
            floors.took(reader, knob_id, taken)
        elif old is not None and old.w is not None and abs(old.w - in_force) <= FLOOR_STEP_W:
            taken = old.w  # at the floor found before, and it holds: confirmed
        else:  # nothing under the limit in force: the cut cannot be made now
            again = old is not None and old.w is None and abs(old.in_force_w - in_force) <= FLOOR_STEP_W
            floor = floors.searched(reader, knob_id, None, in_force, now, low)
            floor.why = (f"{knob_id}: the driver refuses every power limit under the {in_force:g} W in force "
                         f"(NVML_ERROR_INVALID_ARGUMENT; {value:g} W asked, its constraints say "
                         f"{slot.reader.knobs['power_limit'].min:g} W), cannot cut; asked again")
            if not again:  # said once, not at each search
                self._log.error("power_limit_cannot_cut", knob=knob_id, asked_w=value, in_force_w=in_force,
                                message=floor.why)
            raise Uncontrollable(floor.why)
        was = old.w if old is not None else None
        floor = floors.searched(reader, knob_id, taken, in_force, now, low)
        if was is None or abs(was - taken) > FLOOR_STEP_W:
            message = (f"{knob_id}: the driver refuses limits under {taken:g} W (its constraints say "
                       f"{slot.reader.knobs['power_limit'].min:g} W): {value:g} W asked, {taken:g} W set; "
                       f"asked again in {floor.delay:g} s")
            self._log.warning("power_limit_floor", knob=knob_id, asked_w=value, floor_w=taken,
                              retry_in_s=floor.delay, message=message)

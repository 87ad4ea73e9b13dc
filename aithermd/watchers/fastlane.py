"""The fast lane: a ≥ 10 Hz path that watches only the critical inputs between main ticks.

With a 1–5 s main tick a temperature can cross its critical threshold just after a sample and stay
unanswered for a whole period. After each main tick :meth:`FastLane.rearm` picks the few inputs worth
watching from the published snapshot:

- every temperature within ``near_c`` of its safety trigger (the device's own threshold − margin, exactly
  as the safety layer computes it: hwmon ``crit``/``emergency``, NVML ``slowdown``/``shutdown``; the
  engine's plan with the policies' margins when there is one);
- every temperature of a GPU whose power draw is above its power limit (enforced limit where NVML reports
  one): it heats fastest, so it is watched whatever its temperature.

Between ticks :meth:`FastLane.poll_once` reads only those inputs — one ``pread`` per hwmon file through a
descriptor of its own, one temperature call per GPU on the NVML worker (:mod:`aithermd.backends.readers`) —
every ``1 / rate_hz`` s, from one period before the first moment a watched input could be at its trigger:
its headroom at the tick (trigger − reading) over the fastest rise its sensor shows (:func:`rise_rate
<aithermd.backends.plausible.rise_rate>`: 80 °C/s for CPU dies, 20 °C/s for an NVIDIA GPU through NVML,
30 °C/s for hwmon GPUs, 15 °C/s for board sensors). Until then nothing is read, and the polling thread
starts that quiet time again from each poll's own readings: a board sensor 9 °C under its trigger is read
about twice a second instead of 12.5 times, and a crossing is still seen within a period of becoming
possible. A crossing that left the tick's reading faster than the sensor can move (the sensor trust's rate
limits, :mod:`aithermd.backends.plausible`) is a suspected spike: the lane acts only when the next poll
still reads it at its trigger (one poll period later), as the tick's trust would; a plausible rise is
acted on at once. When one reaches its trigger the lane applies the safety layer's own decisions for it
(power limits to their minimum, the device's fans and the fans whose curve reads it to full) through the
one apply path (:mod:`aithermd.actuate.execute`: journal first, write, read back), under the loop's tick
lock so it never interleaves with a tick. The next main tick sees the same temperature, its safety layer
latches and takes over. A channel acted on is not acted on again until the next tick re-arms the lane.
With nothing to watch the lane sleeps until the next re-arm (no cost).

In real time (``FastLaneOptions.threaded``) the polling runs in a thread of its own (a timed wait costs
well under an event-loop wake-up; benchmarks/bench_fastlane.py), one wait per poll: it reads the watched
hwmon files and GPU temperatures itself (one NVML call per GPU, no hand-off to the NVML worker; a read that
hangs is left to a fresh thread: :mod:`aithermd.watchers.lanegpus`), paces itself by their headroom, and
hands only a crossing to the event loop (one :meth:`FastLane.poll_once`, acting under the tick lock).
"""

from __future__ import annotations

import asyncio
import math
import threading
import time
from collections.abc import Awaitable, Callable, Mapping
from dataclasses import dataclass
from typing import Any

import structlog

from aithermd.backends.plausible import MIN_DT_S, rate_limit, rise_rate
from aithermd.backends.registry import reader_for
from aithermd.clock import Clock, RealClock
from aithermd.model import DeviceKind, Event, KnobValue, Quantity, Reading, Snapshot, Status
from aithermd.policy import safety
from aithermd.watchers.alarm import Alarm
from aithermd.watchers.lanegpus import DirectReads, hot_gpus

CRITICAL_RULE = "safety/critical-temperature"
IDLE_S = 3600.0  # the polling thread's quiet time with nothing left to pace by (a re-arm wakes it)


@dataclass(frozen=True, slots=True)
class FastLaneOptions:
    """``rate_hz``: polls per second while something is watched (≥ 10; the default 12.5 Hz answers a
    crossing within 80 ms + the write, inside the 100 ms budget; benchmarks/bench_fastlane.py); ``near_c``:
    how far below its trigger a temperature starts being watched (°C); ``nvml_timeout_s``: longest wait
    for one GPU's read (s); ``apply_timeout_s``: longest wait for the NVML knobs' writes (s)."""

    rate_hz: float = 12.5
    near_c: float = 10.0
    nvml_timeout_s: float = 0.05
    apply_timeout_s: float = 1.0
    threaded: bool = False  # poll from a thread of its own (real time only: it sleeps on the real clock)

    def __post_init__(self) -> None:
        if not self.rate_hz >= 10.0:
            raise ValueError(f"the fast lane runs at ≥ 10 Hz, not {self.rate_hz}")


def fan_sources(plans: Any) -> dict[str, tuple[str, ...]]:
    """Fan knob id → the temperature channel ids its curve reads, from the engine's compiled plans
    (``EngineState.plans``); {} when there are none."""
    out: dict[str, tuple[str, ...]] = {}
    for plan in plans or ():
        for rule in getattr(plan, "rules", ()):
            if getattr(rule, "kind", None) != "fan" or not getattr(rule, "curve_name", None):
                continue
            chans = tuple(c for cs in rule.sources.values() for c in cs)
            for t in rule.targets:
                out[t.knob.id] = tuple(dict.fromkeys((*out.get(t.knob.id, ()), *chans)))
    return out


class FastLane:
    """``tick()`` gives the loop's :class:`~aithermd.runtime.tick.Tick` (its world, engine state and apply
    path); ``lock`` is the tick lock; ``post(events)`` queues events for the next snapshot; ``paused()`` is
    true while the machine sleeps (nothing is read or written then). As a service (``start``/``stop``) it
    re-arms from every snapshot ``hub`` publishes and polls from a thread of its own
    (``options.threaded``) or a task."""

    name = "fastlane"

    def __init__(self, tick: Callable[[], Any], lock: asyncio.Lock, post: Callable[[list[Event]], None],
                 options: FastLaneOptions | None = None, *, clock: Clock | None = None,
                 sleep: Callable[[float], Awaitable[Any]] = asyncio.sleep,
                 paused: Callable[[], bool] = lambda: False, hub: Any = None) -> None:
        self.tick, self.lock, self.post, self.paused, self.hub = tick, lock, post, paused, hub
        self.options = options or FastLaneOptions()
        self.clock = clock or RealClock()
        self.sleep = sleep
        self.period_s = 1.0 / self.options.rate_hz
        self.watch: dict[str, float] = {}  # channel id → trigger °C
        self.acted: set[str] = set()
        self.polls = 0
        self.actions = 0
        self._hwmon: dict[str, Any] = {}  # channel id → a reader read on the loop (read(), close())
        self._nvml: dict[str, Any] = {}  # channel id → a reader awaited on its worker (aread(timeout_s))
        self._base: Mapping[str, Reading] = {}
        self._base_t = 0.0
        self._knobs: Mapping[str, KnobValue] = {}
        self.quiet_until = 0.0  # clock.monotonic() before which no watched input can reach its trigger
        self._quiet_rt = 0.0  # the same on the polling thread's clock (time.monotonic())
        self._jump: dict[str, float] = {}  # channel → its rate limit (°C/s): a faster crossing is confirmed
        self._pace: dict[str, float] = {}  # channel → the fastest rise (°C/s) its polls are paced by
        self._pending: set[str] = set()  # crossings seen once that moved faster than their rate limit
        self._plan: Any = None
        self._devices: Any = None
        self._gpus_in: bool = False  # whether self._devices has a GPU (hot_gpus is asked only then)
        self._armed = asyncio.Event()
        self._wake = Alarm()  # the polling thread's wake-up: re-armed or stopped
        self._readers_lock = threading.Lock()  # no reader is closed while the thread reads through it
        self._stopped = False
        self._thread: threading.Thread | None = None
        self._gpus = DirectReads()  # the polling thread's own GPU reads
        self._generation, self._loop = 0, None  # the polling thread's; its loop
        self._task: asyncio.Task[None] | None = None
        self._unlisten: Callable[[], None] | None = None
        self._log = structlog.get_logger("aithermd.fastlane")

    # -- after each main tick --------------------------------------------------------------------------
    def rearm(self, snapshot: Snapshot, *_: Any) -> None:
        """Choose the watched inputs from ``snapshot`` (a StateHub listener)."""
        tick = self.tick()
        world = tick.world
        deadline = max((getattr(r, "deadline_s", None) or 0.5 for r in self._nvml.values()), default=0.5) \
            if self._nvml else 0.5  # no generator made while no GPU is watched (the usual tick)
        if self._loop is not None and (gpu := self._gpus.overdue(self._generation, deadline)) is not None:
            self._log.error("fastlane_nvml_hung", gpu=gpu, deadline_s=deadline)  # left out until it answers
            self._thread = self.start_thread(self._loop)  # a fresh thread goes on watching the others
        if world.devices is not self._devices:
            self._close_readers()
            self._devices = world.devices
            self._gpus_in = any(d.kind == DeviceKind.GPU for d in world.devices)
        plan = getattr(tick.state, "safety", None)
        if not isinstance(plan, safety.SafetyPlan) or (plan.devices is not world.devices
                                                       and plan.devices != world.devices):
            plan = safety.plan(world.devices, safety.SafetyParams())
        self._plan, self._base, self._base_t = plan, snapshot.readings, snapshot.t_mono
        self._knobs = snapshot.knobs  # the limits in force: a latch never cuts from above them
        hot = hot_gpus(world.devices, snapshot) if self._gpus_in else set()
        watch: dict[str, float] = {}
        readings, ok, near_c = snapshot.readings, Status.OK, self.options.near_c
        for cid, trig in plan.triggers:
            r = readings.get(cid)
            near = r is not None and r.status == ok and r.value is not None and r.value >= trig - near_c
            if not near and not hot:  # far from its trigger, and no GPU over its power limit
                continue
            device_id = cid.rsplit("/", 1)[0]
            if (near or device_id in hot) and self._reader(world, cid, device_id):
                watch[cid] = trig
        if not watch and not self.watch and not self._hwmon and not self._nvml:
            self._pending.clear()  # nothing watched before or now (the usual tick): nothing to set up
            self.acted.clear()
            self._armed.clear()
            return
        by_id = {d.id: d for d in world.devices}
        with self._readers_lock:
            for cid in [c for c in self._hwmon if c not in watch]:
                self._hwmon.pop(cid).close()
            for cid in [c for c in self._nvml if c not in watch]:
                del self._nvml[cid]
            self.watch = watch
            drivers = {cid: _driver(by_id.get(cid.rsplit("/", 1)[0])) for cid in watch}
            self._jump = {c: rate_limit(Quantity.TEMPERATURE, d) or math.inf for c, d in drivers.items()}
            self._pace = {c: rise_rate(d) for c, d in drivers.items()}
            first = min((self._headroom_s(snapshot.readings.get(cid), trig, self._pace[cid])
                         for cid, trig in watch.items()), default=0.0)
            self.quiet_until = snapshot.t_mono + first - self.period_s
            self._quiet_rt = time.monotonic() + (self.quiet_until - self.clock.monotonic())
            self._pending.clear()
            self.acted.clear()
            # already at its trigger in this tick: the tick's own safety layer acted (and latches); the lane
            # waits for the next crossing instead of repeating that action every tick
            self.acted.update(cid for cid, trig in watch.items()
                              if (r := snapshot.readings.get(cid)) is not None and r.value is not None
                              and r.value >= trig)
        if watch:
            self._armed.set()
            self._wake.set()
        else:
            self._armed.clear()

    @staticmethod
    def _headroom_s(reading: Reading | None, trigger_c: float, rate_c_s: float) -> float:
        """Shortest time (s) for ``reading`` to rise to ``trigger_c`` at ``rate_c_s`` °C/s (0: unknown)."""
        if reading is None or reading.status != Status.OK or reading.value is None or math.isinf(rate_c_s):
            return 0.0
        return max(0.0, (trigger_c - reading.value) / rate_c_s)

    def _reader(self, world: Any, cid: str, device_id: str) -> bool:
        if cid in self._hwmon or cid in self._nvml:
            return True
        reader = reader_for(world.device_owner.get(device_id), cid)
        if hasattr(reader, "aread"):  # an NVML reader: its calls belong to the backend's worker
            self._nvml[cid] = reader
            return True
        if reader is not None:
            self._hwmon[cid] = reader
            return True
        return False

    # -- between ticks ---------------------------------------------------------------------------------
    async def run(self) -> None:
        """Poll at ``rate_hz`` while something is watched; sleep until re-armed otherwise."""
        while not self._stopped:
            if not self.watch:
                self._armed.clear()
                await self._armed.wait()
                continue
            quiet = self.quiet_until - self.clock.monotonic()
            if quiet > 0:  # no watched input can be at its trigger yet (a re-arm only moves this later)
                await self.sleep(quiet)
                continue
            started = self.clock.monotonic()
            try:
                await self.poll_once()
            except Exception:  # noqa: BLE001 - the lane never takes the daemon down
                self._log.exception("fastlane_failed")
            await self.sleep(max(0.0, started + self.period_s - self.clock.monotonic()))

    def start_thread(self, loop: asyncio.AbstractEventLoop) -> threading.Thread:
        """Poll from a thread of its own (real time); acting stays on ``loop``. Stopped by :meth:`stop`."""
        self._generation, self._loop = self._generation + 1, loop  # an older thread ends when it sees this
        thread = threading.Thread(target=self._thread_main, args=(loop, self._generation),
                                  name="aithermd-fastlane", daemon=True)
        thread.start()
        return thread

    def _thread_main(self, loop: asyncio.AbstractEventLoop, generation: int = 0) -> None:
        while not self._stopped and generation in (0, self._generation):
            if not self.watch:
                self._wake.wait()
                self._wake.clear()
                continue
            started = time.monotonic()
            polled = self._quiet_rt <= started  # before it no watched input can be at its trigger
            if polled and self._crossed(generation):
                try:
                    asyncio.run_coroutine_threadsafe(self.poll_once(), loop).result(
                        self.options.apply_timeout_s + self.period_s)
                except Exception:  # noqa: BLE001 - a closed loop at stop, a slow write: the tick acts
                    if self._stopped:
                        return
                    self._log.warning("fastlane_handoff_failed", exc_info=True)
            wake_at = max(started + self.period_s, self._quiet_rt) if polled else self._quiet_rt
            if self._wake.wait(max(0.0, wake_at - time.monotonic())):  # the next poll, a re-arm or a stop
                self._wake.clear()

    def _crossed(self, generation: int = 0) -> bool:
        """True when a watched input not acted on since the re-arm (GPUs: read on this thread, unknown when
        stuck, :mod:`aithermd.watchers.lanegpus`) is at its trigger or above; else the quiet time restarts
        from these readings (with none left, one acted on cannot be again: until the next re-arm)."""
        acted = self.acted
        gpus = {cid: r for cid, r in self._nvml.copy().items() if cid not in acted}  # copy(): atomic
        temps = self._gpus.temperatures(gpus, generation) if gpus else {}
        with self._readers_lock:
            watch, pace, first = self.watch, self._pace, math.inf
            hwmon = ((c, quick.read()) for c, quick in self._hwmon.items() if c not in acted)
            for cid, value in [*hwmon, *temps.items()]:
                trig = watch.get(cid, math.inf)
                if value is None:
                    first = 0.0  # unknown: keep polling
                elif value >= trig:
                    return True
                else:
                    first = min(first, (trig - value) / pace.get(cid, math.inf))
            self._quiet_rt = max(self._quiet_rt, time.monotonic() + min(first, IDLE_S) - self.period_s)
        return False

    async def poll_once(self) -> bool:
        """Read the watched inputs once; act on those at or above their trigger. True when it acted."""
        if self.paused() or not self.watch:
            return False
        self.polls += 1
        fresh: dict[str, float] = {}
        for cid, quick in self._hwmon.items():
            value = quick.read()
            if value is not None:
                fresh[cid] = value
        for cid, gpu in list(self._nvml.items()):
            try:
                temp, _ = await gpu.aread(self.options.nvml_timeout_s)
            except Exception:  # noqa: BLE001 - BackendTimeout, a closed worker: the main tick reports
                continue
            if temp is not None:
                fresh[cid] = temp
        critical = {cid: (v, self.watch[cid]) for cid, v in fresh.items()
                    if cid in self.watch and v >= self.watch[cid] and cid not in self.acted}
        self._pending &= critical.keys()  # a spike that fell back below its trigger is dropped
        for cid in [c for c in critical if self._spike(c, critical[c][0])]:
            del critical[cid]  # faster than the sensor can move: confirmed by the next poll, as by the tick
            self._pending.add(cid)
        if not critical:
            return False
        await self._act(critical, fresh)
        return True

    def _spike(self, cid: str, value: float) -> bool:
        """True when ``value`` left the tick's reading faster than its rate limit, unseen by the last poll."""
        if cid in self._pending:
            return False
        base = self._base.get(cid)
        if base is None or base.status != Status.OK or base.value is None:
            return False
        dt = max(self.clock.monotonic() - self._base_t, MIN_DT_S)
        return value - base.value > self._jump.get(cid, float("inf")) * dt

    async def _act(self, critical: Mapping[str, tuple[float, float]], fresh: Mapping[str, float]) -> None:
        async with self.lock:
            if self.paused():
                return
            tick = self.tick()
            world = tick.world
            readings = dict(self._base)
            readings.update((cid, Reading(cid, v)) for cid, v in fresh.items())
            decided, _ = safety.evaluate(self._plan, readings, fan_sources(getattr(tick.state, "plans", ())),
                                         frozenset(), knob_values=self._knobs)
            mine = {k: d for k, d in decided.items() if d.rule == CRITICAL_RULE and k in world.knobs
                    and not critical.keys().isdisjoint(d.inputs)}
            t_wall = self.clock.wall()
            applied = await tick.executor.apply(world, mine.items(), t_wall=t_wall,
                                                 budget_s=self.options.apply_timeout_s)
            events = applied.events
            if applied.late:  # the worker is busy or slow: the tick's safety layer acts on them
                self._log.warning("fastlane_nvml_late", knobs=applied.late)
            self.acted.update(critical)
            self.actions += 1
        for cid, (value, trig) in critical.items():
            message = (f"fast lane: {cid} at {value:g} °C ≥ {trig:g} °C between ticks: safety action on "
                       f"{len(mine)} knob(s)")
            data = {"lane": "fast", "value_c": value, "trigger_c": trig, "knobs": sorted(mine)}
            self._log.error("fastlane_critical", channel=cid, value_c=value, trigger_c=trig,
                            knobs=data["knobs"])
            events.insert(0, Event("fault", t_wall, cid, message, data))
        self.post(events)

    # -- lifecycle -------------------------------------------------------------------------------------
    async def start(self) -> None:
        """Re-arm from every snapshot of ``hub``; poll from a thread (``options.threaded``) or a task."""
        if self.hub is not None:
            self._unlisten = self.hub.add_listener(self.rearm)
        if self.options.threaded:
            self._thread = self.start_thread(asyncio.get_running_loop())
        else:
            self._task = asyncio.create_task(self.run())

    async def stop(self) -> None:
        """Stop polling and acting (the thread waits on the loop for a hand-off only: gone in a period)."""
        self._stopped = True
        self._armed.set()
        self._wake.set()
        self._close_readers()
        if self._unlisten is not None:
            self._unlisten()
            self._unlisten = None
        if self._thread is not None:
            await asyncio.to_thread(self._thread.join, 2.0)
            self._thread = None
        if self._task is not None:
            self._task.cancel()
            await asyncio.gather(self._task, return_exceptions=True)
            self._task = None

    def _close_readers(self) -> None:
        with self._readers_lock:
            for quick in self._hwmon.values():
                quick.close()
            self._hwmon.clear()
            self._nvml.clear()
            self.watch = {}


def _driver(device: Any) -> str | None:
    """The name rate limits go by: ``nvml`` for an NVIDIA GPU, else the device's driver name."""
    if device is None:
        return None
    return "nvml" if device.kind == DeviceKind.GPU else device.name

"""The energy side of the daemon, fed by published snapshots: one meter, the energy windows, and (when
given a process table) the accountant that says which process used the joules, and the energy history.

:meth:`EnergyService.on_publish` is a :class:`~aithermd.publish.hub.StateHub` listener (cheap: one pass
over the snapshot's energy channels). Every ``interval_s`` of snapshot time it starts one accounting pass
as a task: each GPU backend's ``ausage()`` (process lists, on the NVML worker) and the process scan (in a
thread), then the split, the ledger, the scoped windows and the history, back on the loop. Only one pass
runs at a time; a slow one delays the next, never the tick. A machine without a GPU or a RAPL package zone
has no joules to share out: no pass runs (the scan of every process was most of the daemon's CPU there).

State is kept in the state directory: ``energy.json`` (open windows, the meter's counter points, the joules
not yet accounted and where accounting stopped, idle floors) written at most every ``save_every_s`` and on
stop, and ``energy-history.json``. So windows, their sums and the history survive a daemon restart, and the
energy used while the daemon was down is counted once the counters are read again (in the same boot: the
points carry the kernel's boot id): in the device totals and open windows, as *unattributed* -- nobody
watched who used it, and the processes present after the restart did not (attack8 T2).
"""

from __future__ import annotations

import asyncio
import json
import math
import os
from collections.abc import Sequence
from pathlib import Path
from typing import Any

import structlog

from aithermd.accounting.accountant import CPU, Accountant, accounted_device, is_package_zone
from aithermd.accounting.attribution import Split
from aithermd.accounting.export import Exporter
from aithermd.accounting.history import FORMAT as HISTORY_FORMAT
from aithermd.accounting.history import EnergyHistory
from aithermd.accounting.meter import EnergyMeter, points_from_json, points_to_json
from aithermd.accounting.procs import ProcessTable
from aithermd.accounting.windows import EnergyWindows
from aithermd.actuate.journal import current_boot_id
from aithermd.clock import Clock, RealClock
from aithermd.files import read_regular
from aithermd.model import Event, Snapshot

STATE_FILE = "energy.json"
HISTORY_FILE = "energy-history.json"
FORMAT = "aithermd-energy/1"
MAX_STATE_BYTES = 16 << 20  # what is read back; the history is written within HISTORY_MAX_BYTES
HISTORY_MAX_BYTES = 2 << 20
SETTLE_S = 5.0  # s the longest a stopped window waits for its last accounting pass
SLEPT_S = 2.0  # boot clock ahead of the monotonic one by more than this between snapshots: a suspend


def _floats(value: Any) -> dict[str, float]:
    if not isinstance(value, dict):
        return {}
    return {str(k): float(v) for k, v in value.items()
            if isinstance(v, int | float) and not isinstance(v, bool) and math.isfinite(v)}


class EnergyService:
    """``state_dir`` None: nothing is kept across restarts (tests, ``--dry-run``). ``table``: the process
    table (None: windows only, no attribution); ``gpus``: backends with ``ausage()``."""

    def __init__(self, clock: Clock | None = None, state_dir: Path | None = None, *, per_uid: int = 8,
                 max_windows: int = 256, save_every_s: float = 60.0, table: ProcessTable | None = None,
                 gpus: Sequence[Any] = (), interval_s: float = 5.0, cost_per_kwh: float | None = None,
                 currency: str = "", top_n: int = 10, boot_id: str | None = None) -> None:
        self.clock = clock or RealClock()
        self.state_dir = None if state_dir is None else Path(state_dir)
        self.save_every_s = save_every_s
        self.interval_s = interval_s
        self.cost_per_kwh, self.currency = cost_per_kwh, currency
        self.gpus = list(gpus)
        self._log = structlog.get_logger("aithermd.energy")
        saved = self._load(STATE_FILE, FORMAT)
        if boot_id is None and self.state_dir is not None:
            boot_id = current_boot_id()
        self.meter = EnergyMeter(seed=points_from_json(saved.get("points")), clock=self.clock,
                                 boot_id=boot_id)
        self.windows = EnergyWindows(self.clock, per_uid=per_uid, max_windows=max_windows)
        restored = self.windows.restore(saved.get("windows") or [])
        if restored:
            self._log.info("energy_windows_restored", windows=restored)
        self.accountant = None if table is None else Accountant(table, _floats(saved.get("floors")))
        self.history = EnergyHistory(self._load(HISTORY_FILE, HISTORY_FORMAT))
        until = saved.get("accounted_until")
        self._accounted_until: float | None = float(until) if isinstance(until, int | float) else None
        self._pending: dict[str, float] = _floats(saved.get("pending"))
        # seconds those joules span: the meter's intervals (boot clock; the wall clock only across a restart)
        pending_s = saved.get("pending_s")
        self._pending_s = float(pending_s) if isinstance(pending_s, int | float) and pending_s >= 0 else 0.0
        self._latest_run = self.clock.boottime()  # boot-clock s of the latest snapshot
        self._latest_mono = self.clock.monotonic()  # and on the monotonic clock (stops in a suspend)
        self._slept = False  # the machine slept since the last pass: that pass teaches no idle floor
        self._latest: Snapshot | None = None
        self._next_pass: float | None = None
        self._task: asyncio.Task[None] | None = None
        self._last_save: float | None = None
        self.exporter = Exporter(top_n)
        self._processes_text: str | None = None
        self._known: tuple[str, ...] = ()
        self._uuids: dict[str, str] = {}  # GPU device id → UUID (the exported series' dcgm labels)

    def _load(self, name: str, fmt: str) -> dict[str, Any]:
        if self.state_dir is None:
            return {}
        path = self.state_dir / name
        try:
            data = json.loads(read_regular(path, MAX_STATE_BYTES)[:MAX_STATE_BYTES + 1])
        except FileNotFoundError:
            return {}
        except (OSError, ValueError) as exc:
            self._log.warning("energy_state_unreadable", path=str(path), error=str(exc),
                              message="starting without it")
            return {}
        if not isinstance(data, dict) or data.get("format") != fmt:
            self._log.warning("energy_state_unreadable", path=str(path), error="unknown format")
            return {}
        return data

    @classmethod
    def for_daemon(cls, settings: Any, clock: Clock, backends: Sequence[Any],
                   table: ProcessTable | None = None) -> EnergyService:
        """The daemon's service: state in ``settings.state_dir`` (none with ``dry_run``, which writes
        nothing), attribution every ``energy_interval_s`` over the GPU backends (those with ``ausage``)
        and ``table`` (default: this machine's processes through psutil and ``/proc``)."""
        interval = settings.energy_interval_s
        if interval > 0 and table is None:
            table = ProcessTable()
        return cls(clock, None if settings.dry_run else settings.state_dir,
                   table=table if interval > 0 else None,
                   gpus=[b for b in backends if hasattr(b, "ausage")], interval_s=interval or 5.0,
                   cost_per_kwh=settings.energy_cost_per_kwh, currency=settings.energy_currency,
                   top_n=settings.energy_top_n)

    def attach(self, hub: Any) -> EnergyService:
        """Listen to ``hub``'s snapshots until :meth:`stop`; returns self."""
        self._detach = hub.add_listener(self.on_publish)
        return self

    # ---- per snapshot (event loop) -----------------------------------------------------------------------
    def on_publish(self, snapshot: Snapshot, events: Sequence[Event] = ()) -> None:
        increment = self.meter.feed(snapshot)
        self.windows.add(increment)
        run, mono = self.clock.boottime(), self.clock.monotonic()
        if (run - self._latest_run) - (mono - self._latest_mono) > SLEPT_S:
            self._slept = True  # a suspend: the interval's mean draw is the sleep's, no idle draw (T4)
        self._latest, self._latest_run, self._latest_mono = snapshot, run, mono
        if self.accountant is not None and snapshot.devices is not getattr(self, "_devices", None):
            self._devices = snapshot.devices
            self._uuids = {d.id: str(d.info["uuid"]) for d in snapshot.devices if d.info.get("uuid")}
            self._known = tuple(d for d in increment.joules if d.startswith("gpu")) + (
                (CPU,) if any(is_package_zone(d) for d in increment.joules) else ())
            if not self.exporter.export.devices:  # every counter exists at 0 once its device is known
                self.exporter.update(self._latest_run, (), self.accountant.info, {}, {}, self._known,
                                     self._uuids)
        if self.accountant is not None:
            self._pending_s += increment.dt_s
            down = increment.downtime
            for device, joules in increment.joules.items():
                if device.startswith("gpu") or is_package_zone(device):
                    self._pending[device] = self._pending.get(device, 0.0) + joules - down.get(device, 0.0)
            if down:
                self._book_downtime(down, snapshot.t_wall)
            if self._accounted_until is None:
                self._accounted_until = snapshot.t_wall
            if self._next_pass is None:
                self._next_pass = snapshot.t_mono + self.interval_s
            elif snapshot.t_mono >= self._next_pass and (self._task is None or self._task.done()):
                self._next_pass = snapshot.t_mono + self.interval_s
                if self._known:  # no GPU and no RAPL package: no joules to share, no process scan
                    self._task = asyncio.get_running_loop().create_task(self.account())
        now = self.clock.monotonic()
        if self.windows.changed or self._last_save is None or now - self._last_save >= self.save_every_s:
            self.save()

    def _book_downtime(self, down: dict[str, float], t_wall: float) -> None:
        """The joules used while the daemon was down: in the device totals and the day's history as
        unattributed (J; the CPU is its package zones' sum), charged to no process."""
        assert self.accountant is not None
        per: dict[str, float] = {}
        for device, joules in down.items():
            name = accounted_device(device)
            if name is not None and joules > 0:
                per[name] = per.get(name, 0.0) + joules
        for device, joules in per.items():
            split = Split(device, joules, (), 0.0, joules)
            self.accountant.ledger.add(split, self.accountant.info, self._latest_run, 0.0)
            self.history.add(split, self.accountant.info, t_wall)
        if per:
            self._log.info("energy_downtime_unattributed", joules={d: round(j, 3) for d, j in per.items()})

    # ---- one accounting pass -------------------------------------------------------------------------------
    async def account(self) -> None:
        """Read usage and the process table off the loop, then :meth:`apply` (logs, never raises). Without
        a RAPL package only the GPUs' processes, their ancestors and the processes charged so far are read
        (a few ``/proc/PID/stat`` instead of the whole process table)."""
        assert self.accountant is not None
        try:
            usage = []
            for backend in self.gpus:
                usage.extend(await backend.ausage())
            table = self.accountant.table
            if CPU in self._known:  # the package's joules are shared by CPU time: every process counts
                cpu = await asyncio.to_thread(table.scan)
            else:  # GPUs alone: who holds them (and their ancestors), and whether those charged still run
                pids = {p.pid for u in usage for p in u.processes or ()}
                pids.update(pid for u in usage for pid in u.utilization or {})
                pids.update(k[0] for k, r in self.accountant.ledger.processes.items() if r.alive)
                cpu = await asyncio.to_thread(table.scan, pids)
            self.apply(usage, cpu)
        except Exception as exc:  # noqa: BLE001 - accounting never takes the daemon down
            self._log.warning("accounting_failed", error=f"{type(exc).__name__}: {exc}")

    async def settle(self, timeout_s: float = SETTLE_S) -> None:
        """One accounting pass up to the latest snapshot, now (after the one in flight, if any), waited for
        at most ``timeout_s`` s: a window stopped as its command ends gets its scope's share of the seconds
        since the last pass (attack8 T6: a 4 s job under ``aithermctl energy`` had none). Never raises."""
        if self.accountant is None or not self._known or self._latest is None:
            return
        loop = asyncio.get_running_loop()
        deadline = loop.time() + timeout_s
        if self._task is not None and not self._task.done():
            await asyncio.wait({self._task}, timeout=timeout_s)
        if self._task is None or self._task.done():
            self._task = loop.create_task(self.account())
            if self._latest is not None:
                self._next_pass = self._latest.t_mono + self.interval_s
        await asyncio.wait({self._task}, timeout=max(0.0, deadline - loop.time()))

    def apply(self, usage: Sequence[Any], cpu: dict[Any, float]) -> None:
        """Account the energy pending since the last pass (up to the latest snapshot)."""
        if self.accountant is None or self._latest is None:
            return
        t_wall = self._latest.t_wall
        (joules, self._pending), (dt, self._pending_s) = (self._pending, {}), (self._pending_s, 0.0)
        self._accounted_until = t_wall
        identities = {d.id: (d.info.get("uuid") or None) for d in self._latest.devices}
        learn, self._slept = not self._slept, False
        per_scope = self.accountant.account(t_wall, dt, joules, usage, cpu, identities, self.windows.scopes(),
                                            t_run=self._latest_run, learn=learn)
        self.windows.add_scoped(per_scope, accounted_device)
        for split in self.accountant.last_splits.values():
            self.history.add(split, self.accountant.info, t_wall)
        self.history.trim()
        self.exporter.update(self._latest_run, self.accountant.last_splits.values(), self.accountant.info,
                             self.accountant.ledger.devices, self.accountant.last_usage, self._known,
                             self._uuids)
        self._processes_text = None

    def report(self, since_wall: float, by: str) -> dict[str, Any]:
        """The energy history report (:meth:`~aithermd.accounting.history.EnergyHistory.report`)."""
        return self.history.report(since_wall, by, cost_per_kwh=self.cost_per_kwh, currency=self.currency)

    def gpu_uids(self, device: str) -> frozenset[int] | None:
        """The uids running on GPU ``device`` now (:meth:`Accountant.gpu_uids`); None without accounting."""
        return None if self.accountant is None else self.accountant.gpu_uids(device)

    def processes_document(self) -> dict[str, Any]:
        """``GetProcesses``: per GPU its processes now; the processes with the most energy; totals per
        unit, job and container; per device the total, idle and unattributed joules."""
        acc = self.accountant
        if acc is None:
            return {"enabled": False, "gpus": {}, "processes": [], "groups": {}, "devices": {}}
        return {"enabled": True, "t_wall": self._accounted_until, "interval_s": self.interval_s,
                "gpus": acc.gpu_document(), "processes": acc.process_document(),
                "groups": acc.ledger.group_document(),
                "devices": {d: {k: round(v, 3) for k, v in t.items()} for d, t in
                            sorted(acc.ledger.devices.items())}}

    def processes_text(self) -> str | None:
        """:meth:`processes_document` as JSON, built once per pass; None without accounting."""
        if self.accountant is None:
            return None
        if self._processes_text is None:
            self._processes_text = json.dumps(self.processes_document(), separators=(",", ":"))
        return self._processes_text

    # ---- state -----------------------------------------------------------------------------------------
    def state(self) -> dict[str, Any]:
        return {"format": FORMAT, "points": points_to_json(self.meter.points()),
                "windows": self.windows.to_json(), "accounted_until": self._accounted_until,
                "pending": dict(self._pending), "pending_s": self._pending_s,
                "floors": self.accountant.floors_json() if self.accountant is not None else {}}

    def save(self) -> None:
        """Write the state files now (atomically); a failure is logged, never raised. Counter points, window
        sums and the joules not yet accounted are saved together, so they agree after a restart."""
        self._last_save = self.clock.monotonic()
        self.windows.changed = False
        if self.state_dir is None:
            return
        self._write(STATE_FILE, self.state())
        if self.accountant is not None:
            self._write(HISTORY_FILE, self.history.to_json(), HISTORY_MAX_BYTES)

    def _write(self, name: str, data: dict[str, Any], limit: int = MAX_STATE_BYTES) -> None:
        assert self.state_dir is not None
        path = self.state_dir / name
        tmp = path.with_name(f".{name}.{os.getpid()}.tmp")
        text = json.dumps(data, separators=(",", ":"))
        while len(text) > limit and self.history.drop_oldest_day():  # the history's size bound in bytes
            text = json.dumps(self.history.to_json(), separators=(",", ":"))
        try:
            with open(tmp, "w", encoding="utf-8") as f:
                f.write(text)
                f.flush()
                os.fsync(f.fileno())
            os.replace(tmp, path)
        except OSError as exc:
            self._log.warning("energy_state_not_saved", path=str(path), error=str(exc))

    def stop(self) -> None:
        """Stop listening and save; a pass still running is cancelled (its interval is accounted after the
        restart)."""
        detach, self._detach = getattr(self, "_detach", None), None
        if detach is not None:
            detach()
        if self._task is not None and not self._task.done():
            self._task.cancel()
        self.save()

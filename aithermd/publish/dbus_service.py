"""``io.github.aithermd.Daemon1`` on D-Bus: what the daemon knows, for anyone; changes, for the authorized.

Exported at ``/io/github/aithermd/Daemon1`` under the bus name of the same name (``wire``); the
introspection data is ``systemd/io.github.aithermd.Daemon1.xml``. Read side (anyone):

- properties ``Version``, ``ActivePolicy``, ``Holds`` (JSON), ``PolicyStates`` (JSON), ``DegradedDevices``,
  ``DryRun``, with ``PropertiesChanged`` when a published snapshot changes them;
- ``GetSnapshot`` (:mod:`~aithermd.publish.document`; before the first tick it waits for it),
  ``GetHistory`` (:mod:`~aithermd.publish.history`), ``Explain``, ``ListPolicies``, ``GetPolicy`` (from
  the :class:`DaemonControl`);
- ``GetProcesses`` (who uses each GPU; energy per process, unit, Slurm job, container) and
  ``GetEnergyReport`` (the energy history) from the :class:`~aithermd.accounting.service.EnergyService`;
- ``SnapshotUpdated(seq)`` at most once per ``snapshot_interval_s`` (the last one is never dropped), and
  ``Event(kind, json)`` per hub event (drift, fault, hotplug, actuation, ...) and per changed decision
  (kind ``decision``);
- ``StartEnergyWindow``/``StopEnergyWindow`` and the scoped, name-checked, listable forms
  (:mod:`~aithermd.accounting.windows`), for any local user.

Privileged methods go through :mod:`~aithermd.publish.dbus_control`. Entry point: :func:`start`.
"""

import asyncio
import contextlib
import json
import math
from collections.abc import Sequence
from typing import Annotated, Any

import structlog
from dbus_fast import NameFlag, RequestNameReply
from dbus_fast.annotations import DBusBool, DBusDouble, DBusSignature, DBusStr, DBusUInt32, DBusUInt64
from dbus_fast.errors import DBusError
from dbus_fast.service import PropertyAccess, ServiceInterface, dbus_property, method, signal

from aithermd import __version__
from aithermd.accounting.service import EnergyService
from aithermd.accounting.windows import EnergyWindows
from aithermd.clock import Clock
from aithermd.errors import InvalidArgument
from aithermd.model import Event as HubEvent
from aithermd.model import Snapshot
from aithermd.publish import wire
from aithermd.publish.control import DaemonControl
from aithermd.publish.dbus_bus import DEFAULT_MAX_IN_FLIGHT, BusUnavailable, CallTracker, DaemonBus, connect
from aithermd.publish.dbus_control import PrivilegedCalls, mapped_errors
from aithermd.publish.document import DocumentCache, event_signals, hold_document, with_processes
from aithermd.publish.history import History
from aithermd.publish.hub import StateHub
from aithermd.publish.polkit import CHECK_TIMEOUT_S, Authorizer

__all__ = ["BusUnavailable", "Daemon1", "DbusHandle", "start"]

# How long GetSnapshot waits for the first tick's snapshot when the name is owned before it (D-Bus
# activation: the call that started the daemon is the first to read); then it answers what it has.
FIRST_SNAPSHOT_WAIT_S = 15.0

DBusStrList = Annotated[list[str], DBusSignature("as")]
DBusTwoStr = Annotated[list[str], DBusSignature("ss")]
DBusApplied = Annotated[list[Any], DBusSignature("das")]  # SetOverride: the value applied, the warnings


class Daemon1(ServiceInterface):
    """The exported interface (see the module docstring). Built by :func:`start`."""

    def __init__(self, control: DaemonControl, hub: StateHub, tracker: CallTracker,
                 privileged: PrivilegedCalls, authorizer: Authorizer, energy: EnergyService, *,
                 dry_run: bool, snapshot_interval_s: float) -> None:
        super().__init__(wire.INTERFACE)
        self._control, self._hub, self._tracker = control, hub, tracker
        self._priv, self._auth, self._energy, self._windows = privileged, authorizer, energy, energy.windows
        self._dry_run = dry_run
        self._documents = DocumentCache()
        self._history = History(hub)
        self._props: dict[str, Any] = self._properties(hub.latest)
        self._previous: Snapshot | None = hub.latest  # decisions already in force are no news
        self._interval = snapshot_interval_s
        self._last_signal = float("-inf")
        self._pending: asyncio.TimerHandle | None = None
        self.connected = True
        self._first_publish = asyncio.Event()
        if hub.latest is not None:
            self._first_publish.set()

    # ---- read side -------------------------------------------------------------------------------------
    @method()
    async def GetSnapshot(self) -> DBusStr:  # noqa: N802 - D-Bus member names are CamelCase
        if self._hub.latest is None:  # D-Bus activation: the caller that started us waits for the first tick
            with contextlib.suppress(TimeoutError):
                await asyncio.wait_for(self._first_publish.wait(), FIRST_SNAPSHOT_WAIT_S)
        return with_processes(self._documents.text(self._hub.latest), self._energy.processes_text())

    @method()
    async def GetHistory(self, seconds: DBusDouble) -> DBusStr:  # noqa: N802
        with mapped_errors():
            return await self._history.text(seconds)

    @method()
    def Explain(self, knob_id: DBusStr) -> DBusStr:  # noqa: N802
        with mapped_errors():
            return json.dumps(self._control.explain(knob_id), default=str)

    @method()
    def ListPolicies(self) -> DBusStr:  # noqa: N802
        with mapped_errors():
            return json.dumps(self._control.list_policies(), default=str)

    @method()
    def GetPolicy(self, name: DBusStr) -> DBusStr:  # noqa: N802
        with mapped_errors():
            return json.dumps(self._control.get_policy(name), default=str)

    @method()
    def GetProcesses(self) -> DBusStr:  # noqa: N802
        return self._energy.processes_text() or json.dumps(self._energy.processes_document())

    @method()
    def GetEnergyReport(self, since: DBusDouble, by: DBusStr) -> DBusStr:  # noqa: N802
        with mapped_errors():
            if not math.isfinite(since):
                raise InvalidArgument(f"since must be a finite wall-clock time, got {since!r}")
            return json.dumps(self._energy.report(since, by), separators=(",", ":"))

    @method()
    async def StartEnergyWindow(self, name: DBusStr, timeout_s: DBusDouble) -> DBusUInt64:  # noqa: N802
        uid = await self._auth.uid_of(self._tracker.sender())
        with mapped_errors():
            return self._windows.start(name, timeout_s, uid)

    @method()
    async def StopEnergyWindow(self, window_id: DBusUInt64) -> DBusStr:  # noqa: N802
        return await self._stop_window(window_id, "")

    @method()
    async def StartScopedEnergyWindow(self, name: DBusStr, timeout_s: DBusDouble,  # noqa: N802
                                      scope: DBusStr) -> DBusUInt64:
        uid = await self._auth.uid_of(self._tracker.sender())
        with mapped_errors():
            return self._windows.start(name, timeout_s, uid, scope)

    @method()
    async def StopEnergyWindowNamed(self, window_id: DBusUInt64, name: DBusStr) -> DBusStr:  # noqa: N802
        return await self._stop_window(window_id, name)

    async def _stop_window(self, window_id: int, name: str) -> str:
        sender = self._tracker.sender()
        uid = await self._auth.uid_of(sender)
        root = await self._auth.is_root(sender)
        if self._windows.scoped(window_id, uid, root=root):  # its share up to now, not to the last pass (T6)
            await self._energy.settle()
        with mapped_errors():
            return json.dumps(self._windows.stop(window_id, uid, root=root, name=name))

    @method()
    async def ListEnergyWindows(self) -> DBusStr:  # noqa: N802
        sender = self._tracker.sender()
        uid = await self._auth.uid_of(sender)
        root = await self._auth.is_root(sender)
        return json.dumps(self._windows.list(uid, root=root))

    # ---- privileged --------------------------------------------------------------------------------------
    @method()
    async def SetActivePolicy(self, name: DBusStr):  # noqa: N802
        await self._priv.set_active_policy(self._tracker.sender(), name)

    @method()
    async def HoldPolicy(self, policy: DBusStr, reason: DBusStr, timeout_s: DBusDouble,  # noqa: N802
                         detached: DBusBool) -> DBusUInt32:
        return await self._priv.hold_policy(self._tracker.sender(), policy, reason, timeout_s, detached)

    @method()
    async def ReleasePolicy(self, cookie: DBusUInt32):  # noqa: N802
        await self._priv.release_policy(self._tracker.sender(), cookie)

    @method()
    async def SetOverride(self, knob_id: DBusStr, value: DBusDouble,  # noqa: N802
                          seconds: DBusDouble) -> DBusApplied:
        return list(await self._priv.set_override(self._tracker.sender(), knob_id, value, seconds))

    @method()
    async def ClearOverride(self, knob_id: DBusStr):  # noqa: N802
        await self._priv.clear_override(self._tracker.sender(), knob_id)

    @method()
    async def ReportProgress(self, gpus: DBusStrList, rate: DBusDouble):  # noqa: N802
        await self._priv.report_progress(self._tracker.sender(), gpus, rate)

    @method()
    async def Reload(self):  # noqa: N802
        await self._priv.reload(self._tracker.sender())

    @method()
    async def ReleaseGpu(self, device_id: DBusStr) -> DBusStr:  # noqa: N802
        return await self._priv.release_gpu(self._tracker.sender(), device_id)

    # ---- properties and signals --------------------------------------------------------------------------
    @dbus_property(access=PropertyAccess.READ)
    def Version(self) -> DBusStr:  # noqa: N802
        return self._props["Version"]

    @dbus_property(access=PropertyAccess.READ)
    def ActivePolicy(self) -> DBusStr:  # noqa: N802
        return self._props["ActivePolicy"]

    @dbus_property(access=PropertyAccess.READ)
    def Holds(self) -> DBusStr:  # noqa: N802
        return self._props["Holds"]

    @dbus_property(access=PropertyAccess.READ)
    def PolicyStates(self) -> DBusStr:  # noqa: N802
        return self._props["PolicyStates"]

    @dbus_property(access=PropertyAccess.READ)
    def DegradedDevices(self) -> DBusStrList:  # noqa: N802
        return self._props["DegradedDevices"]

    @dbus_property(access=PropertyAccess.READ)
    def DryRun(self) -> DBusBool:  # noqa: N802
        return self._props["DryRun"]

    @signal()
    def SnapshotUpdated(self, seq: int) -> DBusUInt64:  # noqa: N802
        return seq

    @signal()
    def Event(self, kind: str, data: str) -> DBusTwoStr:  # noqa: N802
        return [kind, data]

    def _properties(self, s: Snapshot | None) -> dict[str, Any]:
        policy = s.policy if s is not None else None
        return {
            "Version": __version__,
            "ActivePolicy": policy.active if policy else "",
            "Holds": json.dumps([hold_document(h) for h in policy.holds] if policy else []),
            "PolicyStates": json.dumps(policy.states if policy else {}, default=dict),
            "DegradedDevices": list(s.degraded) if s is not None else [],
            "DryRun": bool(self._dry_run or (s.dry_run if s is not None else False)),
        }

    def on_publish(self, snapshot: Snapshot, events: Sequence[HubEvent]) -> None:
        """Hub listener: PropertiesChanged, Event signals and the rate-limited SnapshotUpdated."""
        self._first_publish.set()
        if not self.connected:
            return
        props = self._properties(snapshot)
        changed = {k: v for k, v in props.items() if self._props.get(k) != v}
        self._props = props
        if changed:
            self.emit_properties_changed(changed)
        for kind, body in event_signals(self._previous, snapshot, events):
            self.Event(kind, json.dumps(body, default=str, separators=(",", ":")))
        self._previous = snapshot
        self._snapshot_signal()

    def _snapshot_signal(self) -> None:
        loop = asyncio.get_running_loop()
        wait = self._last_signal + self._interval - loop.time()
        if wait <= 0:
            self._emit_snapshot_updated()
        elif self._pending is None:
            self._pending = loop.call_later(wait, self._emit_snapshot_updated)

    def _emit_snapshot_updated(self) -> None:
        self._pending = None
        latest = self._hub.latest
        if latest is not None and self.connected:
            self._last_signal = asyncio.get_running_loop().time()
            self.SnapshotUpdated(latest.seq)

    def close(self) -> None:
        self.connected = False
        if self._pending is not None:
            self._pending.cancel()
            self._pending = None


class DbusHandle:
    """A running service: ``bus`` (None for ``--bus none``), ``interface``, ``windows``; ``await stop()``."""

    def __init__(self, bus: DaemonBus | None = None, interface: Daemon1 | None = None,
                 tracker: CallTracker | None = None, windows: EnergyWindows | None = None,
                 removers: Sequence[Any] = ()) -> None:
        self.bus, self.interface, self.tracker, self.windows = bus, interface, tracker, windows
        self._removers = list(removers)
        self._watch = asyncio.ensure_future(self._watch_bus(bus)) if bus is not None else None

    async def _watch_bus(self, bus: DaemonBus) -> None:
        """Note when the bus goes away under us (dbus-daemon restarted or died); the daemon's
        :class:`~aithermd.publish.dbus_keeper.DbusKeeper` reports it and connects again."""
        try:  # shielded: cancelling this watcher must not cancel the bus's own disconnect future
            await asyncio.shield(bus.wait_for_disconnect())
            error = None
        except Exception as exc:  # noqa: BLE001 - how it ended is only reported
            error = f"{type(exc).__name__}: {exc}"
        if self.bus is bus:  # not our own stop()
            structlog.get_logger("aithermd.dbus").debug("dbus_connection_closed", error=error)

    @property
    def unique_name(self) -> str | None:
        return self.bus.unique_name if self.bus is not None else None

    async def stop(self) -> None:
        """Release the name and disconnect; safe to call twice."""
        for remove in self._removers:
            remove()
        self._removers = []
        if self.interface is not None:
            self.interface.close()
        bus, self.bus = self.bus, None
        if self._watch is not None:
            self._watch.cancel()
            self._watch = None
        if bus is None or not bus.connected:
            return
        if self.tracker is not None:
            self.tracker.uninstall()
        try:
            await asyncio.wait_for(bus.release_name(wire.BUS_NAME), 2.0)
        except (DBusError, OSError, TimeoutError, EOFError):
            pass
        bus.unexport(wire.OBJECT_PATH)
        bus.disconnect()
        try:
            await asyncio.wait_for(asyncio.shield(bus.wait_for_disconnect()), 2.0)
        except Exception:  # noqa: BLE001 - the socket is gone either way
            pass


async def start(bus: str, control: DaemonControl, hub: StateHub, *, dry_run: bool = False,
                root_uids: Sequence[int] = (0,), clock: Clock | None = None,
                max_in_flight: int = DEFAULT_MAX_IN_FLIGHT, snapshot_interval_s: float = 1.0,
                energy_per_uid: int = 8, energy: EnergyService | None = None,
                polkit_timeout_s: float = CHECK_TIMEOUT_S) -> DbusHandle:
    """Export ``io.github.aithermd.Daemon1`` on ``bus`` (``"system"``, ``"session"``, ``"none"`` or a D-Bus
    address) and own its name. ``"none"`` returns an idle handle. ``energy``: the daemon's energy service
    (its windows persist); without one, a private one fed from ``hub`` (windows end with the service).
    ``polkit_timeout_s``: how long (s, real time) a polkit check may stay unanswered before the caller is
    refused (:mod:`~aithermd.publish.polkit`).

    Raises :class:`~aithermd.publish.dbus_bus.BusUnavailable` when the bus cannot be reached or the name is
    owned by another process (the daemon logs it as a warning and runs on without D-Bus).
    """
    if bus.strip().lower() == "none":
        return DbusHandle()
    conn = await connect(bus)
    log = structlog.get_logger("aithermd.dbus")
    try:
        tracker = CallTracker(conn, max_in_flight=max_in_flight)
        await tracker.install()
        authorizer = Authorizer(conn, root_uids=root_uids, check_timeout_s=polkit_timeout_s,
                                interactive=tracker.interactive)
        privileged = PrivilegedCalls(conn, control, hub, authorizer, tracker)
        own_energy = energy is None
        if energy is None:
            energy = EnergyService(clock, per_uid=energy_per_uid)
            if hub.latest is not None:
                energy.on_publish(hub.latest)
        privileged.gpu_uids = energy.gpu_uids
        interface = Daemon1(control, hub, tracker, privileged, authorizer, energy, dry_run=dry_run,
                            snapshot_interval_s=snapshot_interval_s)
        conn.export(wire.OBJECT_PATH, interface)
        reply = await conn.request_name(wire.BUS_NAME, NameFlag.DO_NOT_QUEUE)
        if reply not in (RequestNameReply.PRIMARY_OWNER, RequestNameReply.ALREADY_OWNER):
            raise BusUnavailable(f"{wire.BUS_NAME} is owned by another process ({reply.name}): "
                                 f"is another aithermd running?")
    except BusUnavailable:
        conn.disconnect()
        raise
    except Exception as exc:
        conn.disconnect()
        raise BusUnavailable(f"cannot export {wire.BUS_NAME} on the {bus} bus: {exc}") from exc
    # a connection that ends (the bus restarted, or the daemon stops) ends every caller's connection with
    # it: their non-detached holds end too, whatever unique names the next bus hands out
    removers = [hub.add_listener(interface.on_publish), privileged.connection_ended]
    if own_energy:
        removers.append(hub.add_listener(energy.on_publish))
    log.info("dbus_ready", bus=bus, unique_name=conn.unique_name, name=wire.BUS_NAME)
    return DbusHandle(conn, interface, tracker, energy.windows, removers)

"""The privileged side of ``io.github.aithermd.Daemon1``: authorize the caller, validate, then act.

Every method takes the caller's unique name (from :meth:`aithermd.publish.dbus_bus.CallTracker.sender`),
asks :class:`~aithermd.publish.polkit.Authorizer` for the method's polkit action (root always passes), then
validates the arguments and calls :class:`~aithermd.publish.control.DaemonControl`. A refused caller gets
``io.github.aithermd.Error.NotAuthorized``; a bad argument a named error (:func:`dbus_error`); in both cases
nothing changes. Holds of non-detached callers end when the caller leaves the bus (``NameOwnerChanged``),
as power-profiles-daemon does with its profile holds.
"""

from __future__ import annotations

import asyncio
import math
import unicodedata
from collections.abc import Callable, Iterator
from contextlib import contextmanager

import structlog
from dbus_fast import MessageType
from dbus_fast.errors import DBusError

from aithermd import errors
from aithermd.accounting import windows as energy
from aithermd.publish import wire
from aithermd.publish.control import DaemonControl
from aithermd.publish.dbus_bus import CallTracker, DaemonBus, bus_daemon_message
from aithermd.publish.hub import StateHub
from aithermd.publish.polkit import Authorizer
from aithermd.runtime.control import clamp_request, range_text  # noqa: F401 - range_text: its old home

_FAILED = "org.freedesktop.DBus.Error.Failed"
_ERRORS: tuple[tuple[type[Exception], str], ...] = (
    (errors.UnknownPolicy, wire.ERROR_UNKNOWN_POLICY),
    (errors.UnknownKnob, wire.ERROR_UNKNOWN_KNOB),
    (errors.UnknownCookie, wire.ERROR_UNKNOWN_COOKIE),
    (errors.OutOfRange, wire.ERROR_OUT_OF_RANGE),
    (errors.PolicyErrors, wire.ERROR_POLICY_INVALID),
    (errors.PolicyError, wire.ERROR_POLICY_INVALID),
    (energy.UnknownWindow, wire.ERROR_UNKNOWN_WINDOW),
    (energy.WrongWindow, wire.ERROR_WRONG_WINDOW),
    (energy.WindowLimit, wire.ERROR_LIMIT_EXCEEDED),
    (energy.NotOwner, wire.ERROR_NOT_AUTHORIZED),
    (errors.LimitExceeded, wire.ERROR_LIMIT_EXCEEDED),
    (errors.StateNotSaved, wire.ERROR_STATE_NOT_SAVED),
    (errors.Busy, wire.ERROR_BUSY),
    (errors.InvalidArgument, wire.ERROR_INVALID_ARGUMENT),
)
MAX_TEXT = 1024
MAX_DURATION_S = 365 * 86_400.0  # holds and overrides; 0 already means "until released/cleared"


def dbus_error(exc: Exception) -> DBusError:
    """The D-Bus error for one of the daemon's exceptions (``io.github.aithermd.Error.*`` names in
    :mod:`~aithermd.publish.wire`; anything else ``org.freedesktop.DBus.Error.Failed``)."""
    for cls, name in _ERRORS:
        if isinstance(exc, cls):
            return DBusError(name, str(exc) or cls.__name__)
    return DBusError(_FAILED, f"{type(exc).__name__}: {exc}")


@contextmanager
def mapped_errors() -> Iterator[None]:
    """Re-raise the daemon's own errors as D-Bus errors (DBusError passes through)."""
    try:
        yield
    except DBusError:
        raise
    except errors.AithermError as exc:
        raise dbus_error(exc) from exc


def _finite(name: str, value: float, *, minimum: float | None = None) -> None:
    if not math.isfinite(value) or (minimum is not None and value < minimum):
        bound = f" ≥ {minimum:g}" if minimum is not None else ""
        raise errors.InvalidArgument(f"{name} must be a finite number{bound}, got {value!r}")


def _duration(name: str, value: float) -> None:
    _finite(name, value, minimum=0.0)
    if value > MAX_DURATION_S:
        raise errors.InvalidArgument(f"{name} {value:g} s is more than a year ({MAX_DURATION_S:.0f} s); give "
                                     "less, or 0 for no end")


def _text(name: str, value: str, *, empty_ok: bool = True) -> None:
    if len(value) > MAX_TEXT:
        raise errors.InvalidArgument(f"{name} longer than {MAX_TEXT} characters")
    if any(unicodedata.category(ch) == "Cc" for ch in value):
        # shown to every user by aithermctl status and the TUI: an escape sequence would drive their terminal
        raise errors.InvalidArgument(f"{name} must not contain control characters")
    if not empty_ok and not value.strip():
        raise errors.InvalidArgument(f"{name} must not be empty")


class PrivilegedCalls:
    """The authorized methods; each takes the caller's unique name first (see the module docstring)."""

    def __init__(self, bus: DaemonBus, control: DaemonControl, hub: StateHub, authorizer: Authorizer,
                 tracker: CallTracker) -> None:
        self._bus = bus
        self._control = control
        self._hub = hub
        self._auth = authorizer
        self._holders: set[str] = set()  # unique names with non-detached holds
        # GPU id → the uids running on it now (None: not known): who may report a GPU's progress
        self.gpu_uids: Callable[[str], frozenset[int] | None] = lambda _gpu: None
        self._log = structlog.get_logger("aithermd.dbus")
        tracker.on_vanished(self._vanished)

    async def set_active_policy(self, sender: str, name: str) -> None:
        uid = await self._auth.authorize(sender, wire.ACTION_SET_POLICY)
        with mapped_errors():
            _text("policy", name, empty_ok=False)
            self._control.set_active_policy(name)
        self._log.info("set_active_policy", policy=name, sender=sender, uid=uid)

    async def hold_policy(self, sender: str, policy: str, reason: str, timeout_s: float,
                          detached: bool) -> int:
        uid = await self._auth.authorize(sender, wire.ACTION_HOLD_POLICY)
        root = await self._auth.is_root(sender)
        with mapped_errors():
            _text("policy", policy, empty_ok=False)
            _text("reason", reason)
            _duration("timeout_s", timeout_s)
            cookie = self._control.hold_policy(policy, reason, timeout_s, sender, uid, bool(detached),
                                               root=root)
        self._log.info("hold_policy", policy=policy, cookie=cookie, sender=sender, uid=uid, detached=detached)
        if not detached:
            self._holders.add(sender)
            if not await self._still_connected(sender):  # it left before we started watching
                self._vanished(sender)
        return cookie

    async def release_policy(self, sender: str, cookie: int) -> None:
        """A caller ends its own holds; ending another uid's hold is an administrator's act (the
        ``set-policy`` action, ``auth_admin_keep`` in the shipped polkit policy), as logind leaves another
        user's inhibitor alone. The cookie is public (the ``Holds`` property), so it proves nothing."""
        uid = await self._auth.authorize(sender, wire.ACTION_HOLD_POLICY)
        owner = self._control.hold_uid(cookie)
        if owner is not None and owner != uid and not await self._auth.is_root(sender):
            try:
                await self._auth.authorize(sender, wire.ACTION_SET_POLICY)
            except DBusError as exc:
                raise DBusError(wire.ERROR_NOT_AUTHORIZED,
                                f"hold {cookie} belongs to uid {owner}; ending another user's hold needs "
                                f"{wire.ACTION_SET_POLICY} ({exc.text})") from exc
        with mapped_errors():
            self._control.release_policy(cookie, by=uid)
        self._log.info("release_policy", cookie=cookie, sender=sender, uid=uid, owner_uid=owner)

    async def set_override(self, sender: str, knob_id: str, value: float,
                           seconds: float) -> tuple[float, list[str]]:
        """Returns the value applied (a value just outside the knob's constraints is clamped) and the
        warnings that go with it (a fan stopped until cleared)."""
        uid = await self._auth.authorize(sender, wire.ACTION_OVERRIDE)
        with mapped_errors():
            _finite("value", value)
            _duration("seconds", seconds)
            self._check_knob(knob_id, value)
            applied = self._control.set_override(knob_id, value, seconds)
        applied = value if applied is None else float(applied)
        self._log.info("set_override", knob=knob_id, value=applied, requested=value, seconds=seconds,
                       sender=sender, uid=uid)
        return applied, list(self._control.override_warnings(knob_id, applied, seconds))

    async def clear_override(self, sender: str, knob_id: str) -> None:
        await self._auth.authorize(sender, wire.ACTION_OVERRIDE)
        with mapped_errors():
            self._check_knob(knob_id, None)
            self._control.clear_override(knob_id)

    async def report_progress(self, sender: str, gpus: list[str], rate: float) -> None:
        """A progress rate steers the GPU's power limit (the efficient search follows it), and hold-policy
        is every seat user's: so only root, or the uid whose compute processes alone run on each GPU named
        (another user's job there would be steered too), may report."""
        uid = await self._auth.authorize(sender, wire.ACTION_HOLD_POLICY)
        with mapped_errors():
            for gpu in gpus:
                _text("gpu", gpu, empty_ok=False)
            _finite("rate", rate, minimum=0.0)
            others = [g for g in gpus if self.gpu_uids(g) != {uid}]
            if others and not await self._auth.is_root(sender):
                raise DBusError(wire.ERROR_NOT_AUTHORIZED,
                                f"uid {uid} is not the one user computing on {', '.join(others)} (NVML's "
                                "compute processes, read every few seconds): a progress rate steers the "
                                "GPU's power limit, so only root, or the user whose job alone runs there, "
                                "may report it")
            self._control.report_progress(list(gpus), float(rate))

    async def reload(self, sender: str) -> None:
        uid = await self._auth.authorize(sender, wire.ACTION_RELOAD)
        with mapped_errors():  # reading and parsing every policy file: off the event loop, as SIGHUP does
            await asyncio.to_thread(self._control.reload)
        self._log.info("reload", sender=sender, uid=uid)

    async def release_gpu(self, sender: str, device_id: str) -> str:
        """Restore a GPU's originals and stop using it (the override action: it changes knobs)."""
        uid = await self._auth.authorize(sender, wire.ACTION_OVERRIDE)
        with mapped_errors():
            _text("device_id", device_id, empty_ok=False)
            done = await self._control.release_gpu(device_id)
        self._log.info("release_gpu", gpu=device_id, sender=sender, uid=uid)
        return done

    def _check_knob(self, knob_id: str, value: float | None) -> None:
        """UnknownKnob / OutOfRange against the latest snapshot's knob constraints (the control re-checks)."""
        snapshot = self._hub.latest
        if snapshot is None:
            return
        knob = next((k for d in snapshot.devices for k in d.knobs if k.id == knob_id), None)
        if knob is None:
            raise errors.UnknownKnob(f"no knob {knob_id!r}")
        if value is None:
            return
        if not knob.writable:
            raise errors.InvalidArgument(f"{knob_id} is read-only: {knob.why_not or 'not writable'}")
        clamp_request(knob, value)

    async def _still_connected(self, name: str) -> bool:
        reply = await self._bus.call(bus_daemon_message("NameHasOwner", "s", [name]))
        return reply.message_type is not MessageType.ERROR and bool(reply.body[0])

    def connection_ended(self) -> None:
        """The daemon's connection to this bus ended: every holder's connection ended with it (a unique
        name means nothing on the next bus), so their non-detached holds end."""
        for name in sorted(self._holders):
            self._vanished(name)

    def _vanished(self, name: str) -> None:
        self._auth.forget(name)
        if name in self._holders:
            self._holders.discard(name)
            self._log.info("holder_left", owner=name)
            try:
                self._control.release_owner(name)
            except Exception:  # never let a control bug break the bus's message handling
                self._log.exception("release_owner_failed", owner=name)

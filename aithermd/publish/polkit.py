"""Who may change things: root always, everyone else through polkit.

- The caller's uid comes from the bus daemon (``org.freedesktop.DBus.GetConnectionUnixUser``, D-Bus
  specification), cached per unique name until that name leaves the bus (a unique name is never reused).
- Non-root callers are checked with ``org.freedesktop.PolicyKit1.Authority.CheckAuthorization`` on the same
  bus, subject ``("system-bus-name", {"name": <sender>})``, one action per method family (``wire.ACTION_*``)
  (polkit reference manual, "org.freedesktop.PolicyKit1.Authority").
- polkit may ask the user for a password (flag ``AllowUserInteraction``) only when the caller's own message
  allows it (header flag ``ALLOW_INTERACTIVE_AUTHORIZATION``, D-Bus specification; aithermctl sets it on
  the methods that change something), as systemd and power-profiles-daemon do: a script, a Slurm prolog or
  any caller that did not ask for a prompt never gets one. When polkit would have asked, such a caller is
  answered ``org.freedesktop.DBus.Error.InteractiveAuthorizationRequired`` (call again with the flag).
- A refusal, a dismissed prompt or an unreachable polkit all raise ``io.github.aithermd.Error.NotAuthorized``
  before anything changes.
- A check polkit leaves unanswered (the caller's own authentication agent sitting on a prompt) is answered
  NotAuthorized after ``check_timeout_s`` (20 s: under the system bus's 25-s reply timeout, so the caller
  hears why) and cancelled (``CancelCheckAuthorization``). Every pending check holds one of the replies the
  bus lets this connection await (128 on the system bus), so one uid may have at most
  :data:`MAX_PENDING_PER_UID` checks pending (counted until polkit really answers, not only until the
  timeout) and all uids together :data:`MAX_PENDING`: more are refused ``io.github.aithermd.Error.Busy``
  without asking polkit. One user whose agent never answers cannot lock every other user out (attack6 G6);
  root is never asked.
"""

from __future__ import annotations

import asyncio
import itertools
from collections.abc import Callable, Iterable

import structlog
from dbus_fast import Message, MessageFlag, MessageType, Variant
from dbus_fast.aio import MessageBus
from dbus_fast.errors import DBusError

from aithermd.publish import wire
from aithermd.publish.dbus_bus import bus_daemon_message

POLKIT_NAME = "org.freedesktop.PolicyKit1"
POLKIT_PATH = "/org/freedesktop/PolicyKit1/Authority"
POLKIT_INTERFACE = "org.freedesktop.PolicyKit1.Authority"
ALLOW_USER_INTERACTION = 0x1
ERROR_INTERACTIVE_REQUIRED = "org.freedesktop.DBus.Error.InteractiveAuthorizationRequired"  # D-Bus spec
CHECK_TIMEOUT_S = 20.0
MAX_PENDING_PER_UID = 4  # a few commands of one user at once (aithermctl run, a hold, an override)
MAX_PENDING = 64  # half of the replies the system bus lets one connection await


class Authorizer:
    """Decides whether the sender of a call may perform a polkit action.

    ``root_uids``: uids allowed without asking polkit (``{0}``; injectable so a test can treat a caller as
    unprivileged). ``interactive``: whether polkit may ask the user (an authentication agent) for the
    password: a bool, or a callable asked at each check (the daemon passes
    :meth:`~aithermd.publish.dbus_bus.CallTracker.interactive`, the caller's own message flag).
    ``polkit_name``: the bus name of the polkit authority. ``check_timeout_s``: how long a check may stay
    unanswered (s, real time) before the caller is refused.
    """

    def __init__(self, bus: MessageBus, *, root_uids: Iterable[int] = (0,),
                 interactive: bool | Callable[[], bool] = True,
                 polkit_name: str = POLKIT_NAME, check_timeout_s: float = CHECK_TIMEOUT_S) -> None:
        self._bus = bus
        self._timeout_s = check_timeout_s
        self._pending: dict[int, int] = {}  # uid → checks sent to polkit and not answered yet
        self._ids = itertools.count(1)
        self._polkit = polkit_name
        self._root_uids = frozenset(root_uids)
        self._interactive = interactive if callable(interactive) else (lambda: bool(interactive))
        self._uids: dict[str, int] = {}
        self._log = structlog.get_logger("aithermd.polkit")

    def forget(self, sender: str) -> None:
        """``sender`` left the bus: drop its cached uid."""
        self._uids.pop(sender, None)

    async def uid_of(self, sender: str) -> int:
        """The Unix uid of the connection ``sender``. Raises DBusError (NotAuthorized) if the bus cannot
        tell."""
        uid = self._uids.get(sender)
        if uid is not None:
            return uid
        reply = await self._bus.call(bus_daemon_message("GetConnectionUnixUser", "s", [sender]))
        if reply.message_type is MessageType.ERROR:
            raise DBusError(wire.ERROR_NOT_AUTHORIZED, f"cannot tell who {sender} is: {reply.error_name}")
        uid = int(reply.body[0])
        self._uids[sender] = uid
        return uid

    async def is_root(self, sender: str) -> bool:
        return await self.uid_of(sender) in self._root_uids

    async def authorize(self, sender: str, action: str) -> int:
        """Return the caller's uid when ``sender`` may perform ``action``; else raise
        ``DBusError(io.github.aithermd.Error.NotAuthorized)``, or ``DBusError(org.freedesktop.DBus.Error.
        InteractiveAuthorizationRequired)`` when polkit would ask for a password and the call did not allow
        that."""
        uid = await self.uid_of(sender)
        if uid in self._root_uids:
            return uid
        interactive = self._interactive()
        reply = await self._check(sender, uid, action, interactive)
        if reply.message_type is MessageType.ERROR:
            self._log.warning("polkit_unavailable", action=action, sender=sender, error=reply.error_name)
            raise DBusError(wire.ERROR_NOT_AUTHORIZED,
                            f"{action}: polkit could not be asked ({reply.error_name}); only root may "
                            "do this")
        authorized, challenge, _details = reply.body[0]
        if not authorized:
            why = "authentication required" if challenge else "not allowed"
            self._log.info("not_authorized", action=action, sender=sender, uid=uid, challenge=bool(challenge),
                           interactive=interactive)
            if challenge and not interactive:
                raise DBusError(ERROR_INTERACTIVE_REQUIRED,
                                f"{action}: authentication required for uid {uid}, and the call did not "
                                "allow a password prompt; call again allowing interactive authorization "
                                "(aithermctl does, unless --no-ask-password), or as root")
            raise DBusError(wire.ERROR_NOT_AUTHORIZED, f"{action}: {why} for uid {uid}")
        return uid

    def pending(self, uid: int | None = None) -> int:
        """Checks sent to polkit and not answered yet: ``uid``'s, or all."""
        return sum(self._pending.values()) if uid is None else self._pending.get(uid, 0)

    async def _check(self, sender: str, uid: int, action: str, interactive: bool) -> Message:
        """polkit's reply to CheckAuthorization for ``sender``. Raises DBusError: Busy over the caps,
        NotAuthorized when polkit has not answered within the timeout (the check is then cancelled)."""
        if self.pending(uid) >= MAX_PENDING_PER_UID or self.pending() >= MAX_PENDING:
            self._log.warning("polkit_checks_capped", action=action, sender=sender, uid=uid,
                              pending_uid=self.pending(uid), pending=self.pending())
            raise DBusError(wire.ERROR_BUSY,
                            f"{action}: {self.pending(uid)} authorization checks of uid {uid} "
                            f"({self.pending()} in all) are waiting for polkit (an authentication prompt "
                            "not answered?); answer or dismiss it, then try again")
        cancel_id = f"aithermd-{next(self._ids)}"
        subject = ["system-bus-name", {"name": Variant("s", sender)}]
        call = asyncio.ensure_future(self._bus.call(Message(
            destination=self._polkit, path=POLKIT_PATH, interface=POLKIT_INTERFACE,
            member="CheckAuthorization",
            signature="(sa{sv})sa{ss}us",
            body=[subject, action, {}, ALLOW_USER_INTERACTION if interactive else 0, cancel_id])))
        self._pending[uid] = self._pending.get(uid, 0) + 1
        call.add_done_callback(lambda _: self._answered(uid))  # held until polkit answers, whatever we do
        try:
            return await asyncio.wait_for(asyncio.shield(call), self._timeout_s)
        except TimeoutError:
            self._cancel(cancel_id)
            self._log.warning("polkit_timeout", action=action, sender=sender, uid=uid,
                              timeout_s=self._timeout_s)
            raise DBusError(wire.ERROR_NOT_AUTHORIZED,
                            f"{action}: polkit did not answer within {self._timeout_s:g} s (an "
                            f"authentication prompt left unanswered?) for uid {uid}; try again") from None

    def _answered(self, uid: int) -> None:
        left = self._pending.get(uid, 0) - 1
        if left > 0:
            self._pending[uid] = left
        else:
            self._pending.pop(uid, None)

    def _cancel(self, cancel_id: str) -> None:
        """Ask polkit to drop the check (it then answers it with an error, which frees the bus's slot);
        no reply awaited."""
        try:
            sent = self._bus.send(Message(destination=self._polkit, path=POLKIT_PATH,
                                          interface=POLKIT_INTERFACE, member="CancelCheckAuthorization",
                                          signature="s", body=[cancel_id],
                                          flags=MessageFlag.NO_REPLY_EXPECTED))
            sent.add_done_callback(lambda f: f.cancelled() or f.exception())
        except Exception as exc:  # noqa: BLE001 - the timeout answer stands; the bus frees the slot later
            self._log.debug("polkit_cancel_failed", error=str(exc))

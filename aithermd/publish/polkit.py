"""Who may change things: root always, everyone else through polkit.

- The caller's uid comes from the bus daemon (``org.freedesktop.DBus.GetConnectionUnixUser``, D-Bus
  specification), cached per unique name until that name leaves the bus (a unique name is never reused).
- Non-root callers are checked with ``org.freedesktop.PolicyKit1.Authority.CheckAuthorization`` on the same
  bus, subject ``("system-bus-name", {"name": <sender>})``, flag ``AllowUserInteraction`` (polkit reference
  manual, "org.freedesktop.PolicyKit1.Authority"), one action per method family (``wire.ACTION_*``).
- A refusal, a dismissed prompt or an unreachable polkit all raise ``io.github.aithermd.Error.NotAuthorized``
  before anything changes.
"""

from __future__ import annotations

from collections.abc import Iterable

import structlog
from dbus_fast import Message, MessageType, Variant
from dbus_fast.aio import MessageBus
from dbus_fast.errors import DBusError

from aithermd.publish import wire
from aithermd.publish.dbus_bus import bus_daemon_message

POLKIT_NAME = "org.freedesktop.PolicyKit1"
POLKIT_PATH = "/org/freedesktop/PolicyKit1/Authority"
POLKIT_INTERFACE = "org.freedesktop.PolicyKit1.Authority"
ALLOW_USER_INTERACTION = 0x1


class Authorizer:
    """Decides whether the sender of a call may perform a polkit action.

    ``root_uids``: uids allowed without asking polkit (``{0}``; injectable so a test can treat a caller as
    unprivileged). ``interactive``: let polkit ask the user (an authentication agent) for the password.
    ``polkit_name``: the bus name of the polkit authority.
    """

    def __init__(self, bus: MessageBus, *, root_uids: Iterable[int] = (0,), interactive: bool = True,
                 polkit_name: str = POLKIT_NAME) -> None:
        self._bus = bus
        self._polkit = polkit_name
        self._root_uids = frozenset(root_uids)
        self._flags = ALLOW_USER_INTERACTION if interactive else 0
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
        ``DBusError(io.github.aithermd.Error.NotAuthorized)``."""
        uid = await self.uid_of(sender)
        if uid in self._root_uids:
            return uid
        subject = ["system-bus-name", {"name": Variant("s", sender)}]
        reply = await self._bus.call(Message(
            destination=self._polkit, path=POLKIT_PATH, interface=POLKIT_INTERFACE,
            member="CheckAuthorization",
            signature="(sa{sv})sa{ss}us", body=[subject, action, {}, self._flags, ""]))
        if reply.message_type is MessageType.ERROR:
            self._log.warning("polkit_unavailable", action=action, sender=sender, error=reply.error_name)
            raise DBusError(wire.ERROR_NOT_AUTHORIZED,
                            f"{action}: polkit could not be asked ({reply.error_name}); only root may "
                            "do this")
        authorized, challenge, _details = reply.body[0]
        if not authorized:
            why = "authentication required" if challenge else "not allowed"
            self._log.info("not_authorized", action=action, sender=sender, uid=uid)
            raise DBusError(wire.ERROR_NOT_AUTHORIZED, f"{action}: {why} for uid {uid}")
        return uid

"""What can go wrong between aithermctl and aithermd: exceptions that carry a readable line and an exit code.

:class:`~aithermctl.client.DaemonClient` maps D-Bus errors (names in :mod:`aithermd.publish.wire`) and
socket errors to these; the CLI prints ``str(error)`` (one line: what happened and what to do) and exits
with ``error.exit_code``. The TUI shows the same line in place. Dependency-free so ``aithermctl status``
stays fast.
"""

from __future__ import annotations

from aithermd.publish import wire


def bus_label(bus: str) -> str:
    """``"system"`` → "the system bus", ``"session"`` → "the session bus", an address → "the bus at ADDR"."""
    if bus in ("system", "session"):
        return f"the {bus} bus"
    return f"the bus at {bus}"


def start_hint(bus: str) -> str:
    """How to start the daemon on ``bus``."""
    if bus == "system":
        return "systemctl start aithermd"
    return f"aithermd run --bus {bus}"


class ClientError(Exception):
    """A request failed; ``str(error)`` is one line with what to do. ``dbus_name`` is the D-Bus error name
    when the daemon or the bus answered with one."""

    exit_code: int = wire.EXIT_FAILURE

    def __init__(self, message: str, dbus_name: str | None = None) -> None:
        super().__init__(message)
        self.dbus_name = dbus_name


class BusUnreachable(ClientError):
    """No connection to the message bus (socket missing, refused, authentication failed, connection lost)."""

    exit_code = wire.EXIT_NOT_RUNNING

    def __init__(self, bus: str, reason: str) -> None:
        hint = ("is dbus running? try --bus session or --bus ADDRESS" if bus == "system"
                else "check the address; `aithermctl demo` starts a private bus with a simulated daemon")
        super().__init__(f"cannot reach {bus_label(bus)}: {reason} ({hint})")
        self.bus = bus


class DaemonNotRunning(ClientError):
    """The bus is there but nobody owns ``io.github.aithermd.Daemon1`` (or it left while we talked)."""

    exit_code = wire.EXIT_NOT_RUNNING

    def __init__(self, bus: str, reason: str = "", dbus_name: str | None = None) -> None:
        if reason:  # D-Bus activation asked systemd, which could not start it (masked, failed, start limit)
            super().__init__(f"aithermd is not running on {bus_label(bus)}: {reason.rstrip('.')} (see "
                             "systemctl status aithermd and journalctl -u aithermd)", dbus_name)
        else:
            super().__init__(f"aithermd is not running on {bus_label(bus)} (start it: {start_hint(bus)})")
        self.bus = bus


class NoReply(ClientError):
    """The daemon did not answer in time."""

    exit_code = wire.EXIT_FAILURE


class NotAuthorized(ClientError):
    """Polkit (or the bus policy) refused a privileged call. ``action`` is the polkit action id when known."""

    exit_code = wire.EXIT_NOT_AUTHORIZED

    def __init__(self, what: str, detail: str = "", action: str | None = None,
                 dbus_name: str | None = None) -> None:
        who = f"allow {action} in polkit" if action else "allow it in polkit"
        extra = f": {detail}" if detail else ""
        super().__init__(f"not authorized to {what}{extra} (run it with sudo, or ask an administrator to "
                         f"{who})", dbus_name)
        self.action = action


class Rejected(ClientError):
    """The daemon refused the arguments (unknown knob, policy, cookie or window; value out of range)."""

    exit_code = wire.EXIT_USAGE


class DaemonError(ClientError):
    """The daemon failed the request for its own reasons (invalid policy on reload, busy, limits)."""

    exit_code = wire.EXIT_FAILURE


# D-Bus error name → (class, hint appended to the daemon's message)
_REJECTIONS: dict[str, str] = {
    wire.ERROR_UNKNOWN_KNOB: "knob ids: aithermctl explain",
    wire.ERROR_UNKNOWN_POLICY: "policies: aithermctl policy list",
    wire.ERROR_UNKNOWN_COOKIE: "holds: aithermctl status",
    wire.ERROR_UNKNOWN_WINDOW: "the window ended or timed out",
    wire.ERROR_OUT_OF_RANGE: "limits: aithermctl explain KNOB",
    wire.ERROR_INVALID_ARGUMENT: "see aithermctl --help",
}
_FAILURES: dict[str, str] = {
    wire.ERROR_POLICY_INVALID: "fix the file and run aithermctl policy reload; the old policies stay active",
    wire.ERROR_LIMIT_EXCEEDED: "stop a window or hold you no longer need",
    wire.ERROR_BUSY: "try again in a moment",
    wire.ERROR_STATE_NOT_SAVED: "see journalctl -u aithermd; df and mount show the state directory's disk",
}
_NOT_RUNNING = {"org.freedesktop.DBus.Error.ServiceUnknown", "org.freedesktop.DBus.Error.NameHasNoOwner"}
# D-Bus activation that could not start the service: the unit is masked, failed, hit its start limit, or the
# activation helper exited (dbus-daemon passes systemd's error on, or reports the spawn failure itself)
_ACTIVATION_FAILED = ("org.freedesktop.systemd1.", "org.freedesktop.DBus.Error.Spawn.")
_ACCESS = {wire.ERROR_NOT_AUTHORIZED, "org.freedesktop.DBus.Error.AccessDenied",
           "org.freedesktop.DBus.Error.InteractiveAuthorizationRequired"}
_NO_REPLY = {"org.freedesktop.DBus.Error.NoReply", "org.freedesktop.DBus.Error.Timeout",
             "org.freedesktop.DBus.Error.TimedOut"}

# method → (what it does, in words; polkit action)
_WHAT: dict[str, tuple[str, str | None]] = {
    "SetActivePolicy": ("change the active policy", wire.ACTION_SET_POLICY),
    "HoldPolicy": ("hold a policy", wire.ACTION_HOLD_POLICY),
    "ReleasePolicy": ("release a hold", wire.ACTION_HOLD_POLICY),
    "SetOverride": ("override a knob", wire.ACTION_OVERRIDE),
    "ClearOverride": ("clear an override", wire.ACTION_OVERRIDE),
    "Reload": ("reload policies", wire.ACTION_RELOAD),
    "ReleaseGpu": ("release a GPU", wire.ACTION_OVERRIDE),
}


def from_dbus(name: str, text: str, method: str, bus: str) -> ClientError:
    """The exception for D-Bus error ``name`` (message ``text``) returned by ``method`` on ``bus``."""
    text = " ".join((text or "").split())  # one line, whatever the daemon sent
    if name in _NOT_RUNNING:
        return DaemonNotRunning(bus)
    if name.startswith(_ACTIVATION_FAILED):  # e.g. org.freedesktop.systemd1.UnitMasked
        return DaemonNotRunning(bus, text or name, name)
    if name in _ACCESS:
        what, action = _WHAT.get(method, (f"call {method}", None))
        return NotAuthorized(what, text, action, name)
    if name in _NO_REPLY:
        return NoReply(f"aithermd did not answer {method} in time ({text or name}); "
                       "check it with: journalctl -u aithermd", name)
    if name in _REJECTIONS:
        return Rejected(f"{text or name} ({_REJECTIONS[name]})", name)
    if name in _FAILURES:
        return DaemonError(f"{text or name} ({_FAILURES[name]})", name)
    if name == "org.freedesktop.DBus.Error.UnknownMethod":
        return DaemonError(f"this aithermd does not know {method} ({text}); update aithermd to match "
                           "aithermctl", name)
    return DaemonError(f"{method} failed: {text or name}", name)

"""Arguments checked before a call goes on the bus: D-Bus carries no string that is not UTF-8 or holds a
NUL, and no unsigned integer out of its range; dbus-fast would fail half-way and drop the connection."""

from __future__ import annotations

from typing import Any

from aithermctl import errors

_UINT_MAX = {"u": 2**32 - 1, "t": 2**64 - 1}


def check_args(member: str, signature: str, args: tuple[Any, ...]) -> None:
    """Refuse, before anything is sent, an argument D-Bus cannot carry (a string that is not UTF-8 or holds
    a NUL, an unsigned integer out of range): dbus-fast would fail half-way and drop the connection.
    Raises Rejected."""
    for code, arg in zip(_complete_types(signature), args, strict=True):
        if code == "as":
            for item in arg:
                check_args(member, "s", (item,))
            continue
        why = ""
        if code == "s":
            try:
                arg.encode("utf-8")
            except UnicodeEncodeError:
                why = "is not valid UTF-8"
            if "\0" in arg:
                why = "holds a NUL character"
        elif code in _UINT_MAX and not 0 <= arg <= _UINT_MAX[code]:
            why = f"is outside 0–{_UINT_MAX[code]}"
        if why:
            raise errors.Rejected(f"{member}: the argument {_shown(arg)} {why} (see aithermctl --help)")


def _complete_types(signature: str) -> list[str]:
    """``"asd"`` → ``["as", "d"]``: a signature's complete types (arrays, structs, dict entries whole)."""
    out, i = [], 0
    while i < len(signature):
        j, depth = i, 0
        while True:
            c = signature[j]
            depth += c in "({"
            depth -= c in ")}"
            j += 1
            if c != "a" and depth == 0:
                break
        out.append(signature[i:j])
        i = j
    return out


def _shown(arg: Any) -> str:
    """``arg`` for an error line: a command-line string with its undecodable bytes (and NUL) as ``\\xNN``."""
    if not isinstance(arg, str):
        return repr(arg)
    try:
        text = arg.encode("utf-8", "surrogateescape").decode("utf-8", "backslashreplace")
        return "'" + text.replace("\0", "\\x00") + "'"
    except UnicodeEncodeError:
        return ascii(arg)

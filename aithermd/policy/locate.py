"""Map a location in a policy document (a pydantic error ``loc``) to its YAML line, column and dotted key,
and turn pydantic errors into :class:`aithermd.errors.PolicyError` with readable messages and hints.

The walk follows the schema types and the ruamel tree together, so that tags of tagged unions (``kind``
values, condition keys) in a ``loc`` are consumed without moving in the YAML.
"""

from __future__ import annotations

import difflib
import types
import typing
from collections.abc import Sequence
from typing import Any

from pydantic import BaseModel, ValidationError
from pydantic.fields import FieldInfo

from aithermd.errors import PolicyError
from aithermd.policy.schema import BUILTIN_MARGIN_C, CONDITION_TAGS, PolicyDocument, resolve_fields

Loc = Sequence[str | int]


def suggest(word: str, choices: Sequence[str]) -> str | None:
    """``"did you mean 'x'?"`` for the closest choice, or None."""
    close = difflib.get_close_matches(str(word), list(choices), n=1, cutoff=0.6)
    return f"did you mean '{close[0]}'?" if close else None


def _unwrap(tp: Any) -> Any:
    while True:
        origin = typing.get_origin(tp)
        if origin is typing.Annotated:
            tp = typing.get_args(tp)[0]
            continue
        if origin in (typing.Union, types.UnionType):
            args = [a for a in typing.get_args(tp) if a is not type(None)]
            if len(args) == 1:
                tp = args[0]
                continue
        return tp


def _tag_of(member: Any) -> str | None:
    """A union member's tag: ``Tag(...)`` metadata, else its ``kind`` Literal."""
    if typing.get_origin(member) is typing.Annotated:
        for meta in typing.get_args(member)[1:]:
            if type(meta).__name__ == "Tag":
                return meta.tag
        member = typing.get_args(member)[0]
    member = _unwrap(member)
    if isinstance(member, type) and issubclass(member, BaseModel):
        kind = member.model_fields.get("kind")
        if kind is not None:
            args = typing.get_args(kind.annotation)
            return args[0] if args else None
    return None


def _members(tp: Any) -> list[Any]:
    if typing.get_origin(tp) in (typing.Union, types.UnionType):
        return list(typing.get_args(tp))
    return []


def _field(model: type[BaseModel], key: str) -> FieldInfo | None:
    for name, info in model.model_fields.items():
        if (info.alias or name) == key:
            return info
    return None


def field_names(model: type[BaseModel]) -> list[str]:
    return [info.alias or name for name, info in model.model_fields.items()]


class _Walk:
    """Result of walking a loc: the YAML parent and key of the last step, the key path, the model there."""

    def __init__(self) -> None:
        self.parent: Any = None
        self.key: Any = None
        self.parts: list[str] = []
        self.model: type[BaseModel] | None = PolicyDocument  # the model that holds ``key`` (or is at the end)
        self.node: Any = None
        self.complete = True

    @property
    def dotted(self) -> str:
        return "".join(self.parts).lstrip(".")


def walk(tree: Any, loc: Loc) -> _Walk:
    resolve_fields()  # the models' field types, forward references resolved (built lazily, defer_build)
    w = _Walk()
    tp: Any = PolicyDocument
    node = tree
    w.node = tree
    for e in loc:
        tp = _unwrap(tp)
        members = _members(tp)
        if members:
            chosen = next((m for m in members if _tag_of(m) == e), None)
            if chosen is not None:
                tp = chosen
                continue
            tp = next((m for m in members if isinstance(_unwrap(m), type)), members[0])
            tp = _unwrap(tp)
        origin = typing.get_origin(tp)
        if isinstance(tp, type) and issubclass(tp, BaseModel):
            info = _field(tp, str(e))
            w.model = tp
            tp = info.annotation if info is not None else Any
            w.parts.append(f".{e}")
        elif origin in (list, tuple) and isinstance(e, int):
            args = typing.get_args(tp)
            tp = args[e] if origin is tuple and e < len(args) and args[-1] is not Ellipsis else args[0] \
                if args else Any
            w.parts.append(f"[{e}]")
        elif origin is dict:
            if e == "[key]":
                break
            tp = typing.get_args(tp)[1]
            w.parts.append(f".{e}")
        else:
            w.complete = False
            break
        w.parent, w.key = node, e
        if isinstance(node, dict):
            node = node.get(e)
        elif isinstance(node, list) and isinstance(e, int) and 0 <= e < len(node):
            node = node[e]
        else:
            node = None
        w.node = node
    return w


def _pos_of_node(node: Any) -> tuple[int | None, int | None]:
    lc = getattr(node, "lc", None)
    if lc is not None and getattr(lc, "line", None) is not None:
        return lc.line + 1, lc.col + 1
    return None, None


def position(w: _Walk, *, at_key: bool = False) -> tuple[int | None, int | None]:
    parent, key = w.parent, w.key
    lc = getattr(parent, "lc", None)
    try:
        if isinstance(parent, dict) and key in parent and lc is not None:
            line, col = lc.key(key) if at_key else lc.value(key)
            return line + 1, col + 1
        if isinstance(parent, list) and isinstance(key, int) and 0 <= key < len(parent) and lc is not None:
            line, col = lc.item(key)
            return line + 1, col + 1
    except (KeyError, IndexError, TypeError, AttributeError):
        pass
    return _pos_of_node(parent if parent is not None else w.node)


def locate(tree: Any, loc: Loc) -> tuple[int | None, int | None, str]:
    w = walk(tree, loc)
    line, col = position(w)
    return line, col, w.dotted


def error_at(tree: Any, where: str, loc: Loc, message: str, hint: str | None = None,
             *, at_key: bool = False) -> PolicyError:
    w = walk(tree, loc)
    line, col = position(w, at_key=at_key)
    return PolicyError(where, message, line=line, col=col, key=w.dotted or None, hint=hint)


def _lower(msg: str) -> str:
    msg = msg.removeprefix("Value error, ").removeprefix("Assertion failed, ")
    msg = msg.replace("Input should be", "should be")
    return msg[:1].lower() + msg[1:] if msg[:1].isupper() and not msg[1:2].isupper() else msg


def _message(err: dict[str, Any], w: _Walk) -> tuple[str, str | None, bool]:
    """(message, hint, at_key) for one pydantic error."""
    kind, ctx, given = err["type"], err.get("ctx") or {}, err.get("input")
    if kind == "extra_forbidden":
        allowed = field_names(w.model) if w.model else []
        return "unknown key", suggest(str(w.key), allowed), True
    if kind == "missing":
        return "missing required key", None, False
    if kind == "union_tag_invalid":
        expected = [t.strip(" '") for t in str(ctx.get("expected_tags", "")).split(",")]
        return (f"unknown kind '{ctx.get('tag')}' (expected one of: {', '.join(expected)})",
                suggest(str(ctx.get("tag")), expected), False)
    if kind == "union_tag_not_found":
        return f"missing '{str(ctx.get('discriminator', 'kind')).strip(chr(39))}'", None, False
    if kind == "condition_kind":
        hint = None
        if isinstance(given, dict):
            hint = next((h for h in (suggest(str(k), CONDITION_TAGS) for k in given) if h), None)
        return err["msg"], hint, False
    if kind == "literal_error":
        expected = [t.strip(" '") for t in str(ctx.get("expected", "")).replace(" or ", ",").split(",")]
        return (f"'{given}' is not one of: {', '.join(t for t in expected if t)}",
                suggest(str(given), expected), False)
    if kind == "greater_than_equal" and w.dotted == "safety.margin_c":
        return (f"safety can only be made stricter: margin_c must be ≥ {BUILTIN_MARGIN_C:g} "
                "(the built-in margin)", None, False)
    if kind == "string_pattern_mismatch":
        if "24:00" in str(ctx.get("pattern", "")):
            return f"'{given}' is not a time of day HH:MM", None, False
        return (f"'{given}' is not a valid name (letters, digits, '-' and '_', starting with a letter or "
                "digit)", None, False)
    if kind in ("float_parsing", "float_type", "int_parsing", "int_type") and isinstance(given, str):
        return _lower(err["msg"]), _bare_number_hint(str(w.key)), False
    return _lower(err["msg"]), None, False


# a key's unit suffix → how its value is written (a string such as '1m' or '5%' is refused as no number)
_BARE = (("_pct_s", "a rate in %/s is a bare number: 5, not '5%'"),
         ("_s", "seconds are a bare number here: 60 for a minute, not '1m'"),
         ("_pct", "a percentage is a bare number here: 40, not '40%'"),
         ("_c", "degrees Celsius are a bare number: 70, not '70C'"))


def _bare_number_hint(key: str) -> str | None:
    """How to write the value of ``key`` (``min_dwell_s``, ``ramp_up_pct_s``...) when a string was given."""
    return next((hint for suffix, hint in _BARE if key.endswith(suffix)), None)


def errors_from_validation(exc: ValidationError, tree: Any, where: str) -> list[PolicyError]:
    """Every pydantic error as a PolicyError at its YAML position, in file order; a 'missing' error is dropped
    when an unknown key at the same place looks like a misspelling of it."""
    raw = exc.errors(include_url=False)
    items = []
    for err in raw:
        loc = tuple(err["loc"])
        if err["type"] in ("union_tag_invalid", "union_tag_not_found"):
            node = walk(tree, loc).node
            if isinstance(node, dict) and "kind" in node:
                loc = (*loc, "kind")
        w = walk(tree, loc)
        message, hint, at_key = _message(err, w)
        items.append((err, w, message, hint, at_key))
    misspelt = {(tuple(w.parts[:-1]), hint.split("'")[1]) for err, w, _m, hint, _k in items
                if err["type"] == "extra_forbidden" and hint}
    out = []
    for err, w, message, hint, at_key in items:
        if err["type"] == "missing" and (tuple(w.parts[:-1]), str(w.key)) in misspelt:
            continue
        line, col = position(w, at_key=at_key)
        out.append(PolicyError(where, message, line=line, col=col, key=w.dotted or None, hint=hint))
    out.sort(key=lambda e: (e.line or 0, e.col or 0))
    return out

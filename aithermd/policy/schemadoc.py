"""The policy schema reference as Markdown, generated from the JSON Schema (``aithermd schema --markdown``);
``policies/README.md`` embeds it between ``<!-- schema:begin -->`` and ``<!-- schema:end -->``."""

from __future__ import annotations

import json
from typing import Any

BEGIN, END = "<!-- schema:begin -->", "<!-- schema:end -->"


def _type(s: dict[str, Any]) -> str:
    if "$ref" in s:
        name = s["$ref"].rsplit("/", 1)[-1]
        return f"[{name}](#{name.lower()})"
    if "const" in s:
        return f"`{json.dumps(s['const'])}`"
    if "enum" in s:
        return " \\| ".join(f"`{v}`" for v in s["enum"])
    for key in ("oneOf", "anyOf"):
        if key in s:
            parts = [_type(x) for x in s[key] if x.get("type") != "null"]
            return " \\| ".join(dict.fromkeys(parts))
    t = s.get("type")
    if t == "array":
        if "prefixItems" in s:
            return "[" + ", ".join(_type(x) for x in s["prefixItems"]) + "]"
        return f"list of {_type(s.get('items', {}))}"
    if t == "object":
        values = s.get("additionalProperties") or next(iter(s.get("patternProperties", {}).values()), {})
        return f"map of name → {_type(values)}" if values else "mapping"
    if t == "number":
        return "number"
    return str(t or "any")


def _limits(s: dict[str, Any]) -> str:
    out = []
    bounds = (("minimum", "≥"), ("exclusiveMinimum", ">"), ("maximum", "≤"), ("exclusiveMaximum", "<"))
    for key, sym in bounds:
        if key in s:
            out.append(f"{sym} {s[key]:g}")
    if "minItems" in s:
        out.append(f"at least {s['minItems']}")
    if "pattern" in s:
        out.append(f"matches `{s['pattern']}`")
    return ", ".join(out)


def _table(title: str, s: dict[str, Any]) -> list[str]:
    lines = [f"### {title}", ""]
    if s.get("description"):
        lines += [" ".join(s["description"].split()), ""]
    required = set(s.get("required", []))
    lines += ["| key | type | default | notes |", "|---|---|---|---|"]
    for key, prop in s.get("properties", {}).items():
        default = "*required*" if key in required else (
            f"`{json.dumps(prop['default'], ensure_ascii=False)}`" if "default" in prop else "")
        sub = prop.get("anyOf") or prop.get("oneOf") or [prop]
        notes = "; ".join(x for x in (_limits(p) for p in sub) if x)
        desc = prop.get("description", "")
        lines.append(f"| `{key}` | {_type(prop)} | {default} | {' — '.join(x for x in (notes, desc) if x)} |")
    return [*lines, ""]


def markdown(schema: dict[str, Any]) -> str:
    """The reference: the document's keys, then every definition alphabetically."""
    lines = _table("Policy file", schema)
    for name, s in sorted(schema.get("$defs", {}).items()):
        lines += _table(name, s)
    return "\n".join(lines).rstrip() + "\n"


def embed(readme: str, reference: str) -> str:
    """``readme`` with the text between the markers replaced by ``reference``."""
    head, _, rest = readme.partition(BEGIN)
    _, _, tail = rest.partition(END)
    return f"{head}{BEGIN}\n{reference}{END}{tail}"

"""Cross-reference checks run after the schema has parsed a policy: names that must exist, names that must
be unique, curves that must not refer to themselves, and state-machine shapes.

Each problem is ``(loc, message, hint)``; ``loc`` is a path in the document as pydantic would give it, so
:mod:`aithermd.policy.locate` can map it to a line.
"""

from __future__ import annotations

from collections.abc import Iterator
from typing import Any

from aithermd.policy.kinds import (
    AllCondition,
    AnyCondition,
    FanRule,
    MixCurve,
    NotCondition,
    PolicyDocument,
    ScheduleCondition,
    StateCondition,
)

Problem = tuple[tuple[Any, ...], str, str | None]


def _suggest(word: str, choices: list[str]) -> str | None:
    from aithermd.policy.locate import suggest
    return suggest(word, choices)


def walk_conditions(cond: Any, loc: tuple[Any, ...]) -> Iterator[tuple[Any, tuple[Any, ...]]]:
    """Every condition node under ``cond`` (itself included) with its loc (tags included, like pydantic)."""
    if cond is None:
        return
    here = (*loc, cond.TAG)
    yield cond, here
    if isinstance(cond, AllCondition):
        for i, c in enumerate(cond.all):
            yield from walk_conditions(c, (*here, "all", i))
    elif isinstance(cond, AnyCondition):
        for i, c in enumerate(cond.any):
            yield from walk_conditions(c, (*here, "any", i))
    elif isinstance(cond, NotCondition):
        yield from walk_conditions(cond.not_, (*here, "not"))


def all_conditions(doc: PolicyDocument) -> Iterator[tuple[Any, tuple[Any, ...]]]:
    """Every condition node in the document, with its loc."""
    for mname, machine in doc.machines.items():
        for i, st in enumerate(machine.states):
            for key in ("enter", "exit"):
                yield from walk_conditions(getattr(st, key), ("machines", mname, "states", i, key))
    for i, rule in enumerate(doc.rules):
        yield from walk_conditions(rule.when, ("rules", i, rule.kind, "when"))
    for key in ("budget", "quiet"):
        block = getattr(doc, key)
        if isinstance(block, list):
            for i, item in enumerate(block):
                yield from walk_conditions(item.when, (key, i, "when"))
        elif block is not None:
            yield from walk_conditions(block.when, (key, "when"))


def resolve_state(doc: PolicyDocument, ref: str) -> tuple[str, str] | None:
    """``machine.state`` or a bare state name unique across machines → (machine, state), else None."""
    if "." in ref:
        mname, sname = ref.split(".", 1)
        machine = doc.machines.get(mname)
        if machine and any(s.name == sname for s in machine.states):
            return mname, sname
        return None
    hits = [(m, ref) for m, machine in doc.machines.items() if any(s.name == ref for s in machine.states)]
    return hits[0] if len(hits) == 1 else None


def _curve_cycles(doc: PolicyDocument) -> list[Problem]:
    problems: list[Problem] = []
    reported: set[frozenset[str]] = set()
    done: set[str] = set()

    def visit(name: str, stack: list[str]) -> None:
        if name in stack:
            cycle = [*stack[stack.index(name):], name]
            if frozenset(cycle) not in reported:
                reported.add(frozenset(cycle))
                what = "refers to itself" if len(cycle) == 2 else "is part of a cycle"
                problems.append((("curves", cycle[0], "mix", "curves"),
                                 f"curve '{cycle[0]}' {what}: {' → '.join(cycle)}", None))
            return
        if name in done:
            return
        curve = doc.curves.get(name)
        if isinstance(curve, MixCurve):
            for ref in curve.curves:
                visit(ref, [*stack, name])
        done.add(name)

    for name in doc.curves:
        visit(name, [])
    return problems


def check_references(doc: PolicyDocument) -> list[Problem]:
    """Every reference problem in ``doc`` (empty when it is consistent)."""
    problems: list[Problem] = []
    curve_names = list(doc.curves)
    for name, curve in doc.curves.items():
        if isinstance(curve, MixCurve):
            for j, ref in enumerate(curve.curves):
                if ref not in doc.curves:
                    problems.append((("curves", name, "mix", "curves", j), f"no curve named '{ref}'",
                                     _suggest(ref, curve_names)))
    problems += _curve_cycles(doc)

    seen: dict[str, int] = {}
    for i, rule in enumerate(doc.rules):
        if rule.name in seen:
            problems.append((("rules", i, rule.kind, "name"),
                             f"rule name '{rule.name}' is already used by rules[{seen[rule.name]}]", None))
        seen.setdefault(rule.name, i)
        if isinstance(rule, FanRule) and isinstance(rule.curve, str) and rule.curve not in doc.curves:
            problems.append((("rules", i, rule.kind, "curve"), f"no curve named '{rule.curve}'",
                             _suggest(rule.curve, curve_names)))
        if isinstance(rule, FanRule) and isinstance(rule.curve, MixCurve):
            for j, ref in enumerate(rule.curve.curves):
                if ref not in doc.curves:
                    problems.append((("rules", i, rule.kind, "curve", "inline", "mix", "curves", j),
                                     f"no curve named '{ref}'", _suggest(ref, curve_names)))

    for mname, machine in doc.machines.items():
        names: dict[str, int] = {}
        for i, st in enumerate(machine.states):
            loc = ("machines", mname, "states", i)
            if st.name in names:
                problems.append(((*loc, "name"), f"state '{st.name}' appears twice in machine '{mname}'",
                                 None))
            names.setdefault(st.name, i)
            if i == 0 and st.exit is not None:
                problems.append(((*loc, "exit"), "the first state has no state below it to exit to", None))
            if i > 0 and st.enter is None:
                problems.append(((*loc,), f"state '{st.name}' needs 'enter' (the condition that leads to it)",
                                 None))

    all_states = [f"{m}.{s.name}" for m, machine in doc.machines.items() for s in machine.states]
    for cond, loc in all_conditions(doc):
        if isinstance(cond, ScheduleCondition) and isinstance(cond.schedule, str) \
                and cond.schedule not in doc.schedules:
            problems.append(((*loc, "schedule"), f"no schedule named '{cond.schedule}'",
                             _suggest(cond.schedule, list(doc.schedules))
                             or ("define it under 'schedules'" if not doc.schedules else None)))
        if isinstance(cond, StateCondition) and resolve_state(doc, cond.state) is None:
            bare = [s.split(".", 1)[1] for s in all_states]
            if "." not in cond.state and bare.count(cond.state) > 1:
                msg = f"state '{cond.state}' is in several machines: write machine.state"
                hint = None
            else:
                msg = f"no state '{cond.state}'"
                hint = _suggest(cond.state, all_states + bare) or (
                    "define it under 'machines'" if not all_states else None)
            problems.append(((*loc, "state"), msg, hint))
    return problems

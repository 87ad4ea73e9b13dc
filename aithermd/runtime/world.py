"""Everything one tick needs: the devices discovery found and the loaded policies.

A :class:`World` is immutable. The devices come from :mod:`aithermd.backends.registry` (an
:class:`~aithermd.backends.registry.Inventory`); a reload (SIGHUP, D-Bus ``Reload``) builds a new world
aside with :func:`with_policies`, a hotplug rediscovery with :func:`with_inventory`, and the tick swaps it in
at its start. When any policy file is broken the load raises :class:`~aithermd.errors.PolicyErrors` and
the old world stays (all-or-nothing).

:class:`Engine` bundles the policy engine's functions (``aithermd.policy.loader``/``engine``) so tests and
the simulator can inject their own.
"""

from __future__ import annotations

import os
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass, field, replace
from pathlib import Path
from types import MappingProxyType
from typing import Any

from aithermd.backends.base import Backend
from aithermd.backends.registry import Inventory, discover
from aithermd.errors import PolicyError, PolicyErrors
from aithermd.fans.store import FanConfig
from aithermd.model import Device, Knob
from aithermd.runtime import parsed
from aithermd.settings import DaemonSettings, default_policy_dirs


@dataclass(frozen=True)
class Engine:
    """The policy engine's contract: ``load_policies(dirs, strict_permissions=, skip=, parsed=) -> {name:
    Policy}`` (raises PolicyErrors; ``skip``: file paths to leave out; ``parsed``: the documents of earlier
    parses by text digest, :mod:`aithermd.runtime.parsed`), ``evaluate(active, holds, inp, state,
    overrides) -> EngineResult``, ``initial_state(...)``, ``needs_processes(policies) -> bool`` and the
    ``EngineInput`` type."""

    load_policies: Callable[..., Mapping[str, Any]]
    evaluate: Callable[..., Any]
    initial_state: Callable[..., Any]
    needs_processes: Callable[..., bool]
    input_type: Callable[..., Any]

    @classmethod
    def default(cls) -> Engine:
        from aithermd.policy import engine, loader
        return cls(loader.load_policies, engine.evaluate, engine.initial_state, engine.needs_processes,
                   engine.EngineInput)


@dataclass(frozen=True)
class PolicySet:
    """One all-or-nothing load: ``policies`` name → Policy, the ``dirs`` they were loaded from, and whether
    any policy has ``process`` conditions (the tick then lists processes)."""

    policies: Mapping[str, Any]
    dirs: tuple[Path, ...] = ()
    needs_processes: bool = False


@dataclass(frozen=True)
class World:
    """The ``inventory`` (backends, devices, knobs and their owners) and the ``policy_set``. The inventory's
    fields read through: ``backends`` in sample order, ``inline`` (sampled on the event loop) and
    ``threaded`` (NVML: the loop's worker thread), ``devices``, ``knobs`` and ``owner`` (knob id → Knob,
    backend), ``device_owner``; and the policy set's ``policies``, ``policy_dirs``, ``needs_processes``.
    ``fans`` (fan detection and calibration, the admin's names) is applied to every inventory it holds.

    The read-through fields are plain attributes copied at construction (both parts are frozen), not
    properties: a tick reads them ~35 times, and each property was a Python call (issue 22)."""

    inventory: Inventory
    policy_set: PolicySet
    fans: FanConfig = FanConfig()
    backends: tuple[Backend, ...] = field(init=False, repr=False, compare=False)
    inline: tuple[Backend, ...] = field(init=False, repr=False, compare=False)
    threaded: tuple[Backend, ...] = field(init=False, repr=False, compare=False)
    devices: tuple[Device, ...] = field(init=False, repr=False, compare=False)
    knobs: Mapping[str, Knob] = field(init=False, repr=False, compare=False)
    owner: Mapping[str, Backend] = field(init=False, repr=False, compare=False)
    device_owner: Mapping[str, Backend] = field(init=False, repr=False, compare=False)
    policies: Mapping[str, Any] = field(init=False, repr=False, compare=False)
    policy_dirs: tuple[Path, ...] = field(init=False, repr=False, compare=False)
    needs_processes: bool = field(init=False, repr=False, compare=False)

    def __post_init__(self) -> None:
        put = object.__setattr__
        inventory = self.fans.decorate(self.inventory)
        put(self, "inventory", inventory)
        for name in ("backends", "inline", "threaded", "devices", "knobs", "owner", "device_owner"):
            put(self, name, getattr(inventory, name))
        put(self, "policies", self.policy_set.policies)
        put(self, "policy_dirs", self.policy_set.dirs)
        put(self, "needs_processes", self.policy_set.needs_processes)


def policy_dirs(settings: DaemonSettings) -> tuple[Path, ...]:
    return tuple(settings.policy_dirs) if settings.policy_dirs is not None else tuple(default_policy_dirs())


def _load(settings: DaemonSettings, engine: Engine, dirs: Sequence[Path],
          skip: frozenset[str] = frozenset()) -> Mapping[str, Any]:
    """``engine.load_policies`` with the documents parsed at earlier loads (:mod:`aithermd.runtime.parsed`),
    which it then keeps for the next (not with ``--dry-run``)."""
    strict = os.geteuid() == 0
    before = parsed.read(settings.state_dir, strict_permissions=strict)
    found = dict(before)
    policies = None
    if parsed.lean(engine.load_policies):  # the daemon: a miss is parsed in a child, never importing pydantic
        policies = parsed.load_lean(engine.load_policies, dirs, strict_permissions=strict, skip=skip,
                                    found=found)
    if policies is None:
        policies = engine.load_policies(list(dirs), strict_permissions=strict, skip=skip, parsed=found)
    if not settings.dry_run:
        from aithermd.policy.loader import text_digest
        sources = (getattr(p, "source", None) for p in policies.values())
        digests = [text_digest(s) for s in sources if isinstance(s, str)]
        parsed.keep(settings.state_dir, before, found, digests)
    return policies


def load_policy_set(settings: DaemonSettings, engine: Engine) -> tuple[Mapping[str, Any], tuple[Path, ...]]:
    """Load every policy directory all-or-nothing; root refuses files others can write. Raises
    PolicyErrors; also when the set is empty. Blocking (file reads and parsing): off the event loop."""
    dirs = policy_dirs(settings)
    policies = _load(settings, engine, dirs)
    if not policies:
        raise PolicyErrors([PolicyError(":".join(map(str, dirs)) or "(no policy directory)",
                                        "no policy found", hint="give --policy-dir DIR")])
    return MappingProxyType(dict(policies)), dirs


def load_policies(settings: DaemonSettings, engine: Engine) -> PolicySet:
    """:func:`load_policy_set` as a :class:`PolicySet`. Raises PolicyErrors."""
    policies, dirs = load_policy_set(settings, engine)
    return PolicySet(policies, dirs, bool(engine.needs_processes(list(policies.values()))))


def load_policies_at_start(settings: DaemonSettings, engine: Engine) -> tuple[PolicySet, list[PolicyError]]:
    """At start, a broken file beside the policies in use must not keep the daemon from running them: the
    files that fail are left out, and their errors returned for the caller to log (and to refuse the start
    when the active policy is among them). A reload stays all-or-nothing. Raises PolicyErrors when the
    errors name no policy file that can be left out, or nothing valid is left."""
    try:
        return load_policies(settings, engine), []
    except PolicyErrors as exc:
        from aithermd.policy.loader import policy_files

        dirs = policy_dirs(settings)
        broken = {e.path for e in exc.errors}
        if not broken <= {str(p) for p in policy_files(dirs).values()}:
            raise
        policies = _load(settings, engine, dirs, frozenset(broken))
        if not policies:
            raise
        return (PolicySet(MappingProxyType(dict(policies)), dirs,
                          bool(engine.needs_processes(list(policies.values())))), list(exc.errors))


def build_world(settings: DaemonSettings, backends: Sequence[Backend], engine: Engine,
                inventory: Inventory | None = None, fans: FanConfig | None = None) -> World:
    """Discover ``backends`` (unless their ``inventory`` is given) and load the policies. Raises
    PolicyErrors."""
    return World(inventory or discover(backends), load_policies(settings, engine), fans or FanConfig())


def with_policies(world: World, policy_set: PolicySet) -> World:
    """``world`` with another policy set (a reload); the devices stay."""
    return replace(world, policy_set=policy_set)


def with_inventory(world: World, inventory: Inventory) -> World:
    """``world`` with rediscovered devices (hotplug); the policies stay."""
    return replace(world, inventory=inventory)


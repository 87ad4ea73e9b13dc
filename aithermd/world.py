"""Everything one tick needs, built from the settings: backends, devices, knobs, policies.

A :class:`World` is immutable. A reload (SIGHUP, D-Bus ``Reload``) builds a new one aside with
:func:`with_policies` and the loop swaps it in between ticks; when any policy file is broken the build
raises :class:`~aithermd.errors.PolicyErrors` and the old world stays (all-or-nothing).

:class:`Engine` bundles the policy engine's functions (``aithermd.policy.loader``/``engine``) so tests and
the simulator can inject their own.
"""

from __future__ import annotations

import os
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass, replace
from pathlib import Path
from types import MappingProxyType
from typing import Any

import structlog

from aithermd.backends.base import Backend
from aithermd.errors import PolicyError, PolicyErrors
from aithermd.model import Device, Knob
from aithermd.settings import DaemonSettings, default_policy_dirs

THREADED_KINDS = frozenset({"nvml"})


@dataclass(frozen=True)
class Engine:
    """The policy engine's contract: ``load_policies(dirs, strict_permissions=) -> {name: Policy}``
    (raises PolicyErrors), ``evaluate(active, holds, inp, state, overrides) -> EngineResult``,
    ``initial_state(...)``, ``needs_processes(policies) -> bool`` and the ``EngineInput`` type."""

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
class World:
    """``backends`` in sample order; ``inline`` are sampled on the event loop, ``threaded`` (NVML) in the
    loop's worker thread; ``knobs`` and ``owner`` map knob ids to their :class:`Knob` and backend;
    ``policies`` name → Policy; ``policy_dirs`` as loaded."""

    backends: tuple[Backend, ...]
    devices: tuple[Device, ...]
    knobs: Mapping[str, Knob]
    owner: Mapping[str, Backend]
    device_owner: Mapping[str, Backend]
    policies: Mapping[str, Any]
    policy_dirs: tuple[Path, ...] = ()
    needs_processes: bool = False

    @property
    def inline(self) -> tuple[Backend, ...]:
        return tuple(b for b in self.backends if not is_threaded(b))

    @property
    def threaded(self) -> tuple[Backend, ...]:
        return tuple(b for b in self.backends if is_threaded(b))


def is_threaded(backend: Backend) -> bool:
    """True for backends whose calls may block (NVML): they run off the event loop."""
    return getattr(backend, "kind", "") in THREADED_KINDS or bool(getattr(backend, "blocking", False))


def open_backends(settings: DaemonSettings) -> list[Backend]:
    """The machine's backends for ``settings.sysfs_root`` (hwmon, powercap, cpu; NVML when enabled and
    available). Nothing is read yet."""
    from aithermd.inventory import open_backends as open_all
    log = structlog.get_logger("aithermd.world")
    nvml = None
    if settings.nvml:
        try:
            import pynvml  # noqa: F401 - the bindings; the backend decides whether a driver answers

            import aithermd.backends.nvml  # noqa: F401
            nvml = pynvml
        except ImportError as exc:
            log.warning("nvml_unavailable", error=str(exc))
    from aithermd.slow import split_slow  # nvme/drivetemp chips: read in a worker of their own
    return split_slow(open_all(str(settings.sysfs_root), nvml=nvml))


@dataclass(frozen=True)
class Found:
    """What discovery found: devices, knob id → Knob, knob id → backend, device id → backend."""

    devices: tuple[Device, ...]
    knobs: Mapping[str, Knob]
    owner: Mapping[str, Backend]
    device_owner: Mapping[str, Backend]


def discover(backends: Sequence[Backend]) -> Found:
    """Devices of every backend (a backend whose discovery fails is logged and skipped), and the knob
    index. A repeated device id is dropped (the first wins)."""
    log = structlog.get_logger("aithermd.world")
    devices: list[Device] = []
    knobs: dict[str, Knob] = {}
    owner: dict[str, Backend] = {}
    device_owner: dict[str, Backend] = {}
    for backend in backends:
        try:
            found = backend.discover()
        except Exception as exc:  # noqa: BLE001 - one broken family never hides the others
            log.error("fault", device=getattr(backend, "kind", "?"), message=f"discovery failed: {exc}")
            continue
        for device in found:
            if device.id in device_owner:
                log.warning("duplicate_device", device=device.id)
                continue
            device_owner[device.id] = backend
            devices.append(device)
            for knob in device.knobs:
                knobs[knob.id] = knob
                owner[knob.id] = backend
    return Found(tuple(devices), MappingProxyType(knobs), MappingProxyType(owner),
                 MappingProxyType(device_owner))


def policy_dirs(settings: DaemonSettings) -> tuple[Path, ...]:
    return tuple(settings.policy_dirs) if settings.policy_dirs is not None else tuple(default_policy_dirs())


def load_policy_set(settings: DaemonSettings, engine: Engine) -> tuple[Mapping[str, Any], tuple[Path, ...]]:
    """Load every policy directory all-or-nothing; root refuses files others can write. Raises
    PolicyErrors; also when the set is empty or lacks the configured policy."""
    dirs = policy_dirs(settings)
    policies = engine.load_policies(list(dirs), strict_permissions=os.geteuid() == 0)
    if not policies:
        raise PolicyErrors([PolicyError(":".join(map(str, dirs)) or "(no policy directory)",
                                        "no policy found", hint="give --policy-dir DIR")])
    return MappingProxyType(dict(policies)), dirs


def build_world(settings: DaemonSettings, backends: Sequence[Backend], engine: Engine,
                found: Found | None = None) -> World:
    """Discover ``backends`` (unless ``found`` is given) and load the policies. Raises PolicyErrors."""
    found = found or discover(backends)
    policies, dirs = load_policy_set(settings, engine)
    return World(tuple(backends), found.devices, found.knobs, found.owner, found.device_owner, policies, dirs,
                 bool(engine.needs_processes(list(policies.values()))))


def with_policies(world: World, settings: DaemonSettings, engine: Engine) -> World:
    """A new world with freshly loaded policies and the same devices. Raises PolicyErrors (the old world
    is untouched)."""
    policies, dirs = load_policy_set(settings, engine)
    return replace(world, policies=policies, policy_dirs=dirs,
                   needs_processes=bool(engine.needs_processes(list(policies.values()))))

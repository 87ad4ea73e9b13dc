"""The daemon's services beside the tick, started before the first tick and stopped in reverse after the last:
the energy service (windows, attribution, history; always), then the D-Bus service and the Prometheus
exporter when their modules import and their bus or port can be had. A service that cannot start is a
warning and the daemon runs on without it; stopping goes on past one that fails, each within
:data:`STOP_TIMEOUT_S`. ``daemon._services`` holds ``(name, handle)`` pairs, each handle with ``stop()``.
"""

from __future__ import annotations

import asyncio
import importlib
from collections.abc import Sequence
from typing import Any

from aithermd.accounting.service import EnergyService

STOP_TIMEOUT_S = 5.0
START_TIMEOUT_S = 10.0


async def start(daemon: Any, backends: Sequence[Any]) -> None:
    s, log = daemon.settings, daemon._log
    daemon.energy = EnergyService.for_daemon(s, daemon.clock, backends, daemon._processes).attach(daemon.hub)
    daemon._services.append(("energy", daemon.energy))
    if s.bus != "none":
        mod = _module(daemon, "aithermd.publish.dbus_service")
        if mod is not None:
            try:
                handle = await asyncio.wait_for(
                    mod.start(s.bus, daemon.control, daemon.hub, dry_run=s.dry_run, clock=daemon.clock,
                              energy=daemon.energy),
                    START_TIMEOUT_S)
                daemon._services.append(("dbus", handle))
            except Exception as exc:  # noqa: BLE001 - the daemon runs on without a bus
                log.warning("dbus_unavailable", bus=s.bus, error=f"{type(exc).__name__}: {exc}")
    if s.metrics_listen != "none":
        mod = _module(daemon, "aithermd.publish.metrics")
        if mod is not None:
            try:
                daemon._services.append(("metrics", mod.start(s.metrics_listen, daemon.hub, daemon.energy)))
            except Exception as exc:  # noqa: BLE001 - the daemon runs on without metrics
                log.warning("metrics_unavailable", listen=s.metrics_listen,
                            error=f"{type(exc).__name__}: {exc}")


def _module(daemon: Any, name: str) -> Any:
    try:
        return importlib.import_module(name)
    except Exception as exc:  # noqa: BLE001 - a missing or broken service is a warning
        daemon._log.warning("service_unavailable", module=name, error=f"{type(exc).__name__}: {exc}")
        return None


async def stop(daemon: Any) -> None:
    while daemon._services:
        name, handle = daemon._services.pop()
        try:
            result = handle.stop()
            if asyncio.iscoroutine(result):
                await asyncio.wait_for(result, STOP_TIMEOUT_S)
        except Exception as exc:  # noqa: BLE001 - stopping goes on
            daemon._log.warning("service_stop_failed", service=name, error=f"{type(exc).__name__}: {exc}")

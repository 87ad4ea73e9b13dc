"""Changes between ticks, applied to the tick's world and apply path.

- :func:`rediscover`: the backend families a hotplug event names are rediscovered through the registry;
  a knob that vanished is forgotten — journal entry and applier state — only once rediscovery confirms its
  device is gone (a merely *lost* device keeps its journal entry, so its original is restored if it comes
  back); each change is a ``hotplug`` event.
"""

from __future__ import annotations

from typing import Any

import structlog

from aithermd.backends import registry
from aithermd.model import Event
from aithermd.runtime.world import World, with_inventory


async def rediscover(world: World, families: set[str], *, applier: Any, t_wall: float,
                     timeout_s: float = 10.0) -> tuple[World, list[Event]]:
    """Rediscover the backends of ``families`` (``*``: all) off the loop; returns the new world (``world``
    itself when nothing changed) and the ``hotplug`` events. Vanished knobs are forgotten by ``applier``
    (an :class:`~aithermd.actuate.applier.Applier`) and its journal."""
    log = structlog.get_logger("aithermd.hotplug")
    inventory, events = await registry.rediscover(world.inventory, families, t_wall=t_wall,
                                                  timeout_s=timeout_s)
    if inventory is world.inventory:
        return world, events
    for knob_id in [k for k in world.knobs if k not in inventory.knobs]:
        if knob_id not in applier.owned and knob_id not in applier.journal:
            continue
        applier.forget(knob_id)
        try:
            applier.journal.forget(knob_id)
        except Exception as exc:  # noqa: BLE001 - JournalError: the entry stays; 'aithermd restore' reports it
            log.error("fault", subject=knob_id, message=f"cannot forget the journal entry: {exc}")
        events.append(Event("hotplug", t_wall, knob_id, f"{knob_id} forgotten: its device is gone, its "
                            "original cannot be restored", {"action": "forgotten"}))
    for e in events:
        log.info("hotplug", subject=e.subject, message=e.message)
    return with_inventory(world, inventory), events

"""What happens between ticks, applied by the tick at its start (:mod:`aithermd.runtime.inbox`).

- **Reload** (SIGHUP, D-Bus ``Reload``): every policy directory is loaded aside, off the event loop,
  all-or-nothing (:meth:`Changes.load_policies`, which logs each error as FILE:LINE); a set without the
  active policy and without the configured fallback is refused, since nothing (not even the safety layer)
  would run. The tick then swaps the policies in; holds on vanished policies end, a vanished active policy
  falls back to the configured one. The RAPL zones are probed again either way (an ``energy_uj`` made
  readable since start is read from the next sample). Reloads that piled up between two ticks (a burst of
  SIGHUPs, several D-Bus ``Reload`` calls) are one of each kind: only the last SIGHUP is loaded and only the
  last D-Bus set swapped in, since what they hold depends only on the files (attack10 S1: 3000 SIGHUPs were
  2545 loads inside the tick, which stalled 8 s).
- **Hotplug**: the backend families whose udev events settled are rediscovered through
  :func:`aithermd.backends.registry.rediscover`; a knob that vanished is forgotten — journal entry and
  applier state — only once rediscovery confirms its device is gone (a merely *lost* device keeps its
  journal entry, so its original is restored if it comes back); each change is a ``hotplug`` event.
- **Release of a GPU** (``aithermctl gpu release``, or udev removing or unbinding its PCI device): its
  originals restored and the GPU dropped (:mod:`aithermd.runtime.release`); udev adding or binding it back
  lets NVML adopt it again.
- **Suspend and resume** (logind's PrepareForSleep): :meth:`Changes.suspend` pauses the applier at once
  (no write, no hand-back, no drift count: a driver resetting knobs on resume is not a conflict) and waits
  for the writes in flight; a :class:`~aithermd.runtime.inbox.Resume` — PrepareForSleep(false), or no
  resume within ``max_pause_s`` of awake time — re-applies every owned knob to its last decision through
  the one apply path, and one ``sleep`` event says what was rewritten, found in place or did not stick.
"""

from __future__ import annotations

import asyncio
import threading
from collections.abc import Callable, Mapping, Sequence
from typing import Any

import structlog

from aithermd.actuate.readback import levels_of, same_setting, settles_at, trails
from aithermd.actuate.execute import Executor
from aithermd.backends import registry
from aithermd.clock import Clock
from aithermd.errors import PolicyError, PolicyErrors
from aithermd.model import Decision, Event, Layer
from aithermd.runtime.inbox import (
    Events,
    Inbox,
    Message,
    Policies,
    Rediscover,
    Release,
    Reload,
    Resume,
    Unrelease,
)
from aithermd.runtime.world import Engine, PolicySet, World, load_policies, with_inventory, with_policies
from aithermd.units import num

SUSPEND_SETTLE_S = 5.0


class Changes:
    """Applies the inbox's messages for one daemon run. ``settings``: the daemon's (policy directories, the
    configured ``policy``); ``control``: the operator's state; ``max_pause_s``: awake time after a suspend
    with no resume announced after which writing resumes anyway (s); ``resume_timeout_s``: longest wait
    for the threaded knobs' re-apply (s)."""

    def __init__(self, settings: Any, engine: Engine, control: Any, executor: Executor, inbox: Inbox,
                 clock: Clock, *, notifier: Any = None, max_pause_s: float = 120.0,
                 resume_timeout_s: float = 10.0) -> None:
        self.settings, self.engine, self.control = settings, engine, control
        self.executor, self.inbox, self.clock, self.notifier = executor, inbox, clock, notifier
        self.max_pause_s, self.resume_timeout_s = max_pause_s, resume_timeout_s
        self.paused_since: float | None = None
        self.newest: PolicySet | None = None  # the last set loaded, until a tick swapped it in
        self._loading = threading.Lock()  # D-Bus reloads, each on a worker thread
        self._checked: dict[str, tuple[int, int]] = {}  # policy → (policy, devices) last checked
        self._log = structlog.get_logger("aithermd.changes")
        inbox.add_source(self._pause_over)
        from aithermd.runtime.release import Released
        self.released = Released(clock)  # GPUs released on request, adopted again if never unbound
        inbox.add_source(self.released.poll)

    @property
    def paused(self) -> bool:
        return self.paused_since is not None

    # -- reload ------------------------------------------------------------------------------------------
    def load_policies(self, current: PolicySet) -> PolicySet:
        """Load every policy directory aside (blocking: off the loop). Raises PolicyErrors, each error
        logged as FILE:LINE; ``current`` (the running set) is untouched. Framed by sd_notify's
        ``RELOADING=1`` and ``READY=1`` (accepted or refused), as Type=notify-reload expects."""
        if self.notifier is not None:
            self.notifier.reloading()
        try:
            loaded = load_policies(self.settings, self.engine)
            active, fallback = self.control.active, self.settings.policy
            if active not in loaded.policies and fallback not in loaded.policies:
                # nothing to fall back to: without an active policy nothing (not even safety) would run
                gone = [n for n in dict.fromkeys((active, fallback)) if n is not None]
                where = (getattr(current.policies.get(active), "path", None)
                         or ", ".join(map(str, loaded.dirs)))
                raise PolicyErrors([PolicyError(str(where), f"policy {' and '.join(gone)} would be gone: the "
                                                "daemon would have no policy to run",
                                                hint="put the file back, or first make another policy active "
                                                "(aithermctl policy set NAME)")])
        except PolicyErrors as exc:
            for err in exc.errors:
                self._log.error("reload_failed", error=str(err), path=getattr(err, "path", None),
                                line=getattr(err, "line", None))
            self._log.error("reload_refused", errors=len(exc.errors), message="old policies kept")
            raise
        finally:
            if self.notifier is not None:
                self.notifier.reloaded()
        self._log.info("reload", policies=sorted(loaded.policies))
        return loaded

    def reload(self, current: PolicySet) -> None:
        """Load the policies and post them for the next tick (D-Bus ``Reload``: call it off the loop).
        Raises PolicyErrors (nothing changes)."""
        with self._loading:  # one at a time: the set posted last is the one loaded last
            self.newest = self.load_policies(self.newest or current)
            self.inbox.post(Policies(self.newest))

    # -- policies that select nothing here ---------------------------------------------------------------
    @staticmethod
    def selection_warnings(policy: Any, world: World) -> list[str]:
        """Each reference of ``policy`` (a loaded Policy) that selects nothing on this machine: a fan, GPU,
        RAPL zone or sensor that does not exist here (what ``aithermd check --sysfs-root`` reports), as
        ``FILE:LINE:COL: error: KEY: ...`` lines; [] for a policy without a document (a test engine's)."""
        if getattr(policy, "document", None) is None:
            return []
        from aithermd.policy.devicecheck import check_devices, unsourced_fans
        return [err.format() for err in check_devices(policy, world.devices)] + [
            unsourced_message(policy.name, rule, curve, fans)
            for rule, curve, fans in unsourced_fans(policy, world.devices)]

    def warn_unmatched(self, world: World) -> None:
        """Warn once per policy and machine when a policy in force (active or held) selects nothing here:
        at start, after a reload, a policy change or a hold, and after hotplug (after each tick)."""
        holds = self.control.holds
        for name in dict.fromkeys([self.control.active, *(h.policy for h in holds)] if holds
                                  else (self.control.active,)):
            policy = world.policies.get(name)
            if policy is None or self._checked.get(name) == (id(policy), id(world.devices)):
                continue
            self._checked[name] = (id(policy), id(world.devices))
            unsourced = []
            if getattr(policy, "document", None) is not None:
                from aithermd.policy.devicecheck import unsourced_fans
                unsourced = unsourced_fans(policy, world.devices)
            for rule, curve, fans in unsourced:  # its fans can only run at 100 %: say so loudly
                self._log.warning("no_temperature_source", policy=name, rule=rule, curve=curve,
                                  fans=list(fans), message=unsourced_message(name, rule, curve, fans))
            if getattr(policy, "document", None) is not None:
                from aithermd.policy.devicecheck import source_warnings
                for err in source_warnings(policy, world.devices):  # a misspelt or absent sensor
                    self._log.warning("source_matches_nothing", policy=name, error=err.format("warning"),
                                      message="a curve source's pattern matches no sensor on this machine")
            for line in self.selection_warnings(policy, world):
                if "selects no temperature sensor" in line or (unsourced and "matches this source" in line):
                    continue
                if "it can never hold" in line:  # a budget below the devices' lowest limits
                    self._log.warning("budget_cannot_hold", policy=name, error=line,
                                      message="every device it covers is held at its minimum, still above it")
                    continue
                self._log.warning("policy_selects_nothing", policy=name, error=line,
                                  message="this rule does nothing on this machine")

    # -- suspend and resume ------------------------------------------------------------------------------
    async def suspend(self) -> None:
        """PrepareForSleep(true): stop writing now, wait for the writes in flight."""
        if self.paused:
            return
        self.executor.applier.pause()
        self.paused_since = self.clock.monotonic()
        await self.executor.settle(SUSPEND_SETTLE_S)
        self._log.info("suspend", message="writes paused until resume")
        self.inbox.post_events([Event("sleep", self.clock.wall(), "system",
                                      "suspending: writes paused until resume", {"action": "suspend"})])

    async def resume(self) -> None:
        """PrepareForSleep(false): returns once a tick has re-applied every owned knob."""
        await self.inbox.request(Resume("resumed"))

    def _pause_over(self) -> list[Message]:
        since = self.paused_since
        if since is None or self.clock.monotonic() - since <= self.max_pause_s:
            return []
        self._log.warning("resume_assumed", paused_s=round(self.clock.monotonic() - since, 1),
                          message="no PrepareForSleep(false): writing again")
        return [Resume("no resume announced")]

    # -- at the tick's start -----------------------------------------------------------------------------
    def take(self) -> list[tuple[Message, Callable[[], None]]]:
        """What the inbox holds for this tick (:meth:`Inbox.drain`), to hand to :meth:`apply`; mostly
        nothing, and then the tick has no coroutine to run for it."""
        return self.inbox.drain()

    async def apply(self, world: World, decisions: Mapping[str, Decision],
                    drained: list[tuple[Message, Callable[[], None]]] | None = None
                    ) -> tuple[World, list[Event]]:
        """Handle every message of the inbox (or ``drained``, what :meth:`take` returned), in order: the world
        the tick runs with from now on, and the events to publish first. ``decisions``: the last tick's
        (re-applied on resume)."""
        events: list[Event] = []
        items = self.inbox.drain() if drained is None else drained
        last = _last_reloads(items) if len(items) > 1 else None
        superseded: dict[type, list[Callable[[], None]]] = {}
        for i, (message, handled) in enumerate(items):
            kind = type(message)
            if last is not None and i < last.get(kind, -1):
                # a later SIGHUP loads the files as they are then; a later D-Bus set was loaded later
                superseded.setdefault(kind, []).append(handled)
                continue
            try:
                world = await self._one(message, world, decisions, events)
            finally:
                handled()
                if last is not None and last.get(kind) == i and kind in superseded:
                    self._log.info("reloads_coalesced", kind=kind.__name__, superseded=len(superseded[kind]))
                    for done in superseded.pop(kind):
                        done()
        return world, events

    async def _one(self, message: Message, world: World, decisions: Mapping[str, Decision],
                   events: list[Event]) -> World:
        if isinstance(message, Events):
            events += message.events
        elif isinstance(message, Reload):
            world = await self._probe_rapl(world, events)
            try:
                loaded = await asyncio.to_thread(self.load_policies, world.policy_set)
            except PolicyErrors:
                return world  # logged with FILE:LINE; the old policies stay
            world = self._swap(world, loaded)
        elif isinstance(message, Policies):
            world = self._swap(await self._probe_rapl(world, events), message.policy_set)
        elif isinstance(message, Rediscover):
            world, found = await rediscover(world, set(message.families), applier=self.executor.applier,
                                            t_wall=self.clock.wall())
            events += found
        elif isinstance(message, Release):
            world = await self._release(world, message, events, decisions)
        elif isinstance(message, Unrelease):
            self.released.settled(message.bus_id)
            for backend in world.backends:
                unrelease = getattr(backend, "unrelease", None)
                if callable(unrelease):
                    unrelease(message.bus_id)
        elif isinstance(message, Resume):
            events += await self._resume(world, decisions, message.why)
        return world

    async def _release(self, world: World, message: Release, events: list[Event],
                       decisions: Mapping[str, Decision]) -> World:
        from aithermd.runtime.release import gpu_of_bus, release_gpu

        if message.bus_id:  # udev: removed or unbound, as a release on request expects
            self.released.settled(message.bus_id)
        gpu = message.device_id or gpu_of_bus(world, message.bus_id or "")
        if gpu is None:  # udev: a GPU the daemon does not use
            return world
        try:
            # on request only: a udev remove/unbind is the device going away, whatever safety holds
            world, done, sentence = await release_gpu(world, self.executor, gpu, self.clock.wall(),
                                                      decisions if message.device_id else None)
        except Exception as exc:  # noqa: BLE001 - the caller hears it; udev's rediscovery drops it anyway
            if message.device_id is None:
                self._log.warning("release_failed", gpu=gpu, error=f"{type(exc).__name__}: {exc}")
            message.reply.append(exc)
            return world
        events += done
        if message.device_id:
            self.released.add(next((e.data.get("pci_bus_id", "") for e in done
                                    if e.data.get("action") == "released"), ""))
        message.reply.append(sentence)
        return world

    async def _probe_rapl(self, world: World, events: list[Event]) -> World:
        """A reload probes the RAPL zones again, whatever becomes of the policies: an ``energy_uj`` made
        readable since start (a udev rule, a capability), a zone that came back."""
        world, found = await rediscover(world, {"powercap"}, applier=self.executor.applier,
                                        t_wall=self.clock.wall())
        events += found
        return world

    def _swap(self, world: World, loaded: PolicySet) -> World:
        if self.newest is loaded:
            self.newest = None
        self.control.policies_changed(set(loaded.policies), self.settings.policy)
        return with_policies(world, loaded)

    async def _resume(self, world: World, decisions: Mapping[str, Decision], why: str) -> list[Event]:
        applier = self.executor.applier
        applier.resume(self.clock.monotonic())
        self.paused_since = None
        t_wall = self.clock.wall()
        if applier.dry_run:
            return [Event("sleep", t_wall, "system", f"{why}: dry-run, nothing to re-apply",
                          {"action": "resume"})]
        wanted = [(k, dec) for k, dec in decisions.items()
                  if k in applier.owned and k in world.knobs and dec.value is not None
                  and dec.layer != Layer.DEFAULT and k not in applier.stepped_back]
        applied = await self.executor.apply(world, wanted, t_wall=t_wall, budget_s=self.resume_timeout_s)
        if applied.late:  # the tick writes them
            self._log.warning("resume_nvml_late", knobs=applied.late)
        # judged as the applier judged them: what it wrote (its level for a quantised fan), not the decision
        written = {e.subject for e in applied.events if e.kind == "actuation"}
        faulted = {e.subject for e in applied.events if e.kind == "fault"}
        rewritten, in_place, failed = [], [], []
        for r in applied.results:
            knob, backend = world.knobs[r.knob_id], world.owner[r.knob_id]
            if r.after is None or r.knob_id in faulted:
                failed.append(r.knob_id)
            elif r.knob_id not in written:
                in_place.append(r.knob_id)
            elif (same_setting(knob, r.after, settles_at(backend, knob, r.value))
                  or trails(levels_of(backend, knob))):
                rewritten.append(r.knob_id)
            else:
                failed.append(r.knob_id)
        message = (f"{why}: {len(rewritten)} setting(s) re-applied, {len(in_place)} found in place, "
                   f"{len(failed)} did not stick")
        self._log.info("resume", rewritten=rewritten, in_place=in_place, failed=failed)
        return [Event("sleep", t_wall, "system", message, {"action": "resume", "rewritten": rewritten,
                                                           "in_place": in_place, "failed": failed}),
                *applied.events]


async def rediscover(world: World, families: set[str], *, applier: Any, t_wall: float,
                     timeout_s: float = 10.0) -> tuple[World, list[Event]]:
    """Rediscover the backends of ``families`` (``*``: all) off the loop; returns the new world (``world``
    itself when nothing changed) and the ``hotplug`` events. Vanished knobs are forgotten by ``applier``
    (an :class:`~aithermd.actuate.applier.Applier`), but their journal entries stay: a device that comes
    back in this boot (a driver reloaded: a Super I/O keeps its fan registers, as the daemon left them) has
    its true original put back at the stop, not the daemon's own manual duty found when it came back
    (attack6 G9); one that stays away is reported absent by the restore and forgotten after a reboot."""
    log = structlog.get_logger("aithermd.hotplug")
    inventory, events = await registry.rediscover(world.inventory, families, t_wall=t_wall,
                                                  timeout_s=timeout_s)
    if inventory is world.inventory:
        return world, events
    for knob_id in [k for k in world.knobs if k not in inventory.knobs]:
        if knob_id not in applier.owned and knob_id not in applier.journal:
            continue
        applier.forget(knob_id)
        events.append(Event("hotplug", t_wall, knob_id, f"{knob_id} gone with its device: its original stays "
                            "journaled, put back if it returns (else forgotten at the next boot)",
                            {"action": "forgotten"}))
    for knob_id, new in inventory.knobs.items():  # constraints re-read, a knob refused or writable again
        old = world.knobs.get(knob_id)
        if old is not None and (old.min, old.max, old.default, old.writable) != \
                (new.min, new.max, new.default, new.writable):
            events.append(Event("hotplug", t_wall, knob_id, knob_change(old, new), {"action": "changed"}))
    for e in events:
        log.info("hotplug", subject=e.subject, message=e.message)
    return with_inventory(world, inventory), events


def knob_change(old: Any, new: Any) -> str:
    """What changed of a knob (:class:`~aithermd.model.Knob`) at a rediscovery, in words."""
    def span(k: Any) -> str:
        return f"{num(k.min)}–{num(k.max)} {k.unit} (default {num(k.default)} {k.unit})"
    said = [f"{span(old)} → {span(new)}"] if span(old) != span(new) else []
    if new.writable != old.writable:
        said.append("writable again" if new.writable else f"read-only: {new.why_not}")
    return f"{new.id}: " + "; ".join(said)


def unsourced_message(policy: str, rule: str, curve: str, fans: Sequence[str]) -> str:
    """The warning for a fan rule whose curve finds no temperature sensor on the machine."""
    return (f"policy {policy}, rule {rule}: curve {curve} selects no temperature sensor on this machine, so "
            f"its {len(fans)} fan(s) run at 100 %; name a sensor `aithermd sensors` shows, or list "
            "alternatives with first: [...]")


def _last_reloads(items: Sequence[tuple[Message, Any]]) -> dict[type, int] | None:
    """The index of the last Reload and of the last Policies message of ``items``, when one of the two kinds
    comes more than once; else None. Each kind is coalesced on its own: a SIGHUP whose load is refused (a
    file broken meanwhile) must not drop a D-Bus set already loaded and answered "ok" (attack12 RC1)."""
    seen: dict[type, list[int]] = {}
    for i, (m, _) in enumerate(items):
        if isinstance(m, (Reload, Policies)):
            seen.setdefault(type(m), []).append(i)
    return {k: v[-1] for k, v in seen.items()} if any(len(v) > 1 for v in seen.values()) else None

"""A GPU power limit whose read-back fails (attack9 N7): the limit getters and fields answer NOT_SUPPORTED
while the driver still takes the writes. The daemon wrote the limit again every tick, each time with an
``actuation`` (201 writes and events in 200 s for 6 values). Now a value taken is written again at most every
UNREAD_RETRY_S; a safety cut is still written on the tick it is decided, and each new value of it at once.
The whole daemon (engine, executor, applier, NVML backend) over the fake NVML, on the fake clock."""

from __future__ import annotations

import pytest

from aithermd.actuate.applier import UNREAD_RETRY_S, Applier
from aithermd.actuate.journal import Journal
from aithermd.actuate.restore import restore_journal
from aithermd.backends.nvml import NvmlBackend
from aithermd.model import Decision, Layer
from aithermd.runtime.daemon import Daemon
from aithermd.settings import DaemonSettings
from aithermd.sim import fake_nvml_lib as lib
from aithermd.sim.fake_nvml import FakeNvml
from aithermd.watchers.options import WatcherOptions
from tests.support.machines import NVIDIA_SMI, copy_machine

KNOB = "gpu0/power_limit"
RTX3090 = NVIDIA_SMI / "rtx3090-nvidia-smi-q-x-driver-v13.xml"
LIMIT_C = 80.0  # the policy's GPU temperature ceiling: the critical trigger
HOT = f"""\
description: a GPU temperature ceiling, GPU limits at 90 % (written, journaled before the read-back fails)
safety: {{gpu_temp_limit_c: {LIMIT_C:g}}}
rules:
  - name: limit
    kind: gpu_power_limit
    limit: 90%
"""


class UnreadableLimits(FakeNvml):
    """The fake NVML with ``unreadable`` GPUs (by position) whose requested and enforced limits cannot be
    read (fields and getters: NOT_SUPPORTED; a vGPU or a driver in trouble) while their set call works;
    ``sets`` records the mW of each set call on GPU 0."""

    unreadable: set[int]
    sets: list[int]

    def _field(self, gpu, fid):
        if self.gpus.index(gpu) in self.unreadable and fid in (lib.FI_POWER_REQUESTED_LIMIT,
                                                                lib.FI_POWER_CURRENT_LIMIT):
            raise lib.NvmlReturn(lib.NOT_SUPPORTED)
        return super()._field(gpu, fid)

    def _nvmlDeviceSetPowerManagementLimit(self, handle, limit):
        if self.gpus.index(self._dev(handle, "x")) == 0:
            self.sets.append(int(getattr(limit, "value", limit)))
        return super()._nvmlDeviceSetPowerManagementLimit(handle, limit)

    def fail_limits(self, index: int) -> None:
        self.unreadable.add(index)
        for fn in ("nvmlDeviceGetPowerManagementLimit", "nvmlDeviceGetEnforcedPowerLimit"):
            self.inject(fn, index, lib.NOT_SUPPORTED)


@pytest.fixture
def rig(tmp_path, clock):
    root = copy_machine(tmp_path)
    policies = tmp_path / "policies"
    policies.mkdir()
    (policies / "hot.yaml").write_text(HOT)
    fake = UnreadableLimits.from_dumps([RTX3090])
    fake.unreadable, fake.sets = set(), []
    fake.gpus[0].temp_c = LIMIT_C - 20
    backend = NvmlBackend(nvml=fake.bindings(), clock=clock, read_deadline_s=30.0)
    settings = DaemonSettings(sysfs_root=root, state_dir=tmp_path / "state", policy_dirs=[policies],
                              policy="hot", policy_pinned=True, bus="none", metrics_listen="none", nvml=False)
    d = Daemon(settings, clock=clock, backends=[backend], sleep=clock.sleep, watchers=WatcherOptions())
    return fake, d


async def test_a_limit_that_cannot_be_read_back_is_cut_at_once_and_not_rewritten_every_tick(rig, clock):
    fake, d = rig
    ticks: list[tuple] = []  # (seq, decided W, rule, W in force, set calls, actuation events) per tick

    def step():
        snap = d.hub.latest
        dec = snap.decisions.get(KNOB)
        acts = sum(1 for e in d.hub.recent_events() if e.kind == "actuation" and e.subject == KNOB)
        ticks.append((snap.seq, dec.value if dec else None, dec.rule if dec else None,
                      fake.power_limit_w(0), len(fake.sets), acts))
        if snap.seq == 3:
            fake.fail_limits(0)  # from here on the limit cannot be read back; the writes still work
        if snap.seq == 5:
            fake.gpus[0].temp_c = LIMIT_C + 5  # critical from the next sample on
        if snap.seq == 95:  # cool again, a reading that moves: the latch releases and the ramp climbs
            fake.gpus[0].temp_c = LIMIT_C - 15
        if snap.seq > 95:
            fake.gpus[0].temp_c = LIMIT_C - 15 + 0.5 * (snap.seq % 2)
        return snap.seq >= 220

    assert await d.run(until=step) == 0
    cut = [t for t in ticks if t[2] == "safety/critical-temperature"]
    assert cut and cut[0][0] == 6, "the cut is decided on the first critical sample"
    first = cut[0]
    assert first[3] == pytest.approx(first[1]), "and written on that tick, its read-back failing"
    assert first[4] == ticks[4][4] + 1
    held = [t for t in cut if t[1] == first[1]]
    assert len(held) >= 80
    writes = held[-1][4] - ticks[4][4]
    # one write when decided, then one every UNREAD_RETRY_S (the driver may have lost it); was one a tick
    assert writes == 1 + int((len(held) - 1) // UNREAD_RETRY_S)
    assert held[-1][5] - ticks[4][5] == 1, "one actuation for the value taken"
    ramp = [t for t in ticks if t[2] == "safety/release-ramp"]
    values = [t for i, t in enumerate(ramp) if i == 0 or t[1] != ramp[i - 1][1]]
    assert len(values) >= 3, "the ramp's ceiling rose in steps"
    for t in values:  # each new safety value is in force on the tick it is decided
        assert t[3] == pytest.approx(t[1])
    assert ramp[-1][4] - held[-1][4] <= len(values) + int(len(ramp) // UNREAD_RETRY_S)


def test_a_value_taken_unreadable_is_written_again_at_once_after_a_resume(tmp_path):
    """A suspend may lose what the driver took: the resume's re-apply writes it whatever the wait."""
    fake = UnreadableLimits.from_dumps([RTX3090])
    fake.unreadable, fake.sets = set(), []
    backend = NvmlBackend(nvml=fake.bindings(), read_deadline_s=30.0)
    (gpu,) = backend.discover()
    knob = next(k for k in gpu.knobs if k.id == KNOB)
    fake.sets.clear()  # the backend's probe of the knob (it writes the limit in force)
    applier = Applier(Journal(tmp_path))
    cut = Decision(KNOB, 200.0, Layer.SAFETY, "safety/critical-temperature")
    applier.apply(backend, knob, "gpu0", cut, 200.0, backend.read_knob(KNOB), 0.0)  # journaled, read back
    fake.fail_limits(0)
    for t in (1.0, 2.0, 3.0, 4.0):
        applier.apply(backend, knob, "gpu0", cut, 200.0, backend.read_knob(KNOB), t)
    assert fake.sets == [200_000, 200_000], "written, and once more when its read-back failed"
    applier.pause()
    applier.resume(t_mono=1005.0)
    applier.apply(backend, knob, "gpu0", cut, 200.0, backend.read_knob(KNOB), 5.0)
    assert fake.sets == [200_000] * 3


def test_a_limit_unreadable_before_its_first_write_is_journaled_as_the_drivers_default(tmp_path):
    """nvsafe8: the limit cannot be read before the daemon first writes it, so its original could not be
    journaled and the safety cut failed (a ``fault``) on every tick. The driver's default limit (the stock
    state) now stands in, marked ``unread``: the cut is written, and the restore sets the default, saying so."""
    fake = UnreadableLimits.from_dumps([RTX3090])
    fake.unreadable, fake.sets = set(), []
    backend = NvmlBackend(nvml=fake.bindings(), read_deadline_s=30.0)
    (gpu,) = backend.discover()
    knob = next(k for k in gpu.knobs if k.id == KNOB)
    default_mw = fake.gpus[0].default_mw
    assert default_mw and knob.default == default_mw / 1000
    fake.sets.clear()
    fake.fail_limits(0)  # from the start: never read, never journaled by the old code
    journal = Journal(tmp_path)
    applier = Applier(journal)
    cut = Decision(KNOB, 200.0, Layer.SAFETY, "safety/critical-temperature")
    after, events = applier.apply(backend, knob, "gpu0", cut, 200.0, backend.read_knob(KNOB), 1.0)
    assert fake.sets == [200_000], events  # a safety decision is always written
    saved = journal.entries()[KNOB].saved
    assert saved["limit_mw"] == default_mw and "NOT_SUPPORTED" in saved["unread"]
    report = restore_journal(journal, backends=[backend])
    assert report.restored == (KNOB,) and "default" in report.fallbacks[KNOB]
    assert fake.sets[-1] == default_mw and not journal.dirty

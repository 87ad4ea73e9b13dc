"""A write refused permission is not given up (attack4 B5: one NVML_ERROR_NO_PERMISSION across the first
critical-temperature cut made the power limit read-only for the daemon's life, and the GPU trained on at the
maximum the daemon had set, over its trip point). Through the applier and the real NVML backend over the
fake NVML (pynvml bindings, mW, NVML's error codes): a safety cut refused is tried again every tick, with a
``refused`` alarm while it cannot be written, and written once the refusal ends; a policy decision waits a
backoff; a knob that never took a write stays read-only, and a safety decision is still tried on it, with
backoff."""

from __future__ import annotations

import pynvml as E
import pytest

from aithermd.actuate.applier import Applier
from aithermd.actuate.journal import Journal
from aithermd.actuate.refusals import RETRY_S
from aithermd.backends.nvml import NvmlBackend
from aithermd.clock import FakeClock
from aithermd.model import Decision, Layer
from aithermd.sim.fake_nvml import FakeNvml
from tests.backends.nvml.conftest import RTX4090, profile

KNOB = "gpu0/power_limit"
SET = "nvmlDeviceSetPowerManagementLimit"


def decision(value: float, layer: Layer = Layer.POLICY) -> Decision:
    rule = "safety/critical-temperature" if layer is Layer.SAFETY else "ai-training/training-limit"
    return Decision(KNOB, value, layer, rule)


@pytest.fixture
def rig(tmp_path):
    fake = FakeNvml([profile(RTX4090)])
    backend = NvmlBackend(nvml=fake.bindings(), clock=FakeClock())
    backend.discover()
    applier = Applier(Journal(tmp_path))

    def apply(value: float, layer: Layer, t: float):
        backend.take_changes()
        knob = next(k for d in backend.discover() for k in d.knobs if k.id == KNOB)  # the world's view
        return applier.apply(backend, knob, "gpu0", decision(value, layer), knob.clamp(value),
                             backend.read_knob(KNOB), t)

    yield fake, backend, applier, apply
    backend.close()


def sets(fake: FakeNvml) -> int:
    return fake.calls.get(SET, 0)


def test_a_safety_cut_refused_for_a_moment_is_tried_every_tick_with_an_alarm_and_written_after(rig):
    fake, _backend, applier, apply = rig
    apply(400.0, Layer.POLICY, 0.0)  # the daemon's own value
    assert fake.power_limit_w(0) == 400.0
    fake.inject(SET, 0, E.NVML_ERROR_NO_PERMISSION)  # e.g. a GPU being reset, settings locked for a moment
    n = sets(fake)
    _, events = apply(200.0, Layer.SAFETY, 1.0)
    assert [e.kind for e in events] == ["fault"] and "NO_PERMISSION" in events[0].message
    alarm = applier.alarms[KNOB]
    assert alarm.kind == "refused" and "safety/critical-temperature" in alarm.message and "400" in alarm.message
    for t in (2.0, 3.0, 4.0):  # every tick it does not hold, whatever the backoff
        apply(200.0, Layer.SAFETY, t)
    assert sets(fake) == n + 4 and fake.power_limit_w(0) == 400.0
    assert applier.alarms[KNOB].kind == "refused"
    fake.clear_injections()
    after, events = apply(200.0, Layer.SAFETY, 5.0)
    assert fake.power_limit_w(0) == 200.0 and after.value == 200.0
    assert "actuation" in [e.kind for e in events] and KNOB not in applier.alarms


def test_a_policy_decision_refused_waits_a_backoff_and_raises_no_alarm(rig):
    fake, _backend, applier, apply = rig
    apply(400.0, Layer.POLICY, 0.0)
    fake.inject(SET, 0, E.NVML_ERROR_NO_PERMISSION)
    n = sets(fake)
    t, tries = 1.0, []
    while t < 1.0 + 200.0:
        before = sets(fake)
        apply(350.0, Layer.POLICY, t)
        if sets(fake) > before:
            tries.append(t)
        t += 1.0
    gaps = [b - a for a, b in zip(tries, tries[1:], strict=False)]
    assert gaps[:5] == [RETRY_S[0], 2 * RETRY_S[0], 4 * RETRY_S[0], 8 * RETRY_S[0], 16 * RETRY_S[0]]
    assert max(gaps) == RETRY_S[1] and sets(fake) - n == len(tries) < 15, "no write storm"
    assert KNOB not in applier.alarms, "a policy value not written is no safety matter"
    _, events = apply(200.0, Layer.SAFETY, t)  # a safety decision does not wait
    assert sets(fake) - n == len(tries) + 1 and applier.alarms[KNOB].kind == "refused"
    fake.clear_injections()
    apply(350.0, Layer.POLICY, t + RETRY_S[1])
    assert fake.power_limit_w(0) == 350.0 and KNOB not in applier.alarms


def test_a_knob_that_never_took_a_write_stays_read_only_and_a_safety_decision_is_still_tried(rig):
    fake, backend, applier, apply = rig
    fake.privileged = False  # a container without CAP_SYS_ADMIN: NO_PERMISSION even to root
    apply(350.0, Layer.POLICY, 0.0)
    knob = next(k for k in backend.discover()[0].knobs if k.id == KNOB)
    assert not knob.writable and "NO_PERMISSION" in knob.why_not
    n = sets(fake)
    for t in range(1, 11):
        apply(350.0, Layer.POLICY, float(t))
    assert sets(fake) == n, "read-only: a policy decision is not written"
    for t in range(11, 71):
        apply(200.0, Layer.SAFETY, float(t))
    assert 3 <= sets(fake) - n <= 6, "tried with backoff: no storm"
    assert KNOB not in applier.alarms and KNOB not in applier.journal, "never changed: nothing to put back"
    fake.privileged = True
    t = 71.0
    while fake.power_limit_w(0) != 200.0 and t < 200.0:
        apply(200.0, Layer.SAFETY, t)
        t += 1.0
    assert fake.power_limit_w(0) == 200.0 and KNOB in applier.journal, "written, original journaled first"
    assert next(k for k in backend.discover()[0].knobs if k.id == KNOB).writable, "writable again"

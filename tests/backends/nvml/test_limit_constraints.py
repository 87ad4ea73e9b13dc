"""Power-limit constraints that change under the daemon (attack4 B2): a driver reloaded with another VBIOS, a
12VHPWR cable's sense pins; here the RTX 4090's maximum and default drop from 450 W to 400 W and its limit is
reset to them, as NVML reports after such a reload. Through the real pynvml bindings over the fake NVML: the
refused write (NVML_ERROR_INVALID_ARGUMENT for a value inside the constraints known) makes the backend read
them again and clamp to the new ones, said once; the restore puts the original back clamped into the
constraints now, with a note, instead of failing; ``aithermd restore`` on the journal left does the same."""

from __future__ import annotations

import dataclasses

import pytest
import structlog

from aithermd.actuate.journal import Journal
from aithermd.backends.nvml import NvmlBackend
from aithermd.cli import main
from aithermd.errors import OutOfRange
from aithermd.sim.fake_nvml import FakeNvml

from .conftest import RTX4090, profile


def reload_with(fake: FakeNvml, max_w: float, min_w: float | None = None) -> None:
    """GPU 0's driver reloaded: new maximum (and minimum), the default at the maximum, the limit reset to it."""
    g = fake.gpus[0]
    g.profile = dataclasses.replace(g.profile, max_power_limit_w=max_w, default_power_limit_w=max_w,
                                    min_power_limit_w=g.profile.min_power_limit_w if min_w is None else min_w)
    g.limit_mw = int(max_w * 1000)
    fake.save()


def sets(fake: FakeNvml) -> int:
    return fake.calls.get("nvmlDeviceSetPowerManagementLimit", 0)


@pytest.fixture
def gpu(tmp_path):
    fake = FakeNvml([profile(RTX4090)], state_path=tmp_path / "nvml.json")
    backend = NvmlBackend(nvml=fake.bindings())
    backend.discover()
    yield fake, backend
    backend.close()


def test_a_refused_write_inside_the_known_constraints_rereads_them_and_clamps_to_the_new_ones(gpu):
    fake, backend = gpu
    saved = backend.save_knob("gpu0/power_limit")
    backend.write_knob("gpu0/power_limit", 450.0)  # the policy's maximum
    reload_with(fake, 400.0)
    n = sets(fake)
    with structlog.testing.capture_logs() as logs:
        backend.write_knob("gpu0/power_limit", 450.0)  # still the maximum known: refused, re-read, clamped
    assert fake.power_limit_w(0) == 400.0 and sets(fake) == n + 2
    said = [e for e in logs if e["event"] == "power_limit_constraints_changed"]
    assert len(said) == 1 and "450 W" in said[0]["message"] and "150–400 W" in said[0]["message"]
    assert backend.take_changes(), "the runtime rediscovers: the knob has the new constraints"
    knob = next(k for k in backend.discover()[0].knobs if k.id == "gpu0/power_limit")
    assert (knob.min, knob.max, knob.default) == (150.0, 400.0, 400.0)
    with pytest.raises(OutOfRange):  # the stale maximum is no longer inside the knob's constraints
        backend.write_knob("gpu0/power_limit", 450.0)
    assert sets(fake) == n + 2, "refused without an NVML call"
    note = backend.restore_knob("gpu0/power_limit", saved)  # the original 450 W, outside them now
    assert fake.power_limit_w(0) == 400.0 and note and "450 W" in note and "150–400 W" in note
    reload_with(fake, 450.0)
    assert backend.restore_knob("gpu0/power_limit", saved) is None and fake.power_limit_w(0) == 450.0


def test_a_raised_minimum_takes_a_safety_cut_at_the_new_minimum(gpu):
    fake, backend = gpu
    reload_with(fake, 450.0, min_w=250.0)
    backend.write_knob("gpu0/power_limit", 150.0)  # inside the constraints known: the deepest cut now
    assert fake.power_limit_w(0) == 250.0


def test_a_refusal_with_the_same_constraints_is_still_the_drivers_floor(gpu):
    fake, backend = gpu
    fake.gpus[0].limit_refused_below_mw = 200_000  # Dynamic Boost: refuses what its constraints allow
    with structlog.testing.capture_logs() as logs:
        backend.write_knob("gpu0/power_limit", 150.0)
    assert fake.power_limit_w(0) == pytest.approx(200.0, abs=1.0)
    assert [e["event"] for e in logs] == ["power_limit_floor"] and not backend.take_changes()


def test_aithermd_restore_on_the_journal_left_clamps_and_succeeds(gpu, tmp_path, capsys):
    fake, backend = gpu
    state = tmp_path / "state"
    journal = Journal(state)
    journal.record("gpu0/power_limit", "gpu0", backend.locator(), backend.save_knob("gpu0/power_limit"), 1.0)
    backend.write_knob("gpu0/power_limit", 450.0)
    reload_with(fake, 400.0)  # the daemon died before its restore: the journal is left
    backend.close()
    assert main(["restore", "--state-dir", str(state)]) == 0
    out = capsys.readouterr()
    assert "restored 1 knob(s)" in out.out and "150–400 W" in out.out + out.err
    assert FakeNvml.open(tmp_path / "nvml.json").power_limit_w(0) == 400.0
    assert "gpu0/power_limit" not in Journal(state).entries()

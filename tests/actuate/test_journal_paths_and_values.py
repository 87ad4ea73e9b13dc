"""attack6 G3 (the rest): a journal entry's locator root was used as given, and the saved values of knobs
other than pwm were written as found. An entry is now applied only under the daemon's own root or one nobody but
root or this user can write, and a saved value outside the knob's constraints (a power limit outside its
min/max, a fan mode its driver does not know) is refused with a line that says so: nothing written."""

from __future__ import annotations

import json
import os
import shutil

import pytest

from aithermd.actuate.journal import JOURNAL_FILE, Journal
from aithermd.actuate.restore import restore_journal
from aithermd.backends.gpu_hwmon import HwmonGpuBackend
from aithermd.backends.hwmon import HwmonBackend
from aithermd.backends.nvml import NvmlBackend
from aithermd.backends.powercap import RaplBackend
from aithermd.cli import main
from aithermd.sim import ttar
from aithermd.sim.fake_nvml import FakeNvml
from tests.backends.helpers import TTAR
from tests.backends.nvml.conftest import RTX4090, profile
from tests.backends.test_gpu_hwmon import tree
from tests.support.clock import SimClock
from tests.support.machines import crashed_with_fans
from tests.support.proc import knob_files

NCT = "hwmon:nct6798-isa-0290"


def _journal_fans(tmp_path):
    """Two nct6798 fans journaled, then driven at 100 % by a daemon that crashed."""
    return crashed_with_fans(tmp_path)


def _edit(state, change) -> None:
    doc = json.loads((state / JOURNAL_FILE).read_text())
    for entry in doc["entries"]:
        change(entry)
    (state / JOURNAL_FILE).write_text(json.dumps(doc))


def test_an_entry_on_a_root_others_can_write_is_refused_and_kept(tmp_path, capsys):
    root, state, original = _journal_fans(tmp_path)
    taken = knob_files(root)
    os.chmod(root, 0o777)  # anyone could have put a symlink to a root-owned file in place of pwm1
    assert main(["restore", "--state-dir", str(state)]) == 1
    err = capsys.readouterr().err
    assert (f"aithermd restore: error: {NCT}/pwm1: journaled on the sysfs root {root}, which is not this "
            "daemon's and is writable by its group or by every user (mode 0777): refused, nothing "
            "written") in err
    assert f"give --sysfs-root {root} to restore it anyway" in err
    assert knob_files(root) == taken != original and len(Journal(state).entries()) == 2
    os.chmod(root, 0o755)  # no one else can write it: aithermd ran there, its originals go back
    assert main(["restore", "--state-dir", str(state)]) == 0 and knob_files(root) == original


def test_the_admins_root_is_applied_whoever_can_write_it(tmp_path):
    root, state, original = _journal_fans(tmp_path)
    os.chmod(root, 0o777)
    assert main(["restore", "--state-dir", str(state), "--sysfs-root", str(root)]) == 0
    assert knob_files(root) == original
    root2, state2, original2 = _journal_fans(tmp_path / "b")  # the config's root: the daemon's own
    os.chmod(root2, 0o777)
    cfg = tmp_path / "aithermd.yaml"
    cfg.write_text(f"sysfs_root: {root2}\nstate_dir: {state2}\n")
    assert main(["restore", "--config", str(cfg)]) == 0 and knob_files(root2) == original2


def test_the_daemons_own_backends_root_is_its_own(tmp_path):
    root, state, original = _journal_fans(tmp_path)
    os.chmod(root, 0o777)
    backend = HwmonBackend(str(root))
    backend.discover()
    report = restore_journal(Journal(state), backends=[backend])
    assert report.ok and knob_files(root) == original
    backend.close()


def test_a_fan_mode_its_driver_does_not_know_is_not_written(tmp_path, capsys):
    root, state, _ = _journal_fans(tmp_path)
    _edit(state, lambda e: e["saved"].update(enable=9, pwm=200))  # nct6775 modes end at 5 (SmartFan IV)
    assert main(["restore", "--state-dir", str(state)]) == 0
    err = capsys.readouterr().err
    assert f"{NCT}/pwm1: saved enable 9 is no mode nct6798 knows (0–5): not written" in err
    chip = root / "devices" / "platform" / "nct6775.656" / "hwmon" / "hwmon1"
    assert (chip / "pwm1_enable").read_text() == "5\n"  # the driver's automatic mode instead


@pytest.mark.parametrize("bad", ["290000000", -5, 5_000_000_000, True, 1.5])
def test_a_rapl_limit_that_is_no_original_is_refused(tmp_path, bad):
    ttar.extract(TTAR / "node-exporter-sys-class-powercap-intel-rapl.ttar", tmp_path)
    root = tmp_path / "sys"
    backend = RaplBackend(str(root), clock=SimClock())
    backend.discover()
    kid = "powercap:package-0/pl1"
    journal = Journal(tmp_path / "state")
    saved = {"power_limit_uw": bad, "time_window_us": None}
    journal.record(kid, "powercap:package-0", backend.locator(), saved, 0.0)
    backend.write_knob(kid, 65.5)
    report = restore_journal(journal, backends=[backend])
    assert report.failed[kid] == (f"{kid}: saved power_limit_uw {bad!r} is no original of a RAPL limit (an "
                                  "integer from 0 to 4095875000): not written")
    limit = root / "class" / "powercap" / "intel-rapl:0" / "constraint_0_power_limit_uw"
    assert limit.read_text() == "65500000\n" and kid in Journal(tmp_path / "state")
    backend.close()


@pytest.mark.parametrize("bad", [400_000_000, 100_000_000, "290000000", None])
def test_an_amdgpu_cap_outside_its_min_max_is_refused(tmp_path, bad):
    root = tree(tmp_path, "rx7900xtx")  # 261–333 W
    backend = HwmonGpuBackend(str(root))
    backend.discover()
    journal = Journal(tmp_path / "state")
    journal.record("gpu0/power_limit", "gpu0", backend.locator(), {"pci": "0000:03:00.0", "cap_uw": bad}, 0.0)
    backend.write_knob("gpu0/power_limit", 275.0)
    report = restore_journal(journal, backends=[backend])
    assert report.failed["gpu0/power_limit"] == (
        f"gpu0/power_limit: saved cap_uw {bad!r} is outside the limit's constraints (261–333 W): no "
        "original of this knob, not written")
    assert (root / "class" / "hwmon" / "hwmon8" / "power1_cap").read_text() == "275000000\n"
    backend.close()


@pytest.mark.parametrize("bad", ["450000", -1, None, 1.5e5])
def test_an_nvml_limit_that_is_no_number_is_refused(tmp_path, bad):
    fake = FakeNvml([profile(RTX4090)], fan_count=[1])
    backend = NvmlBackend(nvml=fake.bindings())
    backend.discover()
    journal = Journal(tmp_path / "state")
    uuid = backend.save_knob("gpu0/power_limit")["uuid"]
    journal.record("gpu0/power_limit", "gpu0", backend.locator(), {"limit_mw": bad, "uuid": uuid}, 0.0)
    backend.write_knob("gpu0/power_limit", 300.0)
    report = restore_journal(journal, backends=[backend])
    assert report.failed["gpu0/power_limit"] == (
        f"gpu0/power_limit: saved limit_mw {bad!r} is no power limit: not written")
    assert backend.read_knob("gpu0/power_limit").value == 300.0
    backend.close()


def test_a_copy_of_the_tree_elsewhere_is_not_needed(tmp_path):
    """The refusal names no path it did not check: a missing root is left to the backend's open."""
    root, state, _ = _journal_fans(tmp_path)
    shutil.rmtree(root)
    report = restore_journal(Journal(state))
    assert not report.ok and all("refused" not in why for why in report.failed.values())

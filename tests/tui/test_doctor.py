"""doctor's local checks on a sysfs tree built in a temporary directory."""

import os

from aithermctl.doctor import check_nvml, check_sysfs


def _write(path, text=""):
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(text)


def test_sysfs_checks_name_chips_pwm_outputs_and_rapl_zones(tmp_path):
    _write(tmp_path / "class/hwmon/hwmon0/name", "nct6798\n")
    _write(tmp_path / "class/hwmon/hwmon0/pwm1", "128\n")
    _write(tmp_path / "class/hwmon/hwmon0/pwm2", "128\n")
    _write(tmp_path / "class/hwmon/hwmon1/name", "k10temp\n")
    _write(tmp_path / "class/powercap/intel-rapl:0/name", "package-0\n")
    _write(tmp_path / "class/powercap/intel-rapl:0/energy_uj", "123\n")
    _write(tmp_path / "class/powercap/intel-rapl:0/constraint_0_power_limit_uw", "125000000\n")
    checks = {c.what: c for c in check_sysfs(str(tmp_path))}
    assert checks["hwmon k10temp"].detail == "readable; no pwm outputs"
    pwm = checks["hwmon nct6798"]
    if os.geteuid() == 0:
        assert (pwm.level, pwm.detail) == ("ok", "2 pwm outputs, all writable")
    zone = checks["powercap package-0 (intel-rapl:0)"]
    assert zone.level == "ok" and zone.detail.startswith("energy readable")


def test_empty_sysfs_says_what_to_load(tmp_path):
    checks = check_sysfs(str(tmp_path))
    assert [(c.level, c.what) for c in checks] == [("warn", "hwmon"), ("warn", "powercap")]
    assert "sensors-detect" in checks[0].detail and "modprobe intel_rapl_common" in checks[1].detail


def test_nvml_that_cannot_load_is_a_warning_with_the_reason():
    (check,) = check_nvml("libnvidia-ml-does-not-exist.so.1")
    assert check.level == "warn" and "cannot be loaded" in check.detail
    assert "GPUs are not managed" in check.detail


def test_cpu_knobs_say_whether_a_profile_daemon_owns_them(tmp_path):
    from aithermctl.doctor import check_cpu_knobs
    from tests.backends.test_cpu_knobs import with_epp

    root = with_epp(tmp_path)
    (check,) = check_cpu_knobs(str(root))
    assert (check.level, check.what) == ("ok", "cpu knobs")
    assert check.detail.startswith("epp, governor, boost, platform_profile: no profile daemon runs")
    run = tmp_path / "run" / "systemd" / "units"
    run.mkdir(parents=True)
    os.symlink("0123456789abcdef", run / "invocation:power-profiles-daemon.service")
    (check,) = check_cpu_knobs(str(root))
    assert check.level == "warn"
    assert "left to power-profiles-daemon, which runs: aithermd never writes them" in check.detail
    empty = tmp_path / "bare" / "sys"
    empty.mkdir(parents=True)
    assert [c.detail for c in check_cpu_knobs(str(empty))] == ["no EPP, governor, boost or platform_profile in sysfs"]


def test_doctor_knows_the_profile_daemons_the_daemon_knows():
    from aithermctl.doctor import PROFILE_DAEMONS
    from aithermd.backends.cpu_knobs import MANAGERS

    assert PROFILE_DAEMONS == MANAGERS


async def test_doctor_on_another_bus_says_its_local_checks_are_of_this_host(tmp_path, capsys):
    """newuser7 9: against the demo's bus, 'no chips under /sys/class/hwmon' sat beside the simulated
    daemon's '8 devices' with nothing saying whose machine each line was about."""
    from aithermctl.client import DaemonClient
    from aithermctl.doctor import run_doctor

    client = DaemonClient("tcp:host=127.0.0.1,port=9")
    try:
        await run_doctor(client, str(tmp_path))
    finally:
        await client.close()
    out = capsys.readouterr().out
    assert "note  this host" in out and "not of the daemon on the bus at tcp:host=127.0.0.1,port=9" in out
    lines = out.splitlines()
    assert [i for i, line in enumerate(lines) if "this host" in line][0] < \
        [i for i, line in enumerate(lines) if line.split()[1:2] == ["hwmon"]][0]

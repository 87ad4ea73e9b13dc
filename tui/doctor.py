"""``aithermctl doctor``: what can be read and written on this machine, and why not.

Checks the bus, the daemon (and what it reports as read-only or failing), polkit, the NVIDIA management
library, hwmon and powercap in sysfs (kernel hwmon sysfs ABI: ``pwmN`` writable only by root; powercap:
``energy_uj`` readable only by root since CVE-2020-8694), and the CPU's own knobs with the profile daemon
(power-profiles-daemon, tuned) that owns them, if one runs. Each line: ``ok``, ``warn`` or ``FAIL``, what,
and why or what to do. On another bus than the system bus (``aithermctl demo``'s), a ``note`` line says the
local checks are of this host, not of the daemon's (simulated) machine.
"""

from __future__ import annotations

import ctypes
import os
import sys
from dataclasses import dataclass
from pathlib import Path

from aithermctl.client import DaemonClient
from aithermctl.errors import ClientError, bus_label
from aithermd.publish import wire

POLKIT_NAME = "org.freedesktop.PolicyKit1"


@dataclass(frozen=True, slots=True)
class Check:
    level: str  # "ok" | "warn" | "FAIL" | "note"
    what: str
    detail: str


async def check_daemon(client: DaemonClient) -> list[Check]:
    out: list[Check] = []
    try:
        await client.connect()
    except ClientError as exc:
        return [Check("FAIL", "bus", str(exc))]
    out.append(Check("ok", "bus", f"connected to {bus_label(client.bus)}"))
    try:
        if not await client.name_has_owner():
            return [*out, Check("FAIL", "daemon", f"aithermd is not running on {bus_label(client.bus)}")]
        version = await client.get_property("Version")
        doc = await client.get_snapshot()
    except ClientError as exc:
        return [*out, Check("FAIL", "daemon", str(exc))]
    policy = (doc.get("policy") or {}).get("active") or "—"
    dry = " (dry run: it writes nothing)" if doc.get("dry_run") else ""
    out.append(Check("ok", "daemon", f"aithermd {version}, policy {policy}, "
                                     f"{len(doc.get('devices') or ())} devices{dry}"))
    for device in doc.get("devices") or ():
        for knob in device.get("knobs") or ():
            if not knob.get("writable", True):
                why = knob.get("why_not") or "no reason given"
                out.append(Check("warn", knob["id"], f"read-only: {why}"))
        for ch in device.get("channels") or ():
            if ch.get("status") not in (None, "ok", "not_supported"):
                out.append(Check("warn", ch["id"], f"reads {ch.get('status')}"))
    for item in doc.get("degraded") or ():
        out.append(Check("warn", item, "degraded (the daemon stopped trusting it)"))
    return out


async def check_polkit(client: DaemonClient, actions_dir: str = "/usr/share/polkit-1/actions") -> list[Check]:
    out = []
    if os.geteuid() == 0:
        out.append(Check("ok", "authorization", "you are root: every change is allowed"))
    else:
        probe = client if client.bus == "system" else DaemonClient("system", timeout_s=3.0)
        try:
            running = await probe.name_has_owner(POLKIT_NAME)
        except ClientError:
            running = False
        finally:
            if probe is not client:
                await probe.close()
        if running:
            out.append(Check("ok", "polkit", "running: changes ask polkit (actions io.github.aithermd.*)"))
        else:
            out.append(Check("warn", "polkit", "not running on the system bus: only root can change "
                                               "anything (apt install polkitd)"))
    policy_file = Path(actions_dir) / "io.github.aithermd.policy"
    if policy_file.exists():
        out.append(Check("ok", "polkit actions", str(policy_file)))
    else:
        out.append(Check("warn", "polkit actions", f"{policy_file} is missing: non-root callers are refused "
                                                   "(install the aithermd package)"))
    return out


def check_nvml(library: str = "libnvidia-ml.so.1", dev_root: str = "/dev") -> list[Check]:
    try:
        ctypes.CDLL(library)
    except OSError as exc:
        return [Check("warn", "NVML", f"{library} cannot be loaded ({exc}); no NVIDIA driver: GPUs are not "
                                      "managed")]
    nodes = sorted(p.name for p in Path(dev_root).glob("nvidia[0-9]*"))
    return [Check("ok", "NVML", f"{library} loads; device nodes: {', '.join(nodes) or 'none'}")]


def _writable(path: Path) -> bool:
    return path.exists() and os.access(path, os.W_OK)


def check_sysfs(sysfs_root: str = "/sys") -> list[Check]:
    out = []
    hwmon = sorted(Path(sysfs_root, "class", "hwmon").glob("hwmon*"))
    if not hwmon:
        out.append(Check("warn", "hwmon", f"no chips under {Path(sysfs_root, 'class', 'hwmon')}: load the "
                                          "sensor drivers (sensors-detect)"))
    for chip in hwmon:
        name = _read(chip / "name") or chip.name
        pwms = sorted(p for p in chip.glob("pwm[0-9]") if p.is_file())
        if not pwms:
            out.append(Check("ok", f"hwmon {name}", "readable; no pwm outputs"))
            continue
        writable = [p.name for p in pwms if _writable(p)]
        if len(writable) == len(pwms):
            out.append(Check("ok", f"hwmon {name}", f"{len(pwms)} pwm outputs, all writable"))
        else:
            why = "needs root" if os.geteuid() != 0 else "the driver refuses writes"
            out.append(Check("warn", f"hwmon {name}", f"{len(writable)} of {len(pwms)} pwm outputs writable "
                                                      f"here ({why}; the daemon runs as root)"))
    zones = sorted(Path(sysfs_root, "class", "powercap").glob("*:*"))
    if not zones:
        out.append(Check("warn", "powercap", "no RAPL zones: modprobe intel_rapl_common (Intel and AMD Zen)"))
    for zone in zones:
        name = _read(zone / "name") or zone.name
        energy = zone / "energy_uj"
        readable = energy.exists() and os.access(energy, os.R_OK) and _read(energy) is not None
        limit = zone / "constraint_0_power_limit_uw"
        parts = ["energy readable" if readable else "energy_uj root-only (CVE-2020-8694)"]
        if limit.exists():
            parts.append("PL1 writable" if _writable(limit) else "PL1 read-only here")
        out.append(Check("ok" if readable else "warn", f"powercap {name} ({zone.name})", ", ".join(parts)))
    return out


# the profile daemons that own the CPU's knobs while they run, as aithermd's cpufreq backend finds them:
# systemd's invocation link of the running unit, or tuned's pid file (paths under /run)
PROFILE_DAEMONS = (("power-profiles-daemon", "systemd/units/invocation:power-profiles-daemon.service"),
                   ("tuned-ppd", "systemd/units/invocation:tuned-ppd.service"),
                   ("tuned", "systemd/units/invocation:tuned.service"),
                   ("tuned", "tuned/tuned.pid"))


def check_cpu_knobs(sysfs_root: str = "/sys") -> list[Check]:
    """The CPU's EPP, governor, boost and platform_profile: which this machine has, and whether a profile
    daemon (power-profiles-daemon, tuned) owns them — then aithermd leaves them alone rather than fight it.
    ``/run`` is the ``run`` beside ``sysfs_root`` (``/run`` for ``/sys``)."""
    root = Path(sysfs_root)
    run = root.resolve().parent / "run"
    cpu = root / "devices" / "system" / "cpu"
    policies = sorted(cpu.glob("cpufreq/policy*")) or sorted(cpu.glob("cpu[0-9]*/cpufreq"))
    has = {"epp": any((p / "energy_performance_preference").exists() for p in policies),
           "governor": any((p / "scaling_governor").exists() for p in policies),
           "boost": (cpu / "intel_pstate" / "no_turbo").exists() or (cpu / "cpufreq" / "boost").exists(),
           "platform_profile": (root / "firmware" / "acpi" / "platform_profile").exists()}
    names = ", ".join(k for k, v in has.items() if v)
    if not names:
        return [Check("ok", "cpu knobs", "no EPP, governor, boost or platform_profile in sysfs")]
    managers = list(dict.fromkeys(n for n, rel in PROFILE_DAEMONS if os.path.lexists(run / rel)))
    if managers:
        return [Check("warn", "cpu knobs", f"{names}: left to {' and '.join(managers)}, which runs: aithermd "
                                           "never writes them (switch its profile, or stop it to let "
                                           "policies drive them)")]
    return [Check("ok", "cpu knobs", f"{names}: no profile daemon runs; policies may drive them "
                                     "(kind: cpu_knobs)")]


def _read(path: Path) -> str | None:
    try:
        return path.read_text().strip()
    except OSError:
        return None


async def run_doctor(client: DaemonClient, sysfs_root: str = "/sys") -> int:
    checks = await check_daemon(client)
    checks += await check_polkit(client)
    if client.bus != "system":  # a demo's private bus: its daemon's machine is simulated, not this one
        checks.append(Check("note", "this host", f"the checks below are of the machine aithermctl runs on, "
                                                 f"not of the daemon on {bus_label(client.bus)} (a demo's "
                                                 "simulated machine is not checked here)"))
    checks += check_nvml()
    checks += check_sysfs(sysfs_root)
    checks += check_cpu_knobs(sysfs_root)
    width = max(len(c.what) for c in checks)
    for c in checks:
        sys.stdout.write(f"{c.level:<4}  {c.what:<{width}}  {c.detail}\n")
    sys.stdout.flush()
    return wire.EXIT_FAILURE if any(c.level == "FAIL" for c in checks) else wire.EXIT_OK

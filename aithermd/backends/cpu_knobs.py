"""The CPU's own power knobs beside RAPL: EPP, the cpufreq governor, boost, and ACPI ``platform_profile``.

Sources: the kernel's cpufreq, intel_pstate and amd-pstate documentation (admin-guide/pm/cpufreq.rst,
intel_pstate.rst, amd-pstate.rst) and the ACPI platform profile ABI (ABI/testing/sysfs-platform_profile);
the recorded intel_pstate policy trees of prometheus/procfs and node_exporter.

Knobs (enumerated: the value is an index into ``Knob.choices``, the names are the kernel's):

- ``cpufreq/epp``: ``cpufreq/policy*/energy_performance_preference``, choices the policy's
  ``energy_performance_available_preferences`` in the kernel's order (performance first, power last),
  ``default`` left out (it is only ever put back); written to every policy. intel_pstate refuses EPP with
  EBUSY while the governor is ``performance``;
- ``cpufreq/governor``: ``scaling_governor`` of every policy, choices ``scaling_available_governors``;
- ``cpufreq/boost``: 0 off, 1 on — ``intel_pstate/no_turbo`` (inverted), else ``cpufreq/boost`` (acpi-cpufreq,
  amd-pstate);
- ``acpi/platform_profile``: ``firmware/acpi/platform_profile``, choices ``platform_profile_choices``.

A knob reads the first policy (every policy is written alike); a numeric EPP (intel_pstate shows the raw
value when one was written) reads as the nearest named preference (performance 0, balance_performance 128,
balance_power 192, power 255: intel_pstate.rst). Saved states hold the kernel's text per file, so a restore
puts back exactly what was found, ``default`` included.

power-profiles-daemon and tuned own these knobs when they run (:func:`profile_managers`): then every knob is
read-only with ``why_not`` naming the owner, and aithermd never writes them (``aithermd doctor`` says so).
"""

from __future__ import annotations

import errno
import os
from dataclasses import dataclass
from typing import Any

from aithermd.backends.ids import natural_key
from aithermd.backends.sysfs import Attribute, SysfsIO, read_optional_text, why_not_writable, write_error
from aithermd.clock import Clock, RealClock
from aithermd.errors import BackendError, NoPermission, OutOfRange, UnknownKnob
from aithermd.model import Device, DeviceKind, Knob, KnobKind, KnobValue, Sample, Status

EPP_VALUES = {"performance": 0, "balance_performance": 128, "balance_power": 192, "power": 255}
EPP_ORDER = tuple(EPP_VALUES)  # the kernel's order when a driver lists none
ON_OFF = ("off", "on")
# units and files that mean a profile daemon runs: systemd's per-unit invocation links (/run/systemd/units,
# present while the unit is active) and tuned's pid file
MANAGERS = (("power-profiles-daemon", "systemd/units/invocation:power-profiles-daemon.service"),
            ("tuned-ppd", "systemd/units/invocation:tuned-ppd.service"),
            ("tuned", "systemd/units/invocation:tuned.service"),
            ("tuned", "tuned/tuned.pid"))


def run_root_of(sysfs_root: str) -> str:
    """The ``/run`` beside a sysfs root: ``/run`` for ``/sys``, ``<tree>/run`` for a recorded ``<tree>/sys``."""
    return os.path.join(os.path.dirname(os.path.abspath(sysfs_root)) or "/", "run")


def profile_managers(run_root: str = "/run") -> list[str]:
    """The profile daemons running (power-profiles-daemon, tuned-ppd, tuned), from ``run_root``; each once."""
    found: list[str] = []
    for name, rel in MANAGERS:
        if name not in found and os.path.lexists(os.path.join(run_root, rel)):
            found.append(name)
    return found


@dataclass
class _Knob:
    knob: Knob
    files: tuple[str, ...]  # written alike; the first is read
    attr: Attribute  # the first file, kept open
    invert: bool = False  # intel_pstate/no_turbo: 1 means boost off


def _epp_index(text: str, choices: tuple[str, ...]) -> int | None:
    if text in choices:
        return choices.index(text)
    try:
        raw = int(text, 0)
    except ValueError:
        return None  # "default": the firmware's own value, no name for it
    named = [(abs(EPP_VALUES[c] - raw), i) for i, c in enumerate(choices) if c in EPP_VALUES]
    return min(named)[1] if named else None


class CpuKnobBackend:
    """EPP, governor, boost and platform_profile under ``sysfs_root`` (see the module doc). ``managed_by``:
    the profile daemons that own these knobs (None: found in :func:`run_root_of` at discovery)."""

    kind = "cpuknobs"

    def __init__(self, sysfs_root: str = "/sys", io: SysfsIO | None = None, clock: Clock | None = None,
                 managed_by: list[str] | None = None) -> None:
        self.sysfs_root = sysfs_root
        self.io = io or SysfsIO()
        self.clock = clock or RealClock()
        self.managed_by = managed_by
        self._knobs: dict[str, _Knob] = {}

    # -- discovery -------------------------------------------------------------------------------------
    def _policies(self) -> list[str]:
        cpu = os.path.join(self.sysfs_root, "devices", "system", "cpu")
        try:
            names = self.io.listdir(os.path.join(cpu, "cpufreq"))
        except OSError:
            names = []
        found = [os.path.join(cpu, "cpufreq", n) for n in names if n.startswith("policy")]
        if not found:  # kernels before policyN directories: cpuN/cpufreq
            try:
                found = [os.path.join(cpu, n, "cpufreq") for n in self.io.listdir(cpu)
                         if n.startswith("cpu") and n[3:].isdigit()]
            except OSError:
                found = []
            found = list({self.io.realpath(p): p for p in found if self.io.is_dir(p)}.values())
        return sorted(found, key=natural_key)

    def _add(self, dev: str, name: str, kind: KnobKind, files: list[str], choices: tuple[str, ...],
             why: str | None, invert: bool = False) -> Knob:
        if why is None:
            bad = why_not_writable(self.io, files[0])
            why = None if bad is None else f"{os.path.basename(files[0])} not writable ({bad})"
        knob = Knob(f"{dev}/{name}", dev, kind, "", 0.0, float(len(choices) - 1), None, why is None, why,
                    choices=choices)
        self._knobs[knob.id] = _Knob(knob, tuple(files), Attribute(self.io, files[0]), invert)
        return knob

    def discover(self) -> list[Device]:
        self.close()
        managers = self.managed_by if self.managed_by is not None else profile_managers(run_root_of(self.sysfs_root))
        owned = (f"{' and '.join(managers)} manages the CPU's power profile: aithermd leaves this knob to it "
                 "(stop it, or switch its profile, to change this)") if managers else None
        io, devices = self.io, []
        policies = self._policies()
        knobs: list[Knob] = []

        def text(path: str) -> str | None:
            return read_optional_text(io, path)

        epp = [os.path.join(p, "energy_performance_preference") for p in policies]
        epp = [f for f in epp if io.exists(f)]
        if epp:
            listed = (text(os.path.join(os.path.dirname(epp[0]), "energy_performance_available_preferences"))
                      or "").split()
            choices = tuple(c for c in listed if c != "default") or EPP_ORDER
            knobs.append(self._add("cpufreq", "epp", KnobKind.EPP, epp, choices, owned))
        gov = [f for f in (os.path.join(p, "scaling_governor") for p in policies) if io.exists(f)]
        if gov:
            listed = (text(os.path.join(os.path.dirname(gov[0]), "scaling_available_governors")) or "").split()
            current = text(gov[0])
            choices = tuple(listed) or ((current,) if current else ())
            if choices:
                knobs.append(self._add("cpufreq", "governor", KnobKind.GOVERNOR, gov, choices, owned))
        cpu = os.path.join(self.sysfs_root, "devices", "system", "cpu")
        no_turbo = os.path.join(cpu, "intel_pstate", "no_turbo")
        boost = os.path.join(cpu, "cpufreq", "boost")
        if io.exists(no_turbo):
            knobs.append(self._add("cpufreq", "boost", KnobKind.BOOST, [no_turbo], ON_OFF, owned, invert=True))
        elif io.exists(boost):
            knobs.append(self._add("cpufreq", "boost", KnobKind.BOOST, [boost], ON_OFF, owned))
        if knobs:
            driver = text(os.path.join(policies[0], "scaling_driver")) if policies else None
            info = {"scaling_driver": driver or "", "policies": len(policies)}
            if managers:
                info["managed_by"] = ", ".join(managers)
            devices.append(Device("cpufreq", DeviceKind.CPU, f"cpufreq ({driver or 'unknown driver'})",
                                  knobs=tuple(knobs), info=info))
        acpi = os.path.join(self.sysfs_root, "firmware", "acpi")
        profile = os.path.join(acpi, "platform_profile")
        if io.exists(profile):
            choices = tuple((text(os.path.join(acpi, "platform_profile_choices")) or "").split())
            if choices:
                knob = self._add("acpi", "platform_profile", KnobKind.PLATFORM_PROFILE, [profile], choices, owned)
                info = {"managed_by": ", ".join(managers)} if managers else {}
                devices.append(Device("acpi", DeviceKind.CPU, "ACPI platform profile", knobs=(knob,), info=info))
        return devices

    # -- sampling and knobs ----------------------------------------------------------------------------
    def sample(self) -> Sample:
        return Sample(t=self.clock.monotonic(), knobs={kid: self.read_knob(kid) for kid in self._knobs})

    def _get(self, knob_id: str) -> _Knob:
        k = self._knobs.get(knob_id)
        if k is None:
            raise UnknownKnob(knob_id)
        return k

    def read_knob(self, knob_id: str) -> KnobValue:
        k = self._get(knob_id)
        try:
            raw = k.attr.read().decode("ascii", "replace").strip()
        except OSError:
            return KnobValue(knob_id, None, None, Status.FAILED)
        choices = k.knob.choices
        if k.knob.kind == KnobKind.BOOST:
            if raw not in ("0", "1"):
                return KnobValue(knob_id, None, None, Status.IMPLAUSIBLE)
            return KnobValue(knob_id, float(int(raw) ^ int(k.invert)))
        index = _epp_index(raw, choices) if k.knob.kind == KnobKind.EPP else (
            choices.index(raw) if raw in choices else None)
        return KnobValue(knob_id, None if index is None else float(index))

    def write_knob(self, knob_id: str, value: float) -> None:
        """Set the knob to ``choices[value]`` in every file it has. Raises OutOfRange (not one of its
        choices, or refused with EINVAL), NoPermission, DeviceLost or BackendError (EBUSY: EPP while the
        governor is ``performance``)."""
        k = self._get(knob_id)
        choices = k.knob.choices
        if not k.knob.writable:
            raise NoPermission(f"{knob_id} is read-only: {k.knob.why_not}")
        if value != value or value != int(value) or not 0 <= value < len(choices):
            raise OutOfRange(f"{knob_id}: {value!r} is not one of its choices ({', '.join(choices)})")
        name = choices[int(value)]
        data = (b"%d\n" % (int(value) ^ int(k.invert))) if k.knob.kind == KnobKind.BOOST else name.encode() + b"\n"
        failed: list[tuple[str, OSError]] = []
        for path in k.files:
            try:
                self.io.write(path, data)
            except OSError as exc:
                failed.append((path, exc))
        if not failed:
            return
        path, exc = failed[0]
        where = f"{knob_id} := {name}" + (f" ({len(failed)} of {len(k.files)} files)" if len(k.files) > 1 else "")
        if exc.errno == errno.EBUSY and k.knob.kind == KnobKind.EPP:
            raise BackendError(f"{where}: the driver refused it (EBUSY): intel_pstate keeps EPP at performance "
                               "while the governor is 'performance'; set the governor to powersave first")
        raise write_error(exc, where) from exc

    def save_knob(self, knob_id: str) -> dict[str, Any]:
        """The original text of every file: ``{"files": {path relative to the sysfs root: text}}``."""
        k = self._get(knob_id)
        out = {}
        for path in k.files:
            try:
                out[os.path.relpath(path, self.sysfs_root)] = self.io.read_text(path).strip()
            except OSError as exc:
                raise write_error(exc, f"{knob_id}: cannot read the original") from exc
        return {"files": out}

    def restore_knob(self, knob_id: str, saved: dict[str, Any]) -> None:
        """Write back each file's saved text (a policy gone since is skipped), read-only or not: it is what
        was found. A file that already reads its saved text is not written: intel_pstate and amd-pstate
        refuse any EPP write (EBUSY) while the governor is ``performance``, under which the EPP reads
        ``performance``, so once the governor is back at ``performance`` the EPP found with it is in force
        and a write would only fail. Raises UnknownKnob, BackendError for a saved path outside the sysfs
        root, else what the first failed write raises."""
        self._get(knob_id)
        first: Exception | None = None
        for rel, text in dict(saved.get("files", {})).items():
            path = os.path.normpath(os.path.join(self.sysfs_root, rel))
            if os.path.isabs(rel) or rel.split(os.sep)[0] == "..":
                raise BackendError(f"{knob_id}: saved path {rel!r} is outside the sysfs root")
            if not self.io.exists(path):
                continue
            try:
                if self.io.read_text(path).strip() == text:
                    continue
            except OSError:
                pass  # unreadable now: the write says whether it can be put back
            try:
                self.io.write(path, f"{text}\n".encode())
            except OSError as exc:
                first = first or write_error(exc, f"{knob_id}: restore {rel} = {text}")
        if first is not None:
            raise first

    def locator(self) -> dict[str, Any]:
        return {"backend": "cpuknobs", "sysfs_root": self.sysfs_root}

    def close(self) -> None:
        for k in self._knobs.values():
            k.attr.close()
        self._knobs = {}

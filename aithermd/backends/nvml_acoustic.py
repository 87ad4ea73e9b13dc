"""NVML's acoustic threshold — nvidia-smi's GPU Target Temperature (``nvidia-smi -gtt``) — as the knob
``gpu<N>/target_temperature`` (°C): the temperature the driver's boost holds the GPU under, so a lower one
makes the GPU run cooler and its fans do less. Sources: the NVML API reference
(nvmlDeviceGet/SetTemperatureThreshold, NVML_TEMPERATURE_THRESHOLD_ACOUSTIC_MIN/CURR/MAX) and the recorded
dumps' "GPU Target Temperature" (84 °C on an RTX 4090, N/A on datacenter GPUs).

A knob only where the driver reports the threshold and its ACOUSTIC_MIN–MAX range (what it may be set to);
writable as root. Saved as ``{"target_c": int, "uuid"}`` and put back like the power limit.
"""

from __future__ import annotations

import os
from typing import Any

from aithermd.model import UNITS, Knob, KnobKind, KnobValue, Quantity, Status

ATTR = "target_temperature"
GET, SET = "nvmlDeviceGetTemperatureThreshold", "nvmlDeviceSetTemperatureThreshold"


def probe(p: Any) -> None:
    """Add the knob to ``p.knobs`` (a :class:`~aithermd.backends.nvml_probe.GpuProbe`) where the driver has
    the threshold and its range."""
    nv = p.nv
    cur, code = p.attempt(GET, nv.NVML_TEMPERATURE_THRESHOLD_ACOUSTIC_CURR)
    lo, lcode = p.attempt(GET, nv.NVML_TEMPERATURE_THRESHOLD_ACOUSTIC_MIN)
    hi, hcode = p.attempt(GET, nv.NVML_TEMPERATURE_THRESHOLD_ACOUSTIC_MAX)
    if code is not None or lcode is not None or hcode is not None or not 0 < lo <= hi < 150:
        return
    why = None
    if not p.probe_writes and os.geteuid() != 0:
        why = p.why(nv.NVML_ERROR_NO_PERMISSION, "setting the target temperature needs root")
    elif p.probe_writes:  # writing the threshold in force changes nothing
        wcode = p.probe_write(SET, nv.NVML_TEMPERATURE_THRESHOLD_ACOUSTIC_CURR, cur)
        why = None if wcode is None else p.why(wcode, "the target temperature cannot be set")
    p.knobs[ATTR] = Knob(f"{p.id}/{ATTR}", p.id, KnobKind.TARGET_TEMPERATURE, UNITS[Quantity.TEMPERATURE],
                         min=float(lo), max=float(hi), writable=why is None, why_not=why)


def value(reader: Any) -> KnobValue:
    """The threshold in force (°C); a failed read is a status. Raises what ``reader.call`` raises for a lost
    GPU."""
    kid = f"{reader.id}/{ATTR}"
    try:
        c = reader.call(GET, reader.nv.NVML_TEMPERATURE_THRESHOLD_ACOUSTIC_CURR)
    except reader.nv.NVMLError:
        return KnobValue(kid, None, None, Status.FAILED)
    return KnobValue(kid, float(c))


def set_args(reader: Any, celsius: float) -> tuple[str, int, int]:
    """(NVML function, threshold, °C) that set the threshold to ``celsius`` (whole degrees)."""
    return SET, reader.nv.NVML_TEMPERATURE_THRESHOLD_ACOUSTIC_CURR, int(round(celsius))

"""aithermd names and reads every recorded machine exactly as lm-sensors did (sensors.json)."""

from __future__ import annotations

import pytest

from aithermd.backends.hwmon import HwmonBackend
from aithermd.publish.sensors import sensors_document

from .helpers import MACHINES, MACHINES_DIR, assert_agrees, document_view, lm_sensors_reference


def test_six_machines_are_present():
    assert len(MACHINES) == 6


@pytest.mark.parametrize("machine", MACHINES)
def test_backend_agrees_with_lm_sensors(machine):
    backend = HwmonBackend(str(MACHINES_DIR / machine / "sys"))
    try:
        devices = backend.discover()
        sample = backend.sample()
    finally:
        backend.close()
    doc = sensors_document(devices, sample.readings, sample.knobs)
    assert all(r.status == "ok" for r in sample.readings.values())
    assert_agrees(document_view(doc), lm_sensors_reference(machine))


def test_reference_check_can_fail():
    """The comparison itself notices a wrong value, a wrong label and a missing chip."""
    ref = {"k10temp-pci-00c3": {"Tctl": ("temp1", 32.6)}}
    with pytest.raises(AssertionError):
        assert_agrees({"k10temp-pci-00c3": {"Tctl": ("temp1", 32.7)}}, ref)
    with pytest.raises(AssertionError):
        assert_agrees({"k10temp-pci-00c3": {"temp1": ("temp1", 32.6)}}, ref)
    with pytest.raises(AssertionError):
        assert_agrees({}, ref)

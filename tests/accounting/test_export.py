"""The accounting's Prometheus families: bounded top N plus other, monotonic, summing to the attributed
energy; present at 0 once devices are known; promtool accepts the exposition."""

from __future__ import annotations

import shutil
import subprocess

import pytest
from prometheus_client import CollectorRegistry, generate_latest
from prometheus_client.parser import text_string_to_metric_families

from aithermd.accounting.export import TopN
from aithermd.publish.energy_metrics import EnergyCollector
from tests.accounting.bench import Bench


def _scrape(service) -> dict[tuple[str, tuple], float]:
    registry = CollectorRegistry(auto_describe=False)
    registry.register(EnergyCollector(lambda: service.exporter.export))
    text = generate_latest(registry).decode()
    out = {}
    for family in text_string_to_metric_families(text):
        for s in family.samples:
            out[(s.name, tuple(sorted(s.labels.items())))] = s.value
    return out, text


def test_counters_exist_at_zero_once_devices_are_known(tmp_path):
    bench = Bench(tmp_path)
    service = bench.start_daemon(None)
    samples, _ = _scrape(service)
    uuids = {"gpu0": bench.nvml.gpu(0).uuid, "gpu1": bench.nvml.gpu(1).uuid, "cpu": ""}
    for device in ("gpu0", "gpu1", "cpu"):
        labels = (("UUID", uuids[device]), ("device", device), ("gpu", device.removeprefix("gpu")
                                                                  if device != "cpu" else ""))
        assert samples[("aithermd_energy_joules_total", labels)] == 0.0
        assert samples[("aithermd_energy_idle_joules_total", labels)] == 0.0


def test_accounting_series_carry_dcgm_exporters_gpu_labels(tmp_path):
    """Every per-GPU accounting series has dcgm-exporter's ``gpu`` and ``UUID`` next to ``device``, the
    values the hardware families give the same board (attack8 T10: ``device="gpu0"`` alone joined nothing)."""
    bench = Bench(tmp_path)
    service = bench.start_daemon(None)
    bench.job(8001, 901, {0: 1.0})
    bench.util[0], bench.power["gpu0"] = 100.0, 400.0
    bench.run(10)
    samples, _ = _scrape(service)
    uuid = bench.nvml.gpu(0).uuid
    names = {"aithermd_energy_joules_total", "aithermd_energy_idle_joules_total",
             "aithermd_energy_unattributed_joules_total", "aithermd_slurm_job_energy_joules_total",
             "aithermd_unit_energy_joules_total", "aithermd_process_energy_joules_total",
             "aithermd_gpu_memory_total_bytes", "aithermd_gpu_processes"}
    seen = set()
    for (name, labels), _value in samples.items():
        labels = dict(labels)
        if name in names and (labels.get("device") == "gpu0" or labels.get("gpu_index") == "0"):
            assert (labels["gpu"], labels["UUID"]) == ("0", uuid), (name, labels)
            seen.add(name)
    assert seen == names


def test_top_n_plus_other_is_bounded_and_adds_up(tmp_path):
    bench = Bench(tmp_path)
    service = bench.start_daemon(None)
    service.exporter.families["job"].n = 3
    for k in range(6):
        bench.job(8000 + k, 900 + k, {0: 1.0 + k})
    bench.util[0], bench.power["gpu0"] = 100.0, 400.0
    bench.run(10)
    samples, text = _scrape(service)
    jobs = {dict(labels)["hpc_job"]: v for (name, labels), v in samples.items()
            if name == "aithermd_slurm_job_energy_joules_total" and dict(labels)["device"] == "gpu0"}
    assert len(jobs) == 4 and "other" in jobs  # three jobs of their own, the rest in other
    assert set(jobs) - {"other"} == {"slurm:905", "slurm:904", "slurm:903"}  # the largest got the room
    ledger = service.accountant.ledger.devices["gpu0"]
    attributed = ledger["total_j"] - ledger["idle_j"] - ledger["unattributed_j"]
    assert sum(jobs.values()) == pytest.approx(attributed)
    before = jobs
    bench.run(10)
    after = {dict(labels)["hpc_job"]: v for (name, labels), v in _scrape(service)[0].items()
             if name == "aithermd_slurm_job_energy_joules_total" and dict(labels)["device"] == "gpu0"}
    assert all(after[k] >= before[k] for k in before)  # counters never go back
    if shutil.which("promtool"):
        done = subprocess.run(["promtool", "check", "metrics"], input=text, capture_output=True, text=True)
        assert done.returncode == 0, done.stdout + done.stderr


def test_a_consumer_that_stops_leaves_room_and_its_series_ends():
    top = TopN(n=1, ttl_s=60.0)
    top.add(0.0, {("a",): {"gpu0": 5.0}, ("b",): {"gpu0": 1.0}})
    assert top.rows(1) == ((("a",), "gpu0", 5.0), (("other",), "gpu0", 1.0))
    top.add(30.0, {("b",): {"gpu0": 1.0}})  # a is quiet, but within its ttl: b still has no room
    assert top.other == {"gpu0": 2.0}
    top.add(100.0, {("b",): {"gpu0": 1.0}})
    # a's 5 J move to other (attack4 B9: they left the family's sum, which fell short of the attributed)
    assert top.rows(1) == ((("b",), "gpu0", 1.0), (("other",), "gpu0", 7.0))
    assert sum(j for _, _, j in top.rows(1)) == 8.0  # every joule added, at every scrape

"""The shipped alerts against what the exporter really produces: a scripted run of the real exporter (the
StateHub, the collector, the event counters) is scraped once a minute, the scrapes become promtool input
series (a sample missing from a scrape is ``_``, as Prometheus would store it), and `promtool test rules`
checks that the alerts fire on them. A counter that appeared only at its first event would never fire."""

from __future__ import annotations

import dataclasses
import json
import subprocess
from pathlib import Path

from _fleet import FLEET, need_tool
from prometheus_client.parser import text_string_to_metric_families

from aithermd.model import Alarm, Event
from aithermd.publish import metrics
from aithermd.publish.hub import StateHub
from aithermd.publish.reference import reference_snapshot

RULES = FLEET / "prometheus" / "aithermd-alerts.yml"
INSTANCE = {"job": "aithermd", "instance": "node1:8736"}
KNOB = "hwmon:nct6798-isa-0290/pwm2"


def exporter_series(minutes: int, events_at: dict[int, list[Event]], names: set[str],
                    alarms_at: dict[int, dict[str, Alarm]] | None = None) -> list[dict]:
    """Scrape the real exporter once per simulated minute; promtool ``input_series`` for ``names``; the
    snapshot of minute m holds the alarms ``alarms_at[m]``."""
    hub = StateHub()
    handle = metrics.start("none", hub)
    seen: dict[tuple[str, tuple], list[str]] = {}
    try:
        for minute in range(minutes):
            snapshot = reference_snapshot(minute + 1, gpus=1)
            if alarms_at and minute in alarms_at:
                snapshot = dataclasses.replace(snapshot, alarms=alarms_at[minute])
            hub.publish(snapshot, events_at.get(minute, []))
            text = metrics.render(handle).decode()
            for family in text_string_to_metric_families(text):
                for s in family.samples:
                    if s.name in names:
                        key = (s.name, tuple(sorted({**s.labels, **INSTANCE}.items())))
                        seen.setdefault(key, ["_"] * minute)
                        seen[key].append(repr(float(s.value)))
            for values in seen.values():
                values.extend("_" * (minute + 1 - len(values)))
    finally:
        handle.stop()
    return [{"series": name + "{" + ",".join(f'{k}="{v}"' for k, v in labels) + "}",
             "values": " ".join(values)} for (name, labels), values in sorted(seen.items())]


def promtool_passes(tmp_path: Path, series: list[dict], alert_rule_test: list[dict]) -> None:
    """``promtool test rules`` of the shipped rules on ``series`` (one sample a minute) passes."""
    test = {"rule_files": [str(RULES)], "evaluation_interval": "1m",
            "tests": [{"interval": "1m", "input_series": series, "alert_rule_test": alert_rule_test}]}
    path = tmp_path / "exporter.test.yml"
    path.write_text(json.dumps(test, indent=1))  # JSON is YAML
    done = subprocess.run([need_tool("promtool"), "test", "rules", str(path)], capture_output=True, text=True,
                          timeout=60)
    assert done.returncode == 0, done.stdout + done.stderr


def fault(minute: int) -> Event:
    return Event("fault", 60.0 * minute, "gpu0/temperature", "read failed", {"device": "gpu0"})


def drift(minute: int) -> Event:
    return Event("drift", 60.0 * minute, KNOB, "pwm2 read back 40 % after 60 % was written")


def test_alerts_fire_on_the_exporters_own_series(tmp_path: Path) -> None:
    events = {4: [fault(4)], 3: [drift(3)], 5: [drift(5)], 6: [drift(6)]}
    series = exporter_series(12, events, {"aithermd_faults_total", "aithermd_drift_total"})
    gpu0 = next(s for s in series if 'device="gpu0"' in s["series"])
    assert gpu0["values"].split()[:6] == ["0.0", "0.0", "0.0", "0.0", "1.0", "1.0"]  # at 0 from the start
    promtool_passes(tmp_path, series, [
                {"eval_time": "3m", "alertname": "AithermdDeviceFaults", "exp_alerts": []},
                {"eval_time": "5m", "alertname": "AithermdDeviceFaults", "exp_alerts": [
                    {"exp_labels": {"severity": "warning", "device": "gpu0", **INSTANCE},
                     "exp_annotations": {
                         "summary": "device gpu0 on node1:8736 reports faults",
                         "description": "1 faults on gpu0 in 10 minutes (failed reads, implausible values, "
                                        "a lost GPU). `aithermctl doctor` and `journalctl -u aithermd` tell "
                                        "which."}}]},
                {"eval_time": "5m", "alertname": "AithermdKnobDrift", "exp_alerts": []},
                {"eval_time": "7m", "alertname": "AithermdKnobDrift", "exp_alerts": [
                    {"exp_labels": {"severity": "warning", "knob": KNOB, **INSTANCE},
                     "exp_annotations": {
                         "summary": f"{KNOB} on node1:8736 keeps drifting",
                         "description": f"aithermd counted 3 drift or conflict events on {KNOB} in 15 "
                                        "minutes. Another program (fancontrol, CoolerControl, nvidia-smi "
                                        "-pl, a BMC) is probably writing the same knob; aithermd steps back "
                                        "from a knob it keeps losing. See `journalctl -u aithermd`."}}]},
    ])


def test_a_refused_safety_cut_pages_from_the_exporters_own_series(tmp_path: Path) -> None:
    """attack5 C5: the ``refused`` alarm reached no series: a critical cut the driver refused paged nobody."""
    refused = {"gpu0/power_limit": Alarm("refused", "gpu0/power_limit: the safety decision is refused", 0.0)}
    series = exporter_series(8, {}, {"aithermd_knob_refused"}, {m: refused for m in range(3, 8)})
    gpu0 = next(s for s in series if 'knob="gpu0/power_limit"' in s["series"])
    assert gpu0["values"].split() == ["0.0"] * 3 + ["1.0"] * 5  # at 0 from the start
    assert len(series) > 1 and all(s["values"] == " ".join(["0.0"] * 8) for s in series if s is not gpu0)
    promtool_passes(tmp_path, series, [
            {"eval_time": "3m", "alertname": "AithermdSafetyWriteRefused", "exp_alerts": []},
            {"eval_time": "4m", "alertname": "AithermdSafetyWriteRefused", "exp_alerts": [
                {"exp_labels": {"severity": "critical", "knob": "gpu0/power_limit", **INSTANCE},
                 "exp_annotations": {
                     "summary": "the safety cut of gpu0/power_limit on node1:8736 is refused",
                     "description": "The driver refuses aithermd's safety decision on gpu0/power_limit (NVML "
                                    "NO_PERMISSION: a container without CAP_SYS_ADMIN, locked GPU settings, "
                                    "another management agent). The knob stays where aithermd set it. Stop "
                                    "the load on that device, then see `aithermctl explain gpu0/power_limit` "
                                    "and `journalctl -u aithermd`."}}]},
    ])

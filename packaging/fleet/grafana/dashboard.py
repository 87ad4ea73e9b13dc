#!/usr/bin/env python3
"""The aithermd Grafana dashboard: built from this file, checked before it ships.

    dashboard.py build [OUT]            write the dashboard JSON (default: aithermd.json next to this file)
    dashboard.py check FILE [--metrics-source PY|DIR] [--rules OUT]
                                        check a dashboard: structure, variables, metric names; with --rules,
                                        write every query as a recording rule for `promtool check rules`

Panels: per node and per GPU temperature, power against limit, energy, clock-event reasons, policy and holds,
drift, faults and failsafe (issue 11); energy by Slurm job, systemd unit and container, idle and
unattributed energy, and the node power budget against the draw. Only the standard library is used, so CI and admins can run it
anywhere.
"""

from __future__ import annotations

import argparse
import json
import re
import sys
from pathlib import Path
from typing import Any

HERE = Path(__file__).resolve().parent
DEFAULT_OUT = HERE / "aithermd.json"
DEFAULT_METRICS_SOURCE = HERE.parents[2] / "aithermd" / "publish"  # every *metrics.py there
DS = {"type": "prometheus", "uid": "${datasource}"}
SEL = 'job="$job", instance=~"$instance"'
GPU = f'{SEL}, gpu_index=~"$gpu"'
# Values the check substitutes for Grafana's variables before promtool parses a query.
VARIABLE_VALUES = {"$__rate_interval": "1m", "$__interval": "1m", "$__range": "1h", "$job": "aithermd",
                   "$instance": ".*", "$gpu": ".*"}


def target(expr: str, legend: str = "", ref: str = "A", **extra: Any) -> dict[str, Any]:
    return {"datasource": DS, "expr": expr, "legendFormat": legend, "refId": ref, **extra}


class Layout:
    """Hands out panel ids and grid positions, row by row, 24 columns wide."""

    def __init__(self) -> None:
        self.panels: list[dict[str, Any]] = []
        self.x = self.y = self.row_h = 0

    def row(self, title: str) -> None:
        self._newline()
        self.panels.append({"type": "row", "title": title, "id": len(self.panels) + 1, "collapsed": False,
                            "gridPos": {"h": 1, "w": 24, "x": 0, "y": self.y}, "panels": []})
        self.y += 1

    def _newline(self) -> None:
        if self.x:
            self.y += self.row_h
        self.x = self.row_h = 0

    def add(self, panel: dict[str, Any], w: int, h: int) -> None:
        if self.x + w > 24:
            self._newline()
        panel["id"] = len(self.panels) + 1
        panel["gridPos"] = {"h": h, "w": w, "x": self.x, "y": self.y}
        panel.setdefault("datasource", DS)
        self.panels.append(panel)
        self.x += w
        self.row_h = max(self.row_h, h)


def timeseries(title: str, targets: list[dict[str, Any]], unit: str, description: str = "",
               overrides: list[dict[str, Any]] | None = None, **custom: Any) -> dict[str, Any]:
    return {"type": "timeseries", "title": title, "description": description, "targets": targets,
            "fieldConfig": {"defaults": {"unit": unit,
                                         "custom": {"lineWidth": 1, "fillOpacity": 0, **custom}},
                            "overrides": overrides or []},
            "options": {"legend": {"displayMode": "table", "placement": "bottom",
                                   "calcs": ["lastNotNull", "max"]},
                        "tooltip": {"mode": "multi", "sort": "desc"}}}


def stat(title: str, expr: str, unit: str, description: str = "", decimals: int | None = None,
         thresholds: list[tuple[float | None, str]] | None = None) -> dict[str, Any]:
    steps = [{"color": c, "value": v} for v, c in (thresholds or [(None, "green")])]
    defaults: dict[str, Any] = {"unit": unit, "thresholds": {"mode": "absolute", "steps": steps}}
    if decimals is not None:
        defaults["decimals"] = decimals
    return {"type": "stat", "title": title, "description": description, "targets": [target(expr)],
            "fieldConfig": {"defaults": defaults, "overrides": []},
            "options": {"reduceOptions": {"calcs": ["lastNotNull"], "fields": "", "values": False},
                        "colorMode": "value", "graphMode": "area", "textMode": "auto"}}


def bargauge(title: str, expr: str, legend: str, unit: str, description: str = "") -> dict[str, Any]:
    """One bar per series of an instant query, largest first (a top-N over the dashboard's range)."""
    return {"type": "bargauge", "title": title, "description": description,
            "targets": [target(expr, legend, instant=True)],
            "fieldConfig": {"defaults": {"unit": unit, "decimals": 2, "min": 0}, "overrides": []},
            "options": {"orientation": "horizontal", "displayMode": "gradient", "showUnfilled": True,
                        "reduceOptions": {"calcs": ["lastNotNull"], "fields": "", "values": False}},
            "transformations": [{"id": "sortBy", "options": {"sort": [{"field": "Value", "desc": True}]}}]}


def state_timeline(title: str, targets: list[dict[str, Any]], description: str = "") -> dict[str, Any]:
    return {"type": "state-timeline", "title": title, "description": description, "targets": targets,
            "fieldConfig": {"defaults": {"color": {"mode": "thresholds"},
                                         "thresholds": {"mode": "absolute", "steps": [
                                             {"color": "transparent", "value": None},
                                             {"color": "orange", "value": 1}]}},
                            "overrides": []},
            "options": {"showValue": "never", "mergeValues": True, "rowHeight": 0.8,
                        "legend": {"showLegend": False}}}


def limit_overrides(pattern: str) -> list[dict[str, Any]]:
    """Draw series whose name matches ``pattern`` (limits) dashed, so power reads against its limit."""
    return [{"matcher": {"id": "byRegexp", "options": pattern},
             "properties": [{"id": "custom.lineStyle", "value": {"fill": "dash", "dash": [10, 10]}}]}]


def build() -> dict[str, Any]:
    lay = Layout()
    lay.row("Fleet")
    lay.add(stat("Nodes up", 'count(up{job="$job"} == 1)', "none",
                 "Machines whose aithermd exporter Prometheus can scrape."), 4, 4)
    lay.add(stat("GPUs", f"count(aithermd_gpu_temperature_celsius{{{SEL}}})", "none"), 4, 4)
    lay.add(stat("GPU power now", f"sum(aithermd_gpu_power_watts{{{SEL}}})", "watt"), 4, 4)
    lay.add(stat("GPU energy (range)",
                 f"sum(increase(aithermd_gpu_energy_joules_total{{{SEL}}}[$__range])) / 3.6e6", "kwatth",
                 "Energy all selected GPUs used over the dashboard's time range.", decimals=2), 4, 4)
    lay.add(stat("Knobs in failsafe", f"sum(aithermd_failsafe_active{{{SEL}}}) or vector(0)", "none",
                 "Knobs the safety layer drives now (critical temperature or failed sensor).",
                 thresholds=[(None, "green"), (1, "red")]), 4, 4)
    lay.add(stat("Degraded", f"count(aithermd_degraded{{{SEL}}} == 1) or vector(0)", "none",
                 "Devices, channels or knobs in trouble.", thresholds=[(None, "green"), (1, "orange")]), 4, 4)

    lay.row("GPUs: temperature, power against limit, energy")
    lay.add(timeseries("GPU temperature", [
        target(f"aithermd_gpu_temperature_celsius{{{GPU}}}", "{{instance}} gpu{{gpu_index}}"),
        target(f"aithermd_gpu_memory_temperature_celsius{{{GPU}}}", "{{instance}} gpu{{gpu_index}} memory",
               "B"),
    ], "celsius", "Core and memory temperature per GPU (NVML)."), 12, 8)
    lay.add(timeseries("GPU power against limit", [
        target(f"aithermd_gpu_power_watts{{{GPU}}}", "{{instance}} gpu{{gpu_index}} power"),
        target(f"aithermd_gpu_power_limit_watts{{{GPU}}}", "{{instance}} gpu{{gpu_index}} limit", "B"),
        target(f"aithermd_gpu_enforced_power_limit_watts{{{GPU}}}", "{{instance}} gpu{{gpu_index}} enforced",
               "C"),
    ], "watt", "Draw (solid) against the management limit aithermd sets and the enforced limit (dashed).",
        limit_overrides(".* (limit|enforced)$")), 12, 8)
    lay.add(timeseries("GPU power / limit", [
        target(f"aithermd_gpu_power_watts{{{GPU}}} / aithermd_gpu_power_limit_watts{{{GPU}}}",
               "{{instance}} gpu{{gpu_index}}"),
    ], "percentunit", "Near 100 %: the GPU is power-limited (see the sw_power_cap reason)."), 8, 8)
    lay.add(timeseries("GPU utilisation", [
        target(f"aithermd_gpu_utilization_ratio{{{GPU}}}", "{{instance}} gpu{{gpu_index}}"),
    ], "percentunit"), 8, 8)
    lay.add(timeseries("GPU energy per node", [
        target("sum by (instance) "
               f"(increase(aithermd_gpu_energy_joules_total{{{GPU}}}[$__interval])) / 3.6e6",
               "{{instance}}", interval="5m"),
    ], "kwatth", "Energy used by each node's selected GPUs per interval.", drawStyle="bars",
        fillOpacity=60), 8, 8)
    lay.add(state_timeline("GPU clock-event reasons", [
        target("max by (instance, gpu_index, reason) "
               f'(aithermd_gpu_clock_event_reason{{{GPU}, reason!="gpu_idle"}}) == 1',
               "{{instance}} gpu{{gpu_index}} {{reason}}"),
    ], "When NVML reported each clocks-event (throttle) reason: sw_power_cap is a power limit at work; "
       "thermal and hw_slowdown reasons mean heat or the board's power brake."), 24, 8)

    lay.row("Energy by job, unit and container; the power budget")
    for title, metric, label, what in (
            ("Energy by Slurm job (range)", "aithermd_slurm_job_energy_joules_total", "hpc_job", "Slurm job"),
            ("Energy by systemd unit (range)", "aithermd_unit_energy_joules_total", "unit", "systemd unit"),
            ("Energy by container (range)", "aithermd_container_energy_joules_total", "container_id",
             "container")):
        lay.add(bargauge(title, f"topk(10, sum by ({label}) (increase({metric}{{{SEL}}}[$__range]))) / 3.6e6",
                         f"{{{{{label}}}}}", "kwatth",
                         f"The ten {what}s that used the most GPU and CPU package energy over the dashboard's "
                         "range, over the selected nodes (aithermd's accounting: each device's energy shared "
                         "by its processes' use; the node's top N, then 'other')."), 8, 8)
    lay.add(timeseries("Idle and unattributed energy", [
        target(f"sum by (instance) (increase(aithermd_energy_idle_joules_total{{{SEL}}}[$__interval])) / 3.6e6",
               "{{instance}} idle", interval="5m"),
        target("sum by (instance) "
               f"(increase(aithermd_energy_unattributed_joules_total{{{SEL}}}[$__interval])) / 3.6e6",
               "{{instance}} unattributed", "B", interval="5m"),
    ], "kwatth", "Energy charged to nobody: the devices' idle floor, and active energy with no process to "
       "charge (a process aithermd could not see, a GPU lost).", drawStyle="bars", fillOpacity=60), 12, 8)
    lay.add(timeseries("Power budget against the draw", [
        target(f'aithermd_power_budget_watts{{{SEL}, scope="wall"}}', "{{instance}} budget at the wall"),
        target(f"aithermd_power_budget_wall_drawn_watts{{{SEL}}}", "{{instance}} drawn at the wall (est.)", "B"),
        target(f'aithermd_power_budget_watts{{{SEL}, scope="devices"}}', "{{instance}} budget GPUs+CPU", "C"),
        target(f"sum by (instance) (aithermd_power_budget_drawn_watts{{{SEL}}})", "{{instance}} drawn GPUs+CPU",
               "D"),
    ], "watt", "A policy's node power budget (dashed) and the draw it holds: at the wall (AC, estimated from "
       "the devices' draw and the PSU's efficiency) and for the GPUs and CPU packages (DC). Empty on nodes "
       "without a budget.", limit_overrides(".* budget .*")), 12, 8)

    lay.row("CPU and board")
    lay.add(timeseries("CPU package power against PL1/PL2", [
        target(f'aithermd_rapl_power_watts{{{SEL}, zone=~"package-.*"}}', "{{instance}} {{zone}}"),
        target(f"aithermd_rapl_power_limit_watts{{{SEL}}}", "{{instance}} {{zone}} {{constraint}}", "B"),
    ], "watt", "RAPL power per zone, and its power caps (dashed).",
        limit_overrides(".* (pl1|pl2|PL1|PL2)$")), 8, 8)
    lay.add(timeseries("Board temperatures (hwmon)", [
        target(f"aithermd_temperature_celsius{{{SEL}}}", "{{instance}} {{chip}} {{label}}"),
    ], "celsius"), 8, 8)
    lay.add(timeseries("Fans", [
        target(f"aithermd_fan_speed_rpm{{{SEL}}}", "{{instance}} {{chip}} {{sensor}}"),
        target(f"aithermd_fan_duty_ratio{{{SEL}}} * 100", "{{instance}} {{chip}} {{sensor}} duty %", "B"),
    ], "rpm", "Fan speed (rpm) and the duty aithermd drives (%, right axis).",
        [{"matcher": {"id": "byFrameRefID", "options": "B"},
          "properties": [{"id": "unit", "value": "percent"},
                         {"id": "custom.axisPlacement", "value": "right"}]}]),
        8, 8)

    lay.row("Policy and health")
    lay.add(state_timeline("Active policy", [
        target(f"aithermd_policy_active{{{SEL}}} == 1", "{{instance}} {{policy}}"),
    ], "The policy in force on each node."), 12, 6)
    lay.add(timeseries("Holds", [
        target(f"aithermd_policy_holds{{{SEL}}}", "{{instance}} {{policy}}"),
    ], "none", "Holds on top of the active policy (aithermctl hold, Slurm jobs).", drawStyle="bars",
        fillOpacity=60), 12, 6)
    lay.add(timeseries("Decisions", [
        target(f"sum by (instance, rule) (increase(aithermd_decisions_total{{{SEL}}}[$__rate_interval]))",
               "{{instance}} {{rule}}"),
    ], "none", "Changes of a knob's winning decision, per rule.", drawStyle="bars", fillOpacity=60), 8, 8)
    lay.add(timeseries("Drift", [
        target(f"sum by (instance, knob) (increase(aithermd_drift_total{{{SEL}}}[$__rate_interval]))",
               "{{instance}} {{knob}}"),
    ], "none", "A value that did not stick or changed behind aithermd's back (another controller, a BMC).",
        drawStyle="bars", fillOpacity=60), 8, 8)
    lay.add(timeseries("Faults", [
        target(f"sum by (instance, device) (increase(aithermd_faults_total{{{SEL}}}[$__rate_interval]))",
               "{{instance}} {{device}}"),
    ], "none", "Failed reads, implausible values, lost GPUs.", drawStyle="bars", fillOpacity=60), 8, 8)
    lay.add(state_timeline("Failsafe and degraded", [
        target(f"aithermd_failsafe_active{{{SEL}}} == 1", "{{instance}} failsafe {{knob}}"),
        target(f"aithermd_degraded{{{SEL}}} == 1", "{{instance}} degraded {{id}}", "B"),
    ], "The safety layer driving a knob, and devices or knobs marked degraded."), 12, 8)
    lay.add(timeseries("Tick duration p99", [
        target(f"histogram_quantile(0.99, sum by (instance, le) "
               f"(rate(aithermd_tick_duration_seconds_bucket{{{SEL}}}[$__rate_interval])))", "{{instance}}"),
    ], "s", "Time one control-loop tick takes (99th percentile)."), 12, 8)

    def query_var(name: str, label: str, query: str, multi: bool) -> dict[str, Any]:
        return {"type": "query", "name": name, "label": label, "datasource": DS,
                "query": {"query": query, "refId": f"{name}-var"}, "definition": query, "refresh": 2,
                "includeAll": multi, "multi": multi, "sort": 1,
                "current": {"text": "All", "value": "$__all"} if multi else {}}

    return {
        "title": "aithermd fleet", "uid": "aithermd-fleet", "tags": ["aithermd", "gpu", "power"],
        "description": "GPU and CPU temperature, power against limit, energy, throttling, policy and health "
                       "of machines running aithermd.",
        "editable": True, "graphTooltip": 1, "schemaVersion": 39, "version": 1, "refresh": "30s",
        "time": {"from": "now-6h", "to": "now"}, "timezone": "",
        "templating": {"list": [
            {"type": "datasource", "name": "datasource", "label": "Prometheus", "query": "prometheus",
             "current": {}, "hide": 0},
            query_var("job", "Job", "label_values(aithermd_build_info, job)", False),
            query_var("instance", "Node", 'label_values(aithermd_build_info{job="$job"}, instance)', True),
            query_var("gpu", "GPU", 'label_values(aithermd_gpu_temperature_celsius{job="$job", '
                      'instance=~"$instance"}, gpu_index)', True),
        ]},
        "annotations": {"list": []},
        "links": [],
        "panels": lay.panels,
    }


def exported_metrics(source: Path) -> set[str]:
    """Series names the exporter can produce, read from its source (a file, or every ``*metrics.py`` of a
    directory): each ``aithermd_*`` name it defines, with the suffixes the exposition format adds to
    counters (_total) and histograms (_bucket/_sum/_count)."""
    files = sorted(source.glob("*metrics.py")) if source.is_dir() else [source]
    names = {n for f in files for n in re.findall(r'"(aithermd_[a-z0-9_]+)"', f.read_text())}
    suffixes = ("", "_total", "_bucket", "_sum", "_count", "_created")
    return {n + s for n in names for s in suffixes}


def queries(dashboard: dict[str, Any]) -> list[tuple[str, str]]:
    """(where, expr) of every panel query and query variable."""
    found = [(f"panel {p['id']} {p['title']!r} {t['refId']}", t["expr"])
             for p in dashboard["panels"] for t in p.get("targets", [])]
    found += [(f"variable {v['name']}", v["query"]["query"]) for v in dashboard["templating"]["list"]
              if v["type"] == "query"]
    return found


def promql(expr: str) -> str:
    """A query with Grafana's variables replaced by values, and label_values(...) turned into its selector."""
    for name, value in sorted(VARIABLE_VALUES.items(), key=lambda kv: -len(kv[0])):
        expr = expr.replace(name, value)
    match = re.fullmatch(r"label_values\((.*),\s*\w+\)", expr.strip(), re.S)
    return match.group(1) if match else expr


def check(dashboard: dict[str, Any], metrics: set[str]) -> list[str]:
    """Problems in ``dashboard``, as sentences; [] when it is fine."""
    problems = []
    ids = [p["id"] for p in dashboard["panels"]]
    if len(ids) != len(set(ids)):
        problems.append("panel ids are not unique")
    variables = {v["name"] for v in dashboard["templating"]["list"]}
    for p in dashboard["panels"]:
        g = p["gridPos"]
        if not (0 <= g["x"] and g["x"] + g["w"] <= 24 and g["h"] > 0):
            problems.append(f"panel {p['id']} {p['title']!r} does not fit the 24-column grid")
        if p["type"] != "row" and (p.get("datasource") != DS or not p.get("targets")):
            problems.append(f"panel {p['id']} {p['title']!r} has no ${{datasource}} query")
        refs = [t["refId"] for t in p.get("targets", [])]
        if len(refs) != len(set(refs)):
            problems.append(f"panel {p['id']} {p['title']!r} repeats a refId")
    for where, expr in queries(dashboard):
        for var in re.findall(r"\$(\w+)", expr):
            if not var.startswith("__") and var not in variables:
                problems.append(f"{where}: unknown variable ${var}")
        names = set(re.findall(r"\b(aithermd_[a-z0-9_]+)", expr))
        for name in sorted(names - metrics):
            problems.append(f"{where}: {name} is not a metric aithermd exports")
    return problems


def _shape_problem(doc: Any) -> str | None:
    """What keeps ``doc`` from being checked as a dashboard, or None."""
    if not isinstance(doc, dict):
        return f"a JSON {type(doc).__name__}, not an object"
    for key, kind in (("panels", list), ("templating", dict)):
        if not isinstance(doc.get(key), kind):
            return f"no '{key}' {'list' if kind is list else 'object'}"
    if not isinstance(doc["templating"].get("list"), list):
        return "no 'templating.list'"
    for i, p in enumerate(doc["panels"]):
        if not (isinstance(p, dict) and isinstance(p.get("gridPos"), dict) and "id" in p and "type" in p):
            return f"panel {i} has no id, type or gridPos"
        for t in p.get("targets", []):
            if not (isinstance(t, dict) and isinstance(t.get("expr"), str) and "refId" in t):
                return f"panel {p['id']} has a target without expr or refId"
    return None


def rules_file(dashboard: dict[str, Any]) -> str:
    """Every query as a recording rule, so `promtool check rules` parses each one."""
    rules = [{"record": f"dashboard:query_{i}", "expr": promql(expr)}
             for i, (_, expr) in enumerate(queries(dashboard))]
    return json.dumps({"groups": [{"name": "aithermd-dashboard-queries", "rules": rules}]}, indent=1)


def render(dashboard: dict[str, Any]) -> str:
    return json.dumps(dashboard, indent=2, ensure_ascii=False) + "\n"


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    sub = parser.add_subparsers(dest="cmd", required=True)
    b = sub.add_parser("build", help="write the dashboard JSON")
    b.add_argument("out", nargs="?", type=Path, default=DEFAULT_OUT)
    c = sub.add_parser("check", help="check a dashboard JSON")
    c.add_argument("file", type=Path)
    c.add_argument("--metrics-source", type=Path, default=DEFAULT_METRICS_SOURCE)
    c.add_argument("--rules", type=Path, help="write the queries as recording rules here (for promtool)")
    args = parser.parse_args(argv)
    if args.cmd == "build":
        args.out.write_text(render(build()))
        return 0
    try:
        dashboard = json.loads(args.file.read_text())
    except (OSError, UnicodeDecodeError) as exc:
        print(f"{args.file}: cannot read it: {exc.strerror if isinstance(exc, OSError) else exc}",
              file=sys.stderr)
        return 2
    except json.JSONDecodeError as exc:
        print(f"{args.file}:{exc.lineno}:{exc.colno}: not JSON: {exc.msg}", file=sys.stderr)
        return 1
    shape = _shape_problem(dashboard)
    if shape is not None:
        print(f"{args.file}: not a Grafana dashboard: {shape} (`dashboard.py build` writes one)", file=sys.stderr)
        return 1
    problems = check(dashboard, exported_metrics(args.metrics_source))
    if render(dashboard) != render(build()):
        problems.append(f"{args.file} differs from what `dashboard.py build` writes: rebuild it")
    for p in problems:
        print(f"{args.file}: {p}", file=sys.stderr)
    if args.rules:
        args.rules.write_text(rules_file(dashboard))
    if not problems:
        print(f"{args.file}: ok")
    return 1 if problems else 0


if __name__ == "__main__":
    sys.exit(main())

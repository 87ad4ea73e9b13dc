"""packaging/fleet/grafana/aithermd.json: what `dashboard.py build` writes, structurally sound, every query
parsed by promtool, only exported metrics, and the panels issue 11 asks for."""

from __future__ import annotations

import json
import subprocess
from pathlib import Path

from _fleet import FLEET, METRICS_SOURCE, dashboard_module, exported_metrics, need_tool

DASHBOARD = FLEET / "grafana" / "aithermd.json"


def load() -> dict:
    return json.loads(DASHBOARD.read_text())


def test_committed_json_is_what_the_builder_writes() -> None:
    mod = dashboard_module()
    assert DASHBOARD.read_text() == mod.render(mod.build()), "run packaging/fleet/grafana/dashboard.py build"


def test_check_finds_no_problem() -> None:
    assert dashboard_module().check(load(), exported_metrics()) == []


def test_check_catches_an_unknown_metric_and_variable() -> None:
    doc = load()
    doc["panels"][1]["targets"][0]["expr"] = 'aithermd_gpu_temprature_celsius{node="$node"}'
    problems = dashboard_module().check(doc, exported_metrics())
    assert any("aithermd_gpu_temprature_celsius is not a metric" in p for p in problems)
    assert any("unknown variable $node" in p for p in problems)


def test_every_query_parses(tmp_path: Path) -> None:
    rules = tmp_path / "queries.yml"
    rules.write_text(dashboard_module().rules_file(load()))
    done = subprocess.run([need_tool("promtool"), "check", "rules", str(rules)], capture_output=True,
                          text=True,
                          timeout=60)
    assert done.returncode == 0, done.stdout + done.stderr
    n = len(dashboard_module().queries(load()))
    assert f"SUCCESS: {n} rules found" in done.stdout


def test_script_check_mode(tmp_path: Path) -> None:
    script = FLEET / "grafana" / "dashboard.py"
    ok = subprocess.run(["python3", str(script), "check", str(DASHBOARD),
                         "--metrics-source", str(METRICS_SOURCE.parent)],
                        capture_output=True, text=True, timeout=60)
    assert (ok.returncode, ok.stderr) == (0, "")
    broken = tmp_path / "broken.json"
    broken.write_text(DASHBOARD.read_text().replace("aithermd_gpu_power_watts", "aithermd_gpu_powr_watts", 1))
    bad = subprocess.run(["python3", str(script), "check", str(broken)], capture_output=True, text=True,
                         timeout=60)
    assert bad.returncode == 1 and "aithermd_gpu_powr_watts is not a metric" in bad.stderr


def test_panels_cover_what_issue_11_asks() -> None:
    exprs = " ".join(e for _, e in dashboard_module().queries(load()))
    for metric in ("aithermd_gpu_temperature_celsius", "aithermd_gpu_power_watts",
                   "aithermd_gpu_power_limit_watts", "aithermd_gpu_energy_joules_total",
                   "aithermd_gpu_clock_event_reason", "aithermd_policy_active",
                   "aithermd_policy_holds", "aithermd_drift_total", "aithermd_faults_total",
                   "aithermd_failsafe_active"):
        assert metric in exprs, metric
    # per node and per GPU: selectable, and in the legends
    names = {v["name"] for v in load()["templating"]["list"]}
    assert {"datasource", "job", "instance", "gpu"} <= names
    legends = [t["legendFormat"] for p in load()["panels"] for t in p.get("targets", [])]
    assert any("{{instance}}" in lg and "{{gpu_index}}" in lg for lg in legends)


def test_importable_by_grafana() -> None:
    doc = load()
    assert doc["uid"] == "aithermd-fleet" and doc["schemaVersion"] >= 36
    # no hard-coded datasource: every panel uses the ${datasource} variable
    assert {json.dumps(p["datasource"]) for p in doc["panels"] if p["type"] != "row"} == {
        json.dumps(dashboard_module().DS)}


def test_energy_by_consumer_panels_group_by_labels_the_exporter_sends() -> None:
    """The per-job, per-unit and per-container panels sum by the consumer label of the exporter's own
    families (a misspelt label would draw an empty panel that promtool still parses); the power budget panel
    reads the budget families; the script's check reads every *metrics.py of aithermd/publish by default."""
    from aithermd.publish.energy_metrics import _FAMILIES

    panels = {p["title"]: p for p in load()["panels"]}
    for title, kind in (("Energy by Slurm job (range)", "job"), ("Energy by systemd unit (range)", "unit"),
                        ("Energy by container (range)", "container")):
        metric, _, labels = _FAMILIES[kind]
        (t,) = panels[title]["targets"]
        assert t["expr"] == (f"topk(10, sum by ({labels[0]}) (increase({metric}_total"
                             f'{{job="$job", instance=~"$instance"}}[$__range]))) / 3.6e6')
        assert t["legendFormat"] == f"{{{{{labels[0]}}}}}" and t["instant"] is True
    budget = " ".join(t["expr"] for t in panels["Power budget against the draw"]["targets"])
    for metric in ("aithermd_power_budget_watts", "aithermd_power_budget_wall_drawn_watts",
                   "aithermd_power_budget_drawn_watts"):
        assert metric in budget
    mod = dashboard_module()
    assert mod.DEFAULT_METRICS_SOURCE.is_dir()
    assert {"aithermd_power_budget_watts", "aithermd_slurm_job_energy_joules_total",
            "aithermd_gpu_power_watts"} <= mod.exported_metrics(mod.DEFAULT_METRICS_SOURCE)


def test_script_check_says_what_is_wrong_with_a_file_that_is_no_dashboard(tmp_path: Path) -> None:
    """An empty file, broken JSON, a list, an object without panels, a missing file: a Python traceback
    each. Now one line naming the file, exit 1 (2: unreadable)."""
    script = FLEET / "grafana" / "dashboard.py"
    cases = {"empty.json": ("", 1, "empty.json:1:1: not JSON: Expecting value"),
             "brace.json": ("{", 1, "brace.json:1:2: not JSON: Expecting property name"),
             "list.json": ("[]", 1, "list.json: not a Grafana dashboard: a JSON list, not an object"),
             "obj.json": ("{}", 1, "obj.json: not a Grafana dashboard: no 'panels' list"),
             "missing.json": (None, 2, "missing.json: cannot read it: No such file or directory")}
    for name, (text, rc, said) in cases.items():
        if text is not None:
            (tmp_path / name).write_text(text)
        done = subprocess.run(["python3", str(script), "check", str(tmp_path / name)], capture_output=True,
                              text=True, timeout=60)
        assert done.returncode == rc and len(done.stderr.splitlines()) == 1, (name, done.stderr)
        assert said in done.stderr and "Traceback" not in done.stderr, (name, done.stderr)
    ok = subprocess.run(["python3", str(script), "check", str(DASHBOARD)], capture_output=True, text=True,
                        timeout=60)
    assert (ok.returncode, ok.stdout) == (0, f"{DASHBOARD}: ok\n")

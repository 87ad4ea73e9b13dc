"""Settings: file < environment < flags; errors name FILE:LINE and the key."""

from __future__ import annotations

from pathlib import Path

import pytest

from aithermd.errors import PolicyErrors
from aithermd.settings import DEFAULT_METRICS_LISTEN, DaemonSettings, load_settings


def test_defaults():
    s = DaemonSettings()
    assert s.tick_s == 1.0 and s.policy == "balanced" and not s.policy_pinned
    assert s.state_dir == Path("/var/lib/aithermd") and s.bus == "system"
    assert s.metrics_listen == DEFAULT_METRICS_LISTEN
    port = int(DEFAULT_METRICS_LISTEN.rpartition(":")[2])
    assert DEFAULT_METRICS_LISTEN.startswith("127.0.0.1:") and not 9090 <= port <= 10100


def test_flags_override_the_file(tmp_path, monkeypatch):
    monkeypatch.delenv("AITHERMD_TICK_S", raising=False)
    cfg = tmp_path / "aithermd.yaml"
    cfg.write_text("tick_s: 2.5\npolicy: quiet\nstate_dir: /tmp/x\nmetrics_listen: none\n")
    s = load_settings(cfg, {"tick_s": 0.5, "policy": None, "dry_run": True})
    assert s.tick_s == 0.5 and s.policy == "quiet" and not s.policy_pinned
    assert s.state_dir == Path("/tmp/x") and s.metrics_listen == "none" and s.dry_run
    pinned = load_settings(cfg, {"policy": "ai-training"})
    assert pinned.policy == "ai-training" and pinned.policy_pinned


def test_environment_between_file_and_flags(tmp_path, monkeypatch):
    cfg = tmp_path / "c.yaml"
    cfg.write_text("tick_s: 2.5\n")
    monkeypatch.setenv("AITHERMD_TICK_S", "3")
    assert load_settings(cfg).tick_s == 3.0
    assert load_settings(cfg, {"tick_s": 4.0}).tick_s == 4.0


def test_policy_dir_flags_are_appended(tmp_path):
    cfg = tmp_path / "c.yaml"
    cfg.write_text(f"policy_dirs: [{tmp_path / 'a'}]\n")
    s = load_settings(cfg, {"policy_dirs": [str(tmp_path / "b")]})
    assert s.policy_dirs == [tmp_path / "a", tmp_path / "b"]


def test_invalid_file_names_file_line_and_key(tmp_path):
    cfg = tmp_path / "bad.yaml"
    cfg.write_text("tick_s: 1\nsate_dir: /x\nbus: nowhere\ntick_s_: 3\n")
    with pytest.raises(PolicyErrors) as info:
        load_settings(cfg)
    text = str(info.value)
    assert f"{cfg}:2:1: error: sate_dir: unknown setting (hint: did you mean 'state_dir'?)" in text
    assert f"{cfg}:3:1: error: bus:" in text


def test_port_zero_means_any_free_port():
    assert load_settings(None, {"metrics_listen": "127.0.0.1:0"}).metrics_listen == "127.0.0.1:0"


def test_bad_flag_is_named_as_the_flag(tmp_path):
    with pytest.raises(PolicyErrors, match="--metrics-listen: error: metrics_listen: .*HOST:PORT"):
        load_settings(None, {"metrics_listen": "nocolon"})


def test_unreadable_and_non_mapping_files(tmp_path):
    with pytest.raises(PolicyErrors, match="cannot read"):
        load_settings(tmp_path / "missing.yaml")
    (tmp_path / "list.yaml").write_text("- 1\n")
    with pytest.raises(PolicyErrors, match="must be a mapping"):
        load_settings(tmp_path / "list.yaml")
    (tmp_path / "broken.yaml").write_text("a: [1\n")
    with pytest.raises(PolicyErrors, match="broken.yaml:2:1: error: not valid YAML"):
        load_settings(tmp_path / "broken.yaml")


def test_environment_reads_only_settings_and_names_itself_in_errors(tmp_path, monkeypatch):
    monkeypatch.setenv("AITHERMD_SLURM_CONF", "/dev/null")  # another program's variable: ignored
    monkeypatch.setenv("aithermd_policy_dirs", f'["{tmp_path / "a"}"]')  # any case; a JSON list
    monkeypatch.setenv("AITHERMD_DRY_RUN", "true")
    s = load_settings(None, {})
    assert s.policy_dirs == [tmp_path / "a"] and s.dry_run is True
    cfg = tmp_path / "c.yaml"
    cfg.write_text("tick_s: 2\n")
    monkeypatch.setenv("AITHERMD_TICK_S", "fast")  # overrides the file's good value: the variable is wrong
    with pytest.raises(PolicyErrors) as info:
        load_settings(cfg)
    assert "AITHERMD_TICK_S: error: tick_s:" in str(info.value)
    monkeypatch.setenv("AITHERMD_POLICY_DIRS", "/etc/x")
    with pytest.raises(PolicyErrors, match="AITHERMD_POLICY_DIRS.*not JSON"):
        load_settings(None, {})


@pytest.mark.parametrize("values", [
    {}, {"tick_s": 2, "energy_top_n": 0, "energy_cost_per_kwh": 0.3, "energy_currency": "EUR"},
    {"sysfs_root": "/tmp/sys", "state_dir": Path("/tmp/st"), "policy_dirs": ["/a", Path("/b")],
     "config_file": "/etc/x.yaml", "names": {"hwmon:nct6798-isa-0290/pwm2": "CPU fan"}},
    {"bus": "unix:path=/run/x", "metrics_listen": "[::1]:0", "log_format": "json", "log_level": "debug",
     "energy_interval_s": 0, "nvml": False, "dry_run": True, "policy": "quiet", "policy_pinned": True}])
def test_values_checked_without_pydantic_are_what_the_model_gives(values):
    from aithermd.settings_model import validated
    quick = DaemonSettings(**values)
    assert {k: getattr(quick, k) for k in validated({})} == validated(values)


def test_typed_settings_import_no_pydantic_and_text_is_coerced_by_the_model():
    import subprocess
    import sys
    code = ("import sys; from aithermd.settings import DaemonSettings as D; "
            "s = D(tick_s=0.5, sysfs_root='/x', names={'hwmon:a/pwm1': 'CPU'}); "
            "print('pydantic' in sys.modules, s.tick_s, s.sysfs_root); "
            "t = D(tick_s='3', nvml='false'); print('pydantic' in sys.modules, t.tick_s, t.nvml)")
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True).stdout
    assert out.split("\n")[:2] == ["False 0.5 /x", "True 3.0 False"]

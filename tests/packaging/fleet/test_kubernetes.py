"""packaging/fleet/kubernetes: valid against the Kubernetes schemas (kubernetes-validate, strict), privileged
nowhere, host /sys and NVIDIA devices, metrics port with scrape annotations, a config the daemon accepts."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path
from typing import Any

import pytest
from _fleet import FLEET
from ruamel.yaml import YAML

from aithermd.settings import load_settings

MANIFEST = FLEET / "kubernetes" / "aithermd-daemonset.yaml"


def docs() -> dict[str, dict[str, Any]]:
    return {d["kind"]: d for d in YAML(typ="safe").load_all(MANIFEST.read_text())}


def validate(path: Path) -> subprocess.CompletedProcess[str]:
    tool = Path(sys.executable).parent / "kubernetes-validate"
    if not tool.exists():
        pytest.skip("kubernetes-validate is not installed (pip install -e '.[dev]')")
    return subprocess.run([str(tool), "--strict", str(path)], capture_output=True, text=True, timeout=120)


def test_kubernetes_validate_strict() -> None:
    done = validate(MANIFEST)
    assert done.returncode == 0, done.stdout + done.stderr
    assert done.stdout.count("passed for resource") == 3


def test_validation_would_catch_a_typo(tmp_path: Path) -> None:
    broken = tmp_path / "broken.yaml"
    broken.write_text(MANIFEST.read_text().replace("readOnlyRootFilesystem:", "readOnlyRootFileSystem:", 1))
    assert validate(broken).returncode != 0


def pod() -> dict[str, Any]:
    return docs()["DaemonSet"]["spec"]["template"]


def test_privileged_nowhere_and_only_sys_admin() -> None:
    spec = pod()["spec"]
    for c in spec["initContainers"] + spec["containers"]:
        sc = c["securityContext"]
        assert sc["privileged"] is False and sc["allowPrivilegeEscalation"] is False
        assert sc["capabilities"] == {"drop": ["ALL"], "add": ["SYS_ADMIN"]}
        assert sc["readOnlyRootFilesystem"] is True and sc["seccompProfile"]["type"] == "RuntimeDefault"
    assert not spec["hostNetwork"] and not spec["hostPID"] and not spec["hostIPC"]
    assert spec["automountServiceAccountToken"] is False


def test_host_sys_and_nvidia_devices() -> None:
    spec = pod()["spec"]
    volumes = {v["name"]: v for v in spec["volumes"]}
    assert volumes["host-sys"]["hostPath"]["path"] == "/sys"
    mounts = {m["name"]: m for m in spec["containers"][0]["volumeMounts"]}
    assert mounts["host-sys"]["mountPath"] == "/host/sys" and not mounts["host-sys"].get("readOnly")
    assert spec["runtimeClassName"] == "nvidia"
    env = {e["name"]: e["value"] for e in spec["containers"][0]["env"]}
    assert env == {"NVIDIA_VISIBLE_DEVICES": "all", "NVIDIA_DRIVER_CAPABILITIES": "utility"}
    # the journal lives on the host, and the init container restores it before the daemon starts
    assert volumes["state"]["hostPath"]["path"] == "/var/lib/aithermd"
    assert spec["initContainers"][0]["command"][:2] == ["aithermd", "restore"]


def test_metrics_port_and_scrape_annotations(tmp_path: Path) -> None:
    template = pod()
    notes = template["metadata"]["annotations"]
    port = template["spec"]["containers"][0]["ports"][0]
    assert notes == {"prometheus.io/scrape": "true", "prometheus.io/port": str(port["containerPort"]),
                     "prometheus.io/path": "/metrics"}
    config = tmp_path / "aithermd.yaml"
    config.write_text(docs()["ConfigMap"]["data"]["aithermd.yaml"])
    settings = load_settings(config)
    assert settings.metrics_listen == f"0.0.0.0:{port['containerPort']}"
    assert str(settings.sysfs_root) == "/host/sys" and settings.bus == "none"
    assert template["spec"]["containers"][0]["command"][-1] == "/etc/aithermd/aithermd.yaml"

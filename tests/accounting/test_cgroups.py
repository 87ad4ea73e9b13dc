"""/proc/PID/cgroup files recorded on real systems (tests/fixtures/proc-cgroup/SOURCES.md) → unit, Slurm job,
container and pod."""

from __future__ import annotations

from pathlib import Path

import pytest

from aithermd.accounting.cgroups import ROOT, parse_cgroup

FIXTURES = Path(__file__).resolve().parent.parent / "fixtures" / "proc-cgroup"

EXPECTED = {  # file → (unit, slurm job, slurm step, container (runtime:first 12), pod)
    "docker-systemd-v2": ("docker-b508e2673897c4f521d858f56dab18e31ddbfc1f83300fb9793c8a4052af8f05.scope",
                          None, None, "docker:b508e2673897", None),
    "docker-cgroupfs-v1": ("containerd.service", None, None, "docker:2403ccfe427f", None),
    "docker-v1-session-systemd": ("session-128207.scope", None, None, "docker:c8cef9e2ff11", None),
    "k8s-crio-systemd-v1": ("crio-5eed917563583925ffdbd40a64efb2aaffe58638e57add8becaf460fe74f5b1c.scope",
                            None, None, "cri-o:5eed91756358", "a5c1f8d5-1919-434d-add7-4afaafdaef89"),
    "k8s-containerd-v1-colon": ("containerd.service", None, None, "containerd:ee4b20e90ac7",
                                "0125ec2f-b64a-4868-8f5b-94b56cbab864"),
    "k8s-docker-systemd-v2": ("docker-d0b3604b67ac7930dd34ba3a796627e3e4717d12309e90a4afe3f38b6816ac98.scope",
                              None, None, "docker:d0b3604b67ac", "7d4424e6-bb13-42f4-a47a-45a4828bf54d"),
    "k8s-kind-containerd-v2": (
        "cri-containerd-a09bc17f5aa29b0dbdec9ede5f46cf1396d2405917ab02e6f1eb1019f388396e.scope", None, None,
        "containerd:a09bc17f5aa2", "1e597579-417e-482f-bf65-5fe170c3aebd"),
    "k8s-cgroupfs-v2": (None, None, None, "container:7dea796eb5d6", "1ff47ee6-9685-4726-ac6f-0ff070c452d6"),
    "k8s-static-pod-v2": (
        "cri-containerd-2884d57c0e100d7a9a2f9487ce0bc2986bca3430e988af7a4865aff061f51ac5.scope", None, None,
        "containerd:2884d57c0e10", "8daa50c3a64c9ff60bb9eab7b44b56fd"),
    "slurm-v1": ("slurmd.service", 13759490, "batch", None, None),
    "slurm-v2-batch": ("slurmstepd.scope", 4749, "batch", None, None),
    "slurm-v2-multi-slurmd": ("slurm-worker-1_slurmstepd.scope", 4749, "0", None, None),
    "user-session-v2": ("session-2.scope", None, None, None, None),
    "gnome-terminal-v2": ("vte-spawn-f22f14d2-3d44-4304-9879-3fdd0df7b08e.scope", None, None, None, None),
    "podman-unshare-v2": ("podman-6696.scope", None, None, None, None),
    "system-service-v2": ("ollama.service", None, None, None, None),
    "build-vm-hybrid": (None, None, None, None, None),
    "root-v2": (None, None, None, None, None),
}


def test_every_fixture_is_checked():
    assert {p.stem for p in FIXTURES.glob("*.cgroup")} == set(EXPECTED)


@pytest.mark.parametrize("name", sorted(EXPECTED))
def test_recorded_shapes(name):
    ident = parse_cgroup((FIXTURES / f"{name}.cgroup").read_text())
    assert (ident.unit, ident.slurm_job, ident.slurm_step, ident.container_short, ident.pod) == EXPECTED[name]


def test_main_path_and_slice():
    v2 = parse_cgroup((FIXTURES / "slurm-v2-batch.cgroup").read_text())
    assert v2.path == "/system.slice/slurmstepd.scope/job_4749/step_batch/user/task_0"
    assert v2.slice == "system.slice"
    hybrid = parse_cgroup((FIXTURES / "build-vm-hybrid.cgroup").read_text())
    assert hybrid.path == "/process_api/9dcbee405cbd0bbd466a6dae6aed82bc"  # the unified line is the root
    assert parse_cgroup((FIXTURES / "root-v2.cgroup").read_text()) == ROOT


@pytest.mark.parametrize("text", ["", "garbage", "0::relative/path\n", "x:y\n", "\x00\x01", "0::/a/job_x/\n"])
def test_malformed_never_raises(text):
    ident = parse_cgroup(text)
    assert ident.slurm_job is None and ident.container is None


def test_a_job_number_needs_the_job_component():
    assert parse_cgroup("0::/user.slice/myjob_12.scope\n").slurm_job is None
    assert parse_cgroup("0::/system.slice/slurmstepd.scope/job_7/step_extern\n").slurm_step == "extern"


def test_identity_from_a_proc_tree(tmp_path):
    from aithermd.accounting.procs import ProcReader

    d = tmp_path / "4711"
    d.mkdir()
    (d / "status").write_text("Name:\tpython\nUid:\t0\t0\t0\t0\n")
    (d / "comm").write_text("python\n")
    (d / "cmdline").write_bytes(b"python\0train.py\0--name=\x1b[2J\0")
    (d / "cgroup").write_text((FIXTURES / "build-vm-hybrid.cgroup").read_text())
    # Slurm with proctrack/linuxproc (seen with slurmd 22.05 here): the job is only in the environment
    (d / "environ").write_bytes(b"HOME=/root\0SLURM_JOB_ID=2\0SLURM_JOBID=2\0")
    info = ProcReader(tmp_path).identity(4711, 1.0, ppid=1)
    assert info.user == "root" and info.comm == "python" and info.cgroup.slurm_job == 2
    assert info.cmdline == "python train.py --name=?[2J"  # no escape sequence reaches a terminal
    (d / "environ").write_bytes(b"XSLURM_JOB_ID=9\0")
    assert ProcReader(tmp_path).identity(4711, 1.0).cgroup.slurm_job is None
    gone = ProcReader(tmp_path).identity(999, 1.0)
    assert not gone.visible and gone.cgroup == ROOT

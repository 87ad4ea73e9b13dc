"""What a process's ``/proc/PID/cgroup`` says about where it runs: systemd unit, Slurm job, container, pod.

Pure: text in, :class:`CgroupIdentity` out. Source of the facts: the kernel's ``cgroup(7)`` format
(``hierarchy-ID:controller-list:path``, one line per hierarchy; ``0::path`` is the unified v2 hierarchy)
and the layouts real systems use (recorded examples in ``tests/fixtures/proc-cgroup/``):

- systemd: units are path components ending in ``.service`` or ``.scope``, inside ``.slice`` components;
  the innermost unit is the process's (``user@1000.service/app.slice/app-….scope`` → the scope);
- Slurm: ``job_N`` and ``step_X`` components, under ``/slurm[_node]/uid_N/`` (cgroup v1) or
  ``[node_]slurmstepd.scope/`` (v2);
- containers: a 64-hex id (32 hex on old Docker) in ``docker-ID.scope``, ``cri-containerd-ID.scope``,
  ``crio-ID.scope``, ``libpod-ID.scope``, ``/docker/ID``, a bare ``/kubepods/…/podUID/ID``, or cgroup v1
  names like ``…slice:cri-containerd:ID``;
- Kubernetes pods: ``podUID`` (dashes, or underscores in systemd slice names; 32 hex for static pods).

With several hierarchies (v1, hybrid) every path is read: the unified one first, then ``name=systemd``,
then the controllers; the first that names a unit gives the unit, any may give the job or container (a
Docker container under cgroup v1 often shows the login session in ``name=systemd`` and itself elsewhere).
"""

from __future__ import annotations

import re
from dataclasses import dataclass

_UNIT = re.compile(r"^[^/]+\.(?:service|scope)$")
_JOB = re.compile(r"(?:^|/)job_(\d+)(?:/step_([A-Za-z0-9_]+))?")
_POD = re.compile(r"pod([0-9a-f]{8}[-_][0-9a-f]{4}[-_][0-9a-f]{4}[-_][0-9a-f]{4}[-_][0-9a-f]{12}"
                  r"|[0-9a-f]{32})(?=[./:]|$)")
_RUNTIMES = (("cri-containerd", "containerd"), ("containerd", "containerd"), ("docker", "docker"),
             ("crio", "cri-o"), ("libpod", "podman"))
_CONTAINER = re.compile(r"(?:(cri-containerd|containerd|docker|crio|libpod)[-:])?([0-9a-f]{64}|[0-9a-f]{32})"
                        r"(?:\.scope)?$")


@dataclass(frozen=True, slots=True)
class CgroupIdentity:
    """Where a process runs. ``path``: its main cgroup (``/`` for the root); ``unit``: innermost systemd
    service or scope; ``slice``: innermost slice; ``slurm_job``/``slurm_step``; ``container``
    (``runtime:ID`` with the full id; runtime ``container`` when the layout does not say) and ``pod``
    (Kubernetes pod UID, with dashes)."""

    path: str = "/"
    unit: str | None = None
    slice: str | None = None
    slurm_job: int | None = None
    slurm_step: str | None = None
    container: str | None = None
    pod: str | None = None

    @property
    def container_short(self) -> str | None:
        """``runtime:`` and the first 12 hex digits (as ``docker ps`` shows ids)."""
        if self.container is None:
            return None
        runtime, _, cid = self.container.partition(":")
        return f"{runtime}:{cid[:12]}"


ROOT = CgroupIdentity()


def _paths(text: str) -> list[str]:
    """Every hierarchy's path, unified first, then name=systemd, then the controllers in file order."""
    unified: list[str] = []
    systemd: list[str] = []
    others: list[str] = []
    for line in text.splitlines():
        parts = line.strip().split(":", 2)
        if len(parts) != 3:
            continue
        hid, controllers, path = parts
        path = path.strip()
        if not path.startswith("/"):
            continue
        if hid == "0" and controllers == "":
            unified.append(path)
        elif controllers == "name=systemd":
            systemd.append(path)
        else:
            others.append(path)
    return list(dict.fromkeys(unified + systemd + others))


def parse_cgroup(text: str) -> CgroupIdentity:
    """The identity in the content of a ``/proc/PID/cgroup`` file (``ROOT`` when it names nothing). Never
    raises: malformed lines are skipped."""
    paths = _paths(text)
    main = next((p for p in paths if p != "/"), "/")
    unit = slice_ = job_step = container = pod = None
    job: int | None = None
    for path in paths:
        components = [c for c in path.split("/") if c]
        if unit is None:
            names = [c for c in components if _UNIT.match(c) and not c.endswith(".slice")]
            unit = names[-1] if names else None
            slices = [c for c in components if c.endswith(".slice") and ":" not in c]
            slice_ = slices[-1] if slices else slice_
        if job is None:
            m = _JOB.search(path)
            if m:
                job, job_step = int(m.group(1)), m.group(2)
        if pod is None:
            m = _POD.search(path)
            if m:
                pod = m.group(1).replace("_", "-")
        if container is None:
            container = _container(components)
    return CgroupIdentity(main, unit, slice_, job, job_step, container, pod)


def _container(components: list[str]) -> str | None:
    for i in range(len(components) - 1, -1, -1):
        comp = components[i]
        tail = comp.rsplit(":", 2)
        if len(tail) == 3 and tail[1] in dict(_RUNTIMES):  # v1 "…slice:cri-containerd:ID"
            comp = f"{tail[1]}-{tail[2]}"
        m = _CONTAINER.search(comp)
        if m is None or m.start() != 0:
            continue
        prefix, cid = m.group(1), m.group(2)
        if prefix is not None:
            return f"{dict(_RUNTIMES)[prefix]}:{cid}"
        parent = components[i - 1] if i else ""
        if parent == "docker":
            return f"docker:{cid}"
        if parent.startswith("pod") or len(cid) == 64:
            return f"container:{cid}"
    return None

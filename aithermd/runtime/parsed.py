"""The policy files' parsed documents, remembered in the state directory between starts.

Parsing a policy's YAML with its line and column marks (ruamel.yaml round-trip mode) is most of what a
policy load costs: about 0.1 s of CPU for the shipped files on a small machine, at every start and reload.
The loader takes the plain documents of earlier parses by the SHA-256 of each file's text
(:func:`aithermd.policy.loader.load_policies` ``parsed=``) and validates a file found there without parsing
it; this module keeps those documents in ``<state_dir>/policies.parsed.json`` (0600, written atomically,
only when they change, only the entries of the files just loaded).

A file not found there is parsed and validated in a short-lived child process (:func:`load_lean`: ``python
-m aithermd.runtime.parsed``), which hands back the documents of the valid files and the errors of the
broken ones, so that the long-running daemon never imports pydantic or ruamel.yaml, not even at its first
start or at a reload after an edit (they would stay in its memory for good). A process that has already
imported pydantic (a test, ``aithermd check``) validates in-process, as does the daemon when the child
cannot run.

An entry is found only by the hash of the text read now, its document is validated by the same schema and
reference checks, and any problem on that path sends the file through the full parse, whose errors carry
FILE:LINE:COL: a document is a pure function of the text, so a changed schema gives the same answer either
way. The file is trusted as the journal beside it is (whoever can write the state directory can already
restore knobs): a file that is not ours (unreadable, not JSON, another format, or, for a daemon running as
root, one that a non-root user could have written) is ignored and written anew. ``--dry-run`` reads it and
writes nothing.
"""

from __future__ import annotations

import json
import subprocess
import sys
from collections.abc import Callable, Collection, Iterable, Mapping, MutableMapping, Sequence
from pathlib import Path
from typing import Any

import structlog

from aithermd.errors import PolicyError, PolicyErrors
from aithermd.files import read_regular

FILE_NAME = "policies.parsed.json"
FORMAT = 1
MAX_BYTES = 8 << 20  # the loader's limit is 1 MiB per policy file; a few policies' documents fit easily
CHILD_TIMEOUT_S = 120.0  # a parse of the largest files the loader takes is well under a second
ERROR_FIELDS = ("path", "message", "line", "col", "key", "hint")

log = structlog.get_logger("aithermd.policy")


def read(state_dir: Path, *, strict_permissions: bool) -> dict[str, Any]:
    """The remembered documents by text digest; {} when there are none or the file is not to be used."""
    path = Path(state_dir) / FILE_NAME
    try:
        raw = read_regular(path, MAX_BYTES)
    except OSError:
        return {}
    if strict_permissions:
        from aithermd.policy.loader import permission_problems
        problems = permission_problems(path) + permission_problems(path.parent)
        if problems:
            log.warning("parsed policies ignored", path=str(path), problem=problems[0])
            return {}
    try:
        doc = json.loads(raw) if len(raw) <= MAX_BYTES else None
    except ValueError:
        doc = None
    if not isinstance(doc, dict) or doc.get("format") != FORMAT or not isinstance(doc.get("entries"), dict):
        return {}
    return dict(doc["entries"])


def keep(state_dir: Path, before: Mapping[str, Any], parsed: Mapping[str, Any],
         digests: Iterable[str]) -> None:
    """Write the entries of ``digests`` (the files just loaded) when they differ from ``before`` (what
    :func:`read` gave). An entry that JSON cannot carry exactly (a YAML timestamp, a non-string key) is left
    out: its file is parsed at each load, as before. Never raises: remembering is only an optimisation."""
    entries = {}
    for digest in digests:
        doc = parsed.get(digest)
        if doc is None:
            continue
        try:
            if json.loads(json.dumps(doc, allow_nan=False)) != doc:
                continue
        except (TypeError, ValueError):
            continue
        entries[digest] = doc
    if entries == dict(before):
        return
    from aithermd.actuate.journal import write_atomically
    try:
        data = json.dumps({"format": FORMAT, "entries": entries}, separators=(",", ":"), sort_keys=True)
        write_atomically(Path(state_dir) / FILE_NAME, data.encode(), mode=0o600)
    except (OSError, ValueError) as exc:
        log.debug("parsed policies not kept", path=str(Path(state_dir) / FILE_NAME), error=str(exc))


def lean(load: Callable[..., Any]) -> bool:
    """Whether loading with ``load`` should parse in a child: the real loader, in a process that has not
    imported pydantic (a test's stub engine, or a process that already paid for pydantic, parses itself)."""
    return getattr(load, "__module__", "") == "aithermd.policy.loader" and "pydantic" not in sys.modules


def load_lean(load: Callable[..., Any], dirs: Sequence[Path], *, strict_permissions: bool,
              skip: Collection[str], found: MutableMapping[str, Any]) -> Mapping[str, Any] | None:
    """``load(dirs, ...)`` (the loader's ``load_policies``) from ``found`` alone, the files missing there
    parsed by a child process first (their documents added to ``found``). Raises PolicyErrors as the
    loader does (the child's errors, FILE:LINE:COL); None when the child could not run or did not cover
    every file (the caller then loads in-process)."""
    from aithermd.policy.loader import NotParsed

    def from_found() -> Mapping[str, Any]:
        return load(list(dirs), strict_permissions=strict_permissions, skip=skip, parsed=found,
                    only_parsed=True)

    try:
        return from_found()
    except NotParsed:
        pass
    request = {"dirs": [str(d) for d in dirs], "strict": strict_permissions, "skip": sorted(skip)}
    try:
        proc = subprocess.run([sys.executable, "-m", "aithermd.runtime.parsed"], input=json.dumps(request),
                              capture_output=True, text=True, timeout=CHILD_TIMEOUT_S, check=False)
        answer = json.loads(proc.stdout) if proc.returncode == 0 else None
        entries, errors = answer["entries"], [PolicyError(**e) for e in answer["errors"]]
    except (OSError, subprocess.SubprocessError, ValueError, TypeError, KeyError) as exc:
        log.warning("policy parse in a child failed; parsing in the daemon", error=str(exc)[:200])
        return None
    found.update(entries)
    if errors:
        raise PolicyErrors(errors)
    try:
        return from_found()
    except NotParsed:
        return None


def _child() -> int:
    """The child of :func:`load_lean`: the request (JSON) on stdin; the documents of the valid files and
    the errors of the others (JSON) on stdout. Logs go to stderr, which the daemon drops (its own pass
    over the documents logs what the loader logs)."""
    out, sys.stdout = sys.stdout, sys.stderr
    from aithermd.policy.loader import load_policies

    request = json.loads(sys.stdin.read())
    found: dict[str, Any] = {}
    errors: list[dict[str, Any]] = []
    try:
        load_policies([Path(d) for d in request["dirs"]], strict_permissions=bool(request["strict"]),
                      skip=frozenset(request["skip"]), parsed=found)
    except PolicyErrors as exc:
        errors = [{k: getattr(e, k) for k in ERROR_FIELDS} for e in exc.errors]
    out.write(json.dumps({"entries": found, "errors": errors}))
    return 0


if __name__ == "__main__":
    sys.exit(_child())

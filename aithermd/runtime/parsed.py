"""The policies' validated documents, kept in the state directory between starts, and parsed off-process.

A policy load costs the YAML parse with line and column marks (ruamel.yaml round-trip mode), pydantic and
its validators: about 0.2 s of CPU and 14 MB that a long-running daemon would keep for good. The loader
hands out documents as plain nodes (:mod:`aithermd.policy.kinds`) and takes their JSON form by the hash of
the schema and each file's text (:func:`aithermd.policy.loader.load_policies` ``parsed=``); this module
keeps those in ``<state_dir>/policies.parsed.json`` (0600, written atomically, only when they change, only
the entries of the files just loaded).

A file not found there may be a shipped policy as aithermd ships it: their documents, validated when this
version was made, are package data (:data:`SHIPPED`, by the same digests; :func:`shipped`, written by
``scripts/shipped-parsed`` and held current by a test), so that a first start on an empty state directory
parses only the admin's own files. The data is trusted as the code beside it is; an admin's edit of a
shipped file changes its digest, and the file is parsed.

A file found in neither is parsed and validated in a short-lived child process (:func:`load_lean`,
:func:`_child_command`), which hands back the documents of the valid files and the errors of the broken
ones (FILE:LINE:COL, as the loader words them), so that the daemon never imports pydantic or ruamel.yaml,
not even at its first start or at a reload after an edit. A process that has already imported pydantic (a
test, ``aithermd check``) validates in-process, as does the daemon when the child cannot run.

An entry is found only by the hash of the text read now and of the schema's sources and version, so an
edited file or an upgraded aithermd is parsed again. The file is trusted as the journal beside it is
(whoever can write the state directory can already restore knobs): a file that is not ours (unreadable, not
JSON, another format, owned by another user than the daemon's or root, writable by every user, or, for a
daemon running as root, one that a non-root user could have written) is ignored and written anew; an entry
that does not decode sends its file through the full parse.
``--dry-run`` reads it and writes nothing.
"""

from __future__ import annotations

import json
import sys
import types
from collections.abc import Callable, Collection, Iterable, Mapping, MutableMapping, Sequence
from pathlib import Path
from typing import Any

from aithermd.errors import PolicyError, PolicyErrors
from aithermd.files import UntrustedStateFile, read_regular, read_state_file

FILE_NAME = "policies.parsed.json"
FORMAT = 1
SHIPPED = ("data", "shipped-policies.parsed.json")  # under the aithermd package
MAX_BYTES = 8 << 20  # the loader's limit is 1 MiB per policy file; a few policies' documents fit easily
CHILD_TIMEOUT_S = 120.0  # a parse of the largest files the loader takes is well under a second
ERROR_FIELDS = ("path", "message", "line", "col", "key", "hint")



def _log() -> Any:
    """The daemon's logger, imported here: the parser child imports this module and logs nothing (structlog
    and asyncio cost it ~70 ms of its start)."""
    import structlog

    return structlog.get_logger("aithermd.policy")


def read(state_dir: Path, *, strict_permissions: bool) -> dict[str, Any]:
    """The remembered documents by text digest; {} when there are none or the file is not to be used."""
    path = Path(state_dir) / FILE_NAME
    try:  # a state file as the journal's: ours (or root's), writable by nobody else, no symlink
        raw = read_state_file(path, MAX_BYTES)
    except UntrustedStateFile as exc:
        _log().warning("parsed policies ignored", path=str(path), problem=exc.strerror)
        return {}
    except OSError:
        return {}
    problems = []
    if strict_permissions:  # a root daemon's: root-owned, as its policy files
        from aithermd.policy.loader import permission_problems
        problems = permission_problems(path) + permission_problems(path.parent)
    if problems:
        _log().warning("parsed policies ignored", path=str(path), problem=problems[0])
        return {}
    return _entries(raw)


def _entries(raw: bytes) -> dict[str, Any]:
    try:
        doc = json.loads(raw) if len(raw) <= MAX_BYTES else None
    except ValueError:
        doc = None
    if not isinstance(doc, dict) or doc.get("format") != FORMAT or not isinstance(doc.get("entries"), dict):
        return {}
    return dict(doc["entries"])


def shipped() -> dict[str, Any]:
    """The documents of the shipped policies as this version ships them (package data, :data:`SHIPPED`), by
    text digest; {} when the data is missing or not ours."""
    import aithermd
    try:
        return _entries(read_regular(Path(aithermd.__file__).resolve().parent.joinpath(*SHIPPED), MAX_BYTES))
    except OSError:
        return {}


def shipped_text(dirs: Sequence[Path]) -> str:
    """The text of :data:`SHIPPED` for the policies in ``dirs`` (the shipped ones): each valid file's
    document, validated in this process (imports pydantic), as :func:`keep` would keep it. Raises
    PolicyErrors."""
    from aithermd.policy.loader import load_policies

    found: dict[str, Any] = {}
    load_policies(list(dirs), parsed=found)
    entries = {k: v for k, v in found.items() if _carried(v)}
    return json.dumps({"format": FORMAT, "entries": entries}, indent=0, sort_keys=True) + "\n"


def _carried(doc: Any) -> bool:
    """Whether JSON carries ``doc`` exactly (a YAML timestamp or a non-string key it does not)."""
    try:
        return bool(json.loads(json.dumps(doc, allow_nan=False)) == doc)
    except (TypeError, ValueError):
        return False


def keep(state_dir: Path, before: Mapping[str, Any], parsed: Mapping[str, Any],
         digests: Iterable[str]) -> None:
    """Write the entries of ``digests`` (the files just loaded) when they differ from ``before`` (what
    :func:`read` gave). An entry that JSON cannot carry exactly (a YAML timestamp, a non-string key) is left
    out: its file is parsed at each load, as before. Never raises: remembering is only an optimisation."""
    entries = {}
    for digest in digests:
        doc = parsed.get(digest)
        if doc is not None and _carried(doc):
            entries[digest] = doc
    if entries == dict(before):
        return
    from aithermd.actuate.journal import write_atomically
    try:
        data = json.dumps({"format": FORMAT, "entries": entries}, separators=(",", ":"), sort_keys=True)
        write_atomically(Path(state_dir) / FILE_NAME, data.encode(), mode=0o600)
    except (OSError, ValueError) as exc:
        _log().debug("parsed policies not kept", path=str(Path(state_dir) / FILE_NAME), error=str(exc))


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
    extra = {k: v for k, v in shipped().items() if k not in found}  # a first start: the shipped documents
    if extra:
        found.update(extra)
        try:
            return from_found()
        except NotParsed:
            pass
    import subprocess  # here: the child imports this module and starts nothing

    # the documents already found go along: the child parses and validates only the files missing there
    request = {"dirs": [str(d) for d in dirs], "strict": strict_permissions, "skip": sorted(skip),
               "known": dict(found)}
    try:
        proc = subprocess.run(_child_command(), input=json.dumps(request), capture_output=True, text=True,
                              timeout=CHILD_TIMEOUT_S, check=False, cwd="/")
        answer = json.loads(proc.stdout) if proc.returncode == 0 else None
        entries, errors = answer["entries"], [PolicyError(**e) for e in answer["errors"]]
    except (OSError, subprocess.SubprocessError, ValueError, TypeError, KeyError) as exc:
        _log().warning("policy parse in a child failed; parsing in the daemon", error=str(exc)[:200])
        return None
    found.update(entries)
    if errors:
        raise PolicyErrors(errors)
    try:
        return from_found()
    except NotParsed:
        return None


def _child_command() -> list[str]:
    """This interpreter running :func:`_child` from the aithermd the daemon itself runs: ``-P`` and cwd ``/``
    keep the working directory off ``sys.path`` (a root daemon started in a directory others can write must
    not import a planted ``aithermd``), and the directory this package was imported from is put first."""
    import aithermd
    home = str(Path(aithermd.__file__).resolve().parent.parent)
    # gc off: a short-lived parse, spared ~70 cyclic-garbage passes over pydantic's import (~6 % of its CPU)
    code = (f"import gc; gc.disable(); import sys; sys.path.insert(0, {home!r}); "
            "from aithermd.runtime.parsed import _child; sys.exit(_child())")
    return [sys.executable, "-P", "-c", code]


def _child() -> int:
    """The child of :func:`load_lean`: the request (JSON) on stdin; the documents of the valid files not
    ``known`` to the daemon already and the errors of the others (JSON) on stdout. A file whose document is
    known is taken from it, not parsed or validated again. Logs go to stderr, which the daemon drops (its
    own pass over the documents logs what the loader logs)."""
    out, sys.stdout = sys.stdout, sys.stderr
    # pydantic looks for plugins when it builds a validator: the entry points of every installed distribution
    # (importlib.metadata and email: ~17 ms of this child's ~0.17 s of CPU, issue 22); the parser runs none,
    # as PYDANTIC_DISABLE_PLUGINS=__all__ would say without sparing the imports
    plugins = types.ModuleType("pydantic.plugin._loader")
    plugins.get_plugins = lambda: ()  # type: ignore[attr-defined]
    sys.modules.setdefault(plugins.__name__, plugins)
    from aithermd.policy.loader import load_policies

    request = json.loads(sys.stdin.read())
    known = request.get("known") or {}
    found: dict[str, Any] = dict(known)
    errors: list[dict[str, Any]] = []
    try:
        load_policies([Path(d) for d in request["dirs"]], strict_permissions=bool(request["strict"]),
                      skip=frozenset(request["skip"]), parsed=found)
    except PolicyErrors as exc:
        errors = [{k: getattr(e, k) for k in ERROR_FIELDS} for e in exc.errors]
    out.write(json.dumps({"entries": {k: v for k, v in found.items() if k not in known}, "errors": errors}))
    return 0


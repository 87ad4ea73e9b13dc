"""The policy files' parsed documents, remembered in the state directory between starts.

Parsing a policy's YAML with its line and column marks (ruamel.yaml round-trip mode) is most of what a
policy load costs: about 0.1 s of CPU for the shipped files on a small machine, at every start and reload.
The loader takes the plain documents of earlier parses by the SHA-256 of each file's text
(:func:`aithermd.policy.loader.load_policies` ``parsed=``) and validates a file found there without parsing
it; this module keeps those documents in ``<state_dir>/policies.parsed.json`` (0600, written atomically,
only when they change, only the entries of the files just loaded).

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
from collections.abc import Iterable, Mapping
from pathlib import Path
from typing import Any

import structlog

from aithermd.files import read_regular

FILE_NAME = "policies.parsed.json"
FORMAT = 1
MAX_BYTES = 8 << 20  # the loader's limit is 1 MiB per policy file; a few policies' documents fit easily

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

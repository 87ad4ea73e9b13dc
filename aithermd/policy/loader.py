"""Policy files → validated :class:`Policy` objects, with every error mapped to ``FILE:LINE:COL``.

YAML is parsed with ruamel.yaml (round-trip mode keeps line and column marks), validated against
:mod:`aithermd.policy.schema`, then cross-checked (:mod:`aithermd.policy.references`). Every problem is a
:class:`aithermd.errors.PolicyError`; a file's problems are raised together as
:class:`aithermd.errors.PolicyErrors`. A directory loads all-or-nothing.

A valid document is handed out as plain nodes (:mod:`aithermd.policy.kinds`), whichever way it was loaded.
Parsing the YAML with its marks, importing pydantic and building the schema's validators are most of a
load's cost (0.2 s of CPU and 15 MB on a small machine), so the daemon hands :func:`load_policies` the
documents of earlier loads in their JSON form, by the SHA-256 of the schema's version and each file's text
(``parsed``): a file found there is taken from it without parsing, validating or importing pydantic, and
its tree (for positions) is parsed only if a later check asks for one. A miss, or any problem on that path,
takes the full path, whose errors carry FILE:LINE:COL as always.

Where policies live: the shipped ones (:func:`shipped_policy_dir`) and the admin's (:data:`ADMIN_POLICY_DIR`);
an admin file of the same name replaces the shipped one. A file, or the directory holding it, that a non-root
user can write is refused with ``strict_permissions=True`` (the daemon running as root) and otherwise only
warned about (``Policy.warnings``).
"""

from __future__ import annotations

import hashlib
import os
import stat
import sys
from collections.abc import Collection, MutableMapping, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from aithermd.errors import PolicyError, PolicyErrors
from aithermd.files import NotRegularFile, read_regular
from aithermd.policy import kinds

# the schema (pydantic), its error positions and the reference checks are imported by the full path only
SCHEMA_FILES = ("kinds.py", "values.py", "schema.py", "schema_machine.py", "schema_clocks.py",
                "references.py")

ADMIN_POLICY_DIR = Path("/etc/aithermd/policies.d")
SUFFIXES = (".yaml", ".yml")
MAX_BYTES = 1 << 20
MAX_VALUES = 100_000  # mapping keys, values and list items, aliases expanded


@dataclass(frozen=True, eq=False)
class Policy:
    """One validated policy. ``name`` is the file stem; ``source`` the YAML text as read; ``warnings``
    permission warnings (non-strict loads). Compared by identity."""

    name: str
    path: Path | None
    description: str
    source: str = field(repr=False)
    document: kinds.PolicyDocument = field(repr=False)  # nodes (kinds.py) when loaded from a file
    warnings: tuple[str, ...] = ()
    tree: Any = field(default=None, repr=False)  # the ruamel tree, for positions (see syntax_tree)

    def syntax_tree(self) -> Any:
        """The ruamel tree of ``source`` (line and column marks): ``tree``, or parsed now when the policy was
        validated from a parsed document (``load_policies(parsed=)``), and kept."""
        if self.tree is None:
            object.__setattr__(self, "tree", parse_yaml(self.source, str(self.path or f"<{self.name}>")))
        return self.tree

    def position(self, loc: Sequence[str | int]) -> tuple[int | None, int | None, str]:
        """(line, col, dotted key) of a location in the document (1-based)."""
        from aithermd.policy import locate
        return locate.locate(self.syntax_tree(), loc)


def shipped_policy_dir() -> Path:
    """The shipped policies: the repository's ``policies/`` in a source checkout, else the distribution's
    ``/usr/share/aithermd/policies`` (the packages link it to their conffiles in ``/etc/aithermd/policies``,
    so an admin's edit of a shipped file counts, even when the bundled virtualenv also holds a copy),
    else ``<sys.prefix>/share/aithermd/policies`` (a wheel installed with pip)."""
    candidates = [Path(__file__).resolve().parents[2] / "policies",
                  Path("/usr/share/aithermd/policies"),
                  Path(sys.prefix) / "share" / "aithermd" / "policies"]
    for cand in candidates:
        if (cand / "balanced.yaml").is_file():
            return cand
    return candidates[1]


def permission_problems(path: Path) -> list[str]:
    """Why a non-root user could change ``path`` (a file or directory), as sentences; [] when only root can.

    Owner other than root (an owner can always chmod), group write for a non-root group, or world write."""
    try:
        st = path.stat()
    except OSError as exc:
        return [f"cannot stat {path}: {exc.strerror}"]
    what = "directory" if stat.S_ISDIR(st.st_mode) else "file"
    problems = []
    if st.st_uid != 0:
        problems.append(f"{what} {path} is owned by uid {st.st_uid}, not root")
    if st.st_mode & stat.S_IWGRP and st.st_gid != 0:
        problems.append(f"{what} {path} is writable by group gid {st.st_gid}")
    if st.st_mode & stat.S_IWOTH:
        problems.append(f"{what} {path} is writable by every user")
    return problems


def _permissions(path: Path, strict: bool) -> tuple[list[PolicyError], list[str]]:
    problems = permission_problems(path) + permission_problems(path.parent)
    if not problems:
        return [], []
    fix = f"chown root:root {path} {path.parent} && chmod go-w {path} {path.parent}"
    if strict:
        return [PolicyError(str(path), f"refusing a policy a non-root user can change: {p}", hint=fix)
                for p in problems], []
    warnings = [f"{p} (the daemon running as root will refuse it; fix: {fix})" for p in problems]
    from aithermd import log  # here: the policy parser child (runtime/parsed.py) imports no structlog

    for w in warnings:
        log.get("aithermd.policy").warning("policy permissions", path=str(path), problem=w)
    return [], warnings


class _TooManyValues(Exception):
    """Raised by :func:`_plain` past :data:`MAX_VALUES` values."""


def _plain(node: Any, budget: list[int] | None = None) -> Any:
    """ruamel round-trip nodes → plain dict/list/str/int/float/bool/None, aliases expanded.

    Raises _TooManyValues once the expansion passes MAX_VALUES values (anchors and aliases that repeat each
    other, the "billion laughs", expand exponentially; a real policy holds a few hundred)."""
    if budget is None:
        budget = [MAX_VALUES]
    budget[0] -= 1
    if budget[0] < 0:
        raise _TooManyValues
    if isinstance(node, dict):
        return {(_plain(k, budget) if not isinstance(k, str) else str(k)): _plain(v, budget)
                for k, v in node.items()}
    if isinstance(node, list):
        return [_plain(v, budget) for v in node]
    if isinstance(node, bool):
        return bool(node)
    if isinstance(node, int):
        return int(node)
    if isinstance(node, float):
        return float(node)
    if isinstance(node, str):
        return str(node)
    return node


INDENTATION_PROBLEMS = ("expected <block end>", "mapping values are not allowed here",
                       "did not find expected key", "did not find expected '-' indicator",
                       "could not find expected ':'")


def yaml_hint(problem: str, mark: Any) -> str | None:
    """A hint for the YAML syntax errors that a line indented wrongly causes (None for others)."""
    if not any(p in problem for p in INDENTATION_PROBLEMS):
        return None
    line = f"line {mark.line + 1}" if mark is not None else "this line"
    return (f"check the indentation of {line} and the lines above it: the keys of one mapping start in the "
            "same column, a list's items start with '-' in the same column, with spaces; a value holding "
            "': ' needs quotes")


def parse_yaml(text: str, where: str) -> Any:
    """YAML text → ruamel tree. Raises PolicyErrors with the mark of a syntax error or duplicate key."""
    from ruamel.yaml import YAML  # only when a file is parsed: a start from parsed documents needs none
    from ruamel.yaml.error import MarkedYAMLError, YAMLError
    from ruamel.yaml.reader import ReaderError

    yaml = YAML(typ="rt")
    yaml.allow_duplicate_keys = False
    try:
        return yaml.load(text)
    except MarkedYAMLError as exc:
        mark = exc.problem_mark or exc.context_mark
        problem = (exc.problem or exc.context or "invalid YAML").strip()
        if "duplicate key" in problem or "found duplicate key" in str(exc):
            problem = "duplicate key" + (f" {exc.problem.split('duplicate key', 1)[1].strip()}"
                                          if exc.problem and "duplicate key" in exc.problem else "")
        ctx = exc.context_mark
        if exc.context and ctx is not None and mark is not None and ctx.line != mark.line:
            problem += f" ({exc.context.strip()} at line {ctx.line + 1}, column {ctx.column + 1})"
        hint = "indent YAML with spaces, never tabs" if "'\\t'" in problem else yaml_hint(problem, mark)
        raise PolicyErrors([PolicyError(where, f"YAML: {problem}", line=mark.line + 1 if mark else None,
                                        col=mark.column + 1 if mark else None, hint=hint)]) from None
    except ReaderError as exc:  # a control character: ruamel gives only an offset
        line = text.count("\n", 0, exc.position) + 1
        col = exc.position - (text.rfind("\n", 0, exc.position) + 1) + 1
        char = exc.character if isinstance(exc.character, int) else ord(str(exc.character)[:1] or "\0")
        raise PolicyErrors([PolicyError(where, f"YAML: control character #x{char:04x} is not allowed "
                                               "(remove it; write it as an escape in a quoted string)",
                                        line=line, col=col)]) from None
    except RecursionError:
        raise PolicyErrors([PolicyError(where, "YAML: the document nests too deeply: not a policy file")]) \
            from None
    except (YAMLError, ValueError) as exc:
        raise PolicyErrors([PolicyError(where, f"YAML: {exc}")]) from None


_schema_digest: list[bytes] = []


def schema_digest() -> bytes:
    """SHA-256 of aithermd's version and the schema's source files (:data:`SCHEMA_FILES`): a document kept
    by another version of the schema is never found (computed once per process)."""
    if not _schema_digest:
        from aithermd import __version__
        h = hashlib.sha256(__version__.encode())
        here = Path(__file__).resolve().parent
        for name in SCHEMA_FILES:
            try:
                h.update((here / name).read_bytes())
            except OSError:
                h.update(name.encode())
        _schema_digest.append(h.digest())
    return _schema_digest[0]


def text_digest(text: str) -> str:
    """The key of a file's document in ``load_policies(parsed=)``: SHA-256 of :func:`schema_digest` and the
    file's text, hex."""
    return hashlib.sha256(schema_digest() + text.encode("utf-8", "surrogatepass")).hexdigest()


def _policy(document: Any, text: str, name: str, path: str | Path | None, warnings: Sequence[str],
            tree: Any = None) -> Policy:
    return Policy(name=name, path=Path(path) if path is not None else None, description=document.description,
                  source=text, document=document, warnings=tuple(warnings), tree=tree)


class NotParsed(Exception):  # noqa: N818 - not an error: the caller parses elsewhere (runtime/parsed.py)
    """``only_parsed=True`` and a file's document is not in ``parsed``; ``args[0]`` is the file."""


def load_policy_text(text: str, *, name: str, path: str | Path | None = None,
                     warnings: Sequence[str] = (), parsed: MutableMapping[str, Any] | None = None,
                     only_parsed: bool = False) -> Policy:
    """Validate YAML ``text`` as policy ``name``. Raises PolicyErrors (every problem, with positions).

    The document is given as nodes (:mod:`aithermd.policy.kinds`). ``parsed``: documents in their JSON form
    by :func:`text_digest`; a hit is taken from there without parsing or validating, and a valid file's
    document is put there (see the module's docstring). ``only_parsed``: raise :class:`NotParsed` rather
    than parse (the daemon then parses in a child process, :mod:`aithermd.runtime.parsed`)."""
    where = str(path) if path is not None else f"<{name}>"
    digest = text_digest(text) if parsed is not None else ""
    if parsed is not None and digest in parsed:
        try:
            return _policy(kinds.from_json(parsed[digest]), text, name, path, warnings)
        except (ValueError, TypeError, AttributeError, RecursionError):
            del parsed[digest]  # not ours: the full path below
    if only_parsed:
        raise NotParsed(where)
    from pydantic import ValidationError

    from aithermd.policy import locate
    from aithermd.policy.references import check_references
    from aithermd.policy.schema import PolicyDocument

    tree = parse_yaml(text, where)
    if tree is None:
        raise PolicyErrors([PolicyError(where, "empty policy file: expected a mapping with 'rules'",
                                        line=1, col=1)])
    if not isinstance(tree, dict):
        raise PolicyErrors([PolicyError(where, "a policy file is a mapping (description, safety, curves, "
                                               "machines, rules)", line=1, col=1)])
    try:
        plain = _plain(tree)
    except _TooManyValues:
        raise PolicyErrors([PolicyError(
            where, f"the document expands to more than {MAX_VALUES} values (anchors and aliases repeating "
                   "each other?): not a policy file", line=1, col=1)]) from None
    try:
        document = PolicyDocument.model_validate(plain)
    except ValidationError as exc:
        raise PolicyErrors(locate.errors_from_validation(exc, tree, where)) from None
    except RecursionError:
        raise PolicyErrors([PolicyError(where, "the document nests too deeply")]) from None
    problems = check_references(document)
    if problems:
        raise PolicyErrors([locate.error_at(tree, where, loc, msg, hint) for loc, msg, hint in problems])
    try:  # the engine reads nodes whichever way a policy was loaded: a restart behaves as the first start
        kept = kinds.to_json(document)
        document = kinds.from_json(kept)
    except (TypeError, ValueError):
        kept = None  # not expressible as nodes: the schema's models serve, and nothing is kept
    if parsed is not None and kept is not None:
        parsed[digest] = kept
    return _policy(document, text, name, path, warnings)  # the tree again only if a position is asked


def load_policy_file(path: str | Path, *, strict_permissions: bool = False,
                     parsed: MutableMapping[str, Any] | None = None, only_parsed: bool = False) -> Policy:
    """Load and validate one policy file; its name is the file stem.

    Raises PolicyErrors: unreadable file, YAML error, schema or reference error (each with FILE:LINE:COL),
    or, with ``strict_permissions``, a file or directory a non-root user can write."""
    path = Path(path)
    perm_errors, warnings = _permissions(path, strict_permissions)
    if perm_errors:
        raise PolicyErrors(perm_errors)
    try:  # a FIFO named like a policy must not hang the loader (or a reload) waiting for a writer
        raw = read_regular(path, MAX_BYTES)
    except NotRegularFile:
        raise PolicyErrors([PolicyError(str(path), "cannot read: not a regular file",
                                        hint="a policy is a YAML file; move this out of the way")]) from None
    except OSError as exc:
        raise PolicyErrors([PolicyError(str(path), f"cannot read: {exc.strerror or exc}")]) from None
    if len(raw) > MAX_BYTES:
        raise PolicyErrors([PolicyError(str(path), f"larger than {MAX_BYTES} bytes: not a policy file")])
    try:
        text = raw.decode("utf-8")
    except UnicodeDecodeError as exc:
        raise PolicyErrors([PolicyError(str(path), f"not UTF-8 text ({exc.reason} at byte {exc.start})")]) \
            from None
    return load_policy_text(text, name=path.stem, path=path, warnings=warnings, parsed=parsed,
                            only_parsed=only_parsed)


def policy_files(dirs: Sequence[Path]) -> dict[str, Path]:
    """name → file, later directories replacing earlier ones by name; missing directories are skipped.

    Every entry with a policy suffix counts, also one that is not a regular file (a directory, a FIFO, a
    dangling link): loading it fails with its path, rather than the policy silently vanishing. An entry of
    ``dirs`` that is itself a policy file (``aithermd run --policy FILE``) is that one policy, by its stem,
    so its errors name the file the user gave."""
    found: dict[str, Path] = {}
    for d in dirs:
        d = Path(d)
        if d.suffix in SUFFIXES and not d.is_dir():
            found[d.stem] = d
            continue
        if not d.is_dir():
            continue
        for p in sorted(d.iterdir()):
            if p.suffix in SUFFIXES and not p.name.startswith("."):
                found[p.stem] = p
    return found


def load_policies(dirs: Sequence[Path], *, strict_permissions: bool = False,
                  skip: Collection[str] = (), parsed: MutableMapping[str, Any] | None = None,
                  only_parsed: bool = False) -> dict[str, Policy]:
    """Every policy in ``dirs`` by name (later directories override earlier ones), all-or-nothing; the
    files whose paths are in ``skip`` are left out (the daemon's start leaves out broken ones).
    ``parsed``, ``only_parsed``: see :func:`load_policy_text`.

    Raises PolicyErrors with the problems of every file when any file is invalid."""
    errors: list[PolicyError] = []
    loaded: dict[str, Policy] = {}
    for name, path in sorted(policy_files(dirs).items()):
        if str(path) in skip:
            continue
        try:
            loaded[name] = load_policy_file(path, strict_permissions=strict_permissions, parsed=parsed,
                                            only_parsed=only_parsed)
        except PolicyErrors as exc:
            errors.extend(exc.errors)
    if errors:
        raise PolicyErrors(errors)
    return loaded


def resolve_policy(name_or_file: str, dirs: Sequence[Path] | None = None, *,
                   strict_permissions: bool = False) -> Policy:
    """A policy by file path (anything with a ``/`` or a YAML suffix) or by name in ``dirs`` (default:
    shipped, then admin). Raises PolicyErrors; FileNotFoundError when no such name or file exists."""
    if "/" in name_or_file or name_or_file.endswith(SUFFIXES) or os.path.exists(name_or_file):
        if not os.path.exists(name_or_file):
            raise FileNotFoundError(f"{name_or_file}: no such policy file")
        return load_policy_file(name_or_file, strict_permissions=strict_permissions)
    files = policy_files(dirs if dirs is not None else [shipped_policy_dir(), ADMIN_POLICY_DIR])
    if name_or_file not in files:
        known = ", ".join(sorted(files)) or "none"
        raise FileNotFoundError(f"no policy named '{name_or_file}' (known: {known})")
    return load_policy_file(files[name_or_file], strict_permissions=strict_permissions)

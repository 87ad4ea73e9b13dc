"""Read and extract ttar archives (the text tree archives of prometheus/procfs and node_exporter fixtures).

Format: blocks separated by ``# ttar - - -`` comment lines; ``Directory: PATH`` + ``Mode: OCT``;
``Path: PATH`` + ``Lines: N`` + N content lines + ``Mode: OCT`` (inside content ``NULLBYTE`` stands for a
NUL byte, and a last line ending in ``EOF`` has no trailing newline); or ``Path: PATH`` + ``SymlinkTo:
TARGET``. Lines starting with ``#`` outside content are comments.

``extract(archive, dest, strip="fixtures/")`` writes the tree under ``dest`` (symlinks included, modes
applied) and returns the entries; a path that would leave ``dest`` raises ValueError.
"""

from __future__ import annotations

import os
from dataclasses import dataclass
from pathlib import Path


@dataclass(frozen=True, slots=True)
class Entry:
    kind: str  # "dir" | "file" | "link"
    path: str
    data: bytes = b""
    target: str = ""
    mode: int | None = None


class TtarError(ValueError):
    """A malformed archive: ``str()`` names the line."""


def parse(text: str, name: str = "<ttar>") -> list[Entry]:
    """The entries of a ttar archive's text, in archive order."""
    lines = text.split("\n")
    entries: list[Entry] = []
    i = 0

    def fail(msg: str) -> TtarError:
        return TtarError(f"{name}:{i + 1}: {msg}")

    while i < len(lines):
        line = lines[i]
        if not line or line.startswith("#"):
            i += 1
            continue
        if line.startswith("Directory: "):
            entries.append(Entry("dir", line[len("Directory: ") :]))
            i += 1
        elif line.startswith("Path: "):
            path = line[len("Path: ") :]
            i += 1
            if i >= len(lines):
                raise fail(f"{path}: archive ends after Path")
            head = lines[i]
            if head.startswith("SymlinkTo: "):
                entries.append(Entry("link", path, target=head[len("SymlinkTo: ") :]))
                i += 1
            elif head.startswith("Lines: "):
                try:
                    count = int(head[len("Lines: ") :])
                except ValueError:
                    raise fail(f"{path}: bad line count {head!r}") from None
                body = lines[i + 1 : i + 1 + count]
                if len(body) < count:
                    raise fail(f"{path}: {count} lines announced, {len(body)} present")
                i += 1 + count
                chunks = []
                for n, content in enumerate(body):
                    content = content.replace("NULLBYTE", "\0")
                    if n == count - 1 and content.endswith("EOF"):
                        chunks.append(content[:-3])
                    else:
                        chunks.append(content + "\n")
                entries.append(Entry("file", path, data="".join(chunks).encode("utf-8", "surrogateescape")))
            else:
                raise fail(f"{path}: expected Lines: or SymlinkTo:, got {head!r}")
        elif line.startswith("Mode: "):
            if not entries:
                raise fail("Mode before any entry")
            last = entries[-1]
            entries[-1] = Entry(last.kind, last.path, last.data, last.target, int(line[len("Mode: ") :], 8))
            i += 1
        else:
            raise fail(f"unexpected line {line!r}")
    return entries


def read(archive: str | os.PathLike[str]) -> list[Entry]:
    """The entries of the archive file ``archive``."""
    path = Path(archive)
    return parse(path.read_text(encoding="utf-8", errors="surrogateescape"), str(path))


def extract(archive: str | os.PathLike[str], dest: str | os.PathLike[str], strip: str = "") -> list[Entry]:
    """Write the archive's tree under ``dest``; ``strip`` is a leading path prefix to drop (entries outside
    it are skipped). Returns the entries written."""
    root = Path(dest).resolve()
    written: list[Entry] = []
    for entry in read(archive):
        rel = entry.path
        if strip:
            if not (rel + "/").startswith(strip.rstrip("/") + "/"):
                continue
            rel = rel[len(strip.rstrip("/")) :].lstrip("/")
            if not rel:
                continue
        out = root / rel
        if os.path.isabs(rel) or ".." in Path(rel).parts:
            raise ValueError(f"{archive}: {entry.path} leaves the destination")
        out.parent.mkdir(parents=True, exist_ok=True)
        if entry.kind == "dir":
            out.mkdir(exist_ok=True)
        elif entry.kind == "link":
            if out.is_symlink() or out.exists():
                out.unlink()
            os.symlink(entry.target, out)
        else:
            if out.is_symlink():
                out.unlink()
            out.write_bytes(entry.data)
        if entry.mode is not None and entry.kind != "link":
            os.chmod(out, entry.mode | 0o700 if entry.kind == "dir" else entry.mode)
        written.append(entry)
    return written

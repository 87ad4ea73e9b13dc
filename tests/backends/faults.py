"""A :class:`SysfsIO` that injects faults by path suffix, and counts opens and reads."""

from __future__ import annotations

from collections import Counter

from aithermd.backends.sysfs import SysfsIO


class FaultIO(SysfsIO):
    """``faults[suffix]`` is a list of outcomes for reads of files whose path ends with ``suffix``: an
    ``OSError`` to raise, ``bytes`` to return, or None for the real content; the last outcome repeats.
    ``open_faults[suffix]`` works the same for ``open``. ``write_faults[suffix]`` is an ``OSError`` every write to
    such a file raises, or a list of outcomes, one per write (``None``: it goes through); ``writes`` records
    (path, data)."""

    def __init__(self) -> None:
        self.faults: dict[str, list] = {}
        self.open_faults: dict[str, list] = {}
        self.opens: Counter[str] = Counter()
        self.reads: Counter[str] = Counter()
        self.writes: list[tuple[str, bytes]] = []
        self.write_faults: dict[str, OSError] = {}
        self._paths: dict[int, str] = {}

    @staticmethod
    def _next(table: dict[str, list], path: str):
        for suffix, outcomes in table.items():
            if path.endswith(suffix) and outcomes:
                return outcomes.pop(0) if len(outcomes) > 1 else outcomes[0]
        return None

    def open(self, path: str) -> int:
        outcome = self._next(self.open_faults, path)
        if isinstance(outcome, OSError):
            raise outcome
        fd = super().open(path)
        self._paths[fd] = path
        self.opens[path] += 1
        return fd

    def pread(self, fd: int, size: int) -> bytes:
        path = self._paths.get(fd, "")
        self.reads[path] += 1
        outcome = self._next(self.faults, path)
        if isinstance(outcome, OSError):
            raise outcome
        if isinstance(outcome, bytes):
            return outcome
        return super().pread(fd, size)

    def close(self, fd: int) -> None:
        self._paths.pop(fd, None)
        super().close(fd)

    def write(self, path: str, data: bytes) -> None:
        for suffix, exc in self.write_faults.items():
            if path.endswith(suffix):
                if isinstance(exc, list):  # outcomes one write each (None: the write goes through), then none
                    exc = exc.pop(0) if exc else None
                    if exc is None:
                        continue
                raise exc
        self.writes.append((path, data))
        super().write(path, data)

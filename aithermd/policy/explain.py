"""A decision's inputs, formatted only when someone reads them.

The engine decides every knob every tick, but a decision's ``inputs`` (the window statistics, states and
source temperatures that decided it, rounded for people) are read only by ``aithermctl explain``, D-Bus
``Explain``, the replay and a quiet mode's ceiling. :class:`Lazy` is a read-only mapping that keeps what
its builder needs and builds the dict on first read (then keeps it); ``eager`` holds the few entries the
tick reads every time (a fan curve's ``used:<curve>`` channels, for the ``source_in_use`` log), so
reading them builds nothing. Equality, iteration and ``dict(...)`` behave as the built dict's.
"""

from __future__ import annotations

from collections.abc import Callable, Iterator, Mapping
from typing import Any

from aithermd.model import EMPTY


class Lazy(Mapping[str, Any]):
    """``build(*args)`` → the inputs dict, called at most once per reader race (the result is the same)."""

    __slots__ = ("_build", "_args", "_data", "eager")

    def __init__(self, build: Callable[..., dict[str, Any]], *args: Any,
                 eager: Mapping[str, Any] = EMPTY) -> None:
        self._build, self._args, self._data, self.eager = build, args, None, eager

    def data(self) -> dict[str, Any]:
        """The built inputs (built now if they were not yet)."""
        d = self._data
        if d is None:
            d = self._data = self._build(*self._args)
        return d

    def __getitem__(self, key: str) -> Any:
        return self.data()[key]

    def __iter__(self) -> Iterator[str]:
        return iter(self.data())

    def __len__(self) -> int:
        return len(self.data())

    def __contains__(self, key: object) -> bool:
        return key in self.data()

    def __eq__(self, other: object) -> bool:
        return self.data() == (other.data() if isinstance(other, Lazy) else other)

    __hash__ = None  # type: ignore[assignment]  # a mapping, as a dict is not hashable

    def __repr__(self) -> str:
        return repr(self.data())


def eager_items(inputs: Mapping[str, Any]) -> Mapping[str, Any]:
    """What of ``inputs`` can be read without building them: all of a plain mapping, a :class:`Lazy`'s
    ``eager`` entries."""
    return inputs.eager if isinstance(inputs, Lazy) else inputs

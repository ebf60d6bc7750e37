"""Name -> implementation tables, so that a spec string selects a building block.

Adding a variant is one decorated definition in the block's own module; the spec schema reads
the registered names to validate and to suggest fixes for misspellings.
"""

from __future__ import annotations

import difflib
from collections.abc import Callable, Iterator
from typing import Generic, TypeVar

T = TypeVar("T")


class Registry(Generic[T]):
    """A named table of building blocks of one kind (norms, activations, positional encodings)."""

    def __init__(self, kind: str) -> None:
        self.kind = kind
        self._entries: dict[str, T] = {}

    def register(self, name: str) -> Callable[[T], T]:
        def add(entry: T) -> T:
            if name in self._entries:
                raise ValueError(f"{self.kind} {name!r} is already registered")
            self._entries[name] = entry
            return entry

        return add

    def __getitem__(self, name: str) -> T:
        try:
            return self._entries[name]
        except KeyError:
            close = difflib.get_close_matches(name, self._entries, n=1)
            hint = f"; did you mean {close[0]!r}?" if close else ""
            raise KeyError(f"unknown {self.kind} {name!r}{hint} (known: {self.names()})") from None

    def __contains__(self, name: object) -> bool:
        return name in self._entries

    def __iter__(self) -> Iterator[str]:
        return iter(self._entries)

    def names(self) -> tuple[str, ...]:
        return tuple(self._entries)


NORMS: Registry[type] = Registry("norm type")
ACTIVATIONS: Registry = Registry("activation")
POSITIONAL: Registry[type] = Registry("positional encoding")

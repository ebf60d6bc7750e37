"""The building blocks' tables, so that a spec string selects a block.

Adding a variant is one decorated definition in the block's own module, under a name that the
spec layer declares (``tfcompile.spec.choices`` and the schema's variant tags), so that checking a
spec needs no torch; tests/test_registries.py holds the two sides equal.
"""

from __future__ import annotations

from collections.abc import Callable

from tfcompile.registry import Registry

NORMS: Registry[type] = Registry("norm type")
ACTIVATIONS: Registry[Callable] = Registry("activation")
POSITIONAL: Registry[type] = Registry("positional encoding")

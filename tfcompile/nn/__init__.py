"""Building blocks. Importing this package registers every norm, activation and positional scheme."""

from tfcompile.nn import feedforward, norms, positional
from tfcompile.nn.registry import ACTIVATIONS, NORMS, POSITIONAL, Registry

__all__ = ["ACTIVATIONS", "NORMS", "POSITIONAL", "Registry", "feedforward", "norms", "positional"]

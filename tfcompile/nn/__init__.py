"""Building blocks. Importing this package registers every norm, activation and positional scheme."""

from tfcompile.nn import feedforward, norms, positional
from tfcompile.nn.registry import ACTIVATIONS, NORMS, POSITIONAL

__all__ = ["ACTIVATIONS", "NORMS", "POSITIONAL", "feedforward", "norms", "positional"]

"""Training objectives and their decoding."""

from tfcompile.tasks.causal_lm import IGNORE_INDEX, causal_lm_loss, generate, sample_next

__all__ = ["IGNORE_INDEX", "causal_lm_loss", "generate", "sample_next"]

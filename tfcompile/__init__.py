"""tfcompile: a declarative model-spec compiler for Transformers."""

__version__ = "0.1.0"

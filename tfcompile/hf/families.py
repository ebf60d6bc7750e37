"""Every Hugging Face architecture tfcompile converts, each registered by importing its module:
the one list that ``tfcompile import`` (importer.py) and ``export-hf`` (exporter.py) read. At most
one architecture writes a given spec (each ``candidate`` claims only what the others cannot
write), so the order here changes nothing."""

from tfcompile.hf import (  # noqa: F401 (each registers its architecture)
    bert,
    bigcode,
    distilbert,
    gemma,
    gpt2,
    llama,
    opt,
    phi3,
    roberta,
    t5,
    vit,
)

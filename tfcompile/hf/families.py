"""Every Hugging Face architecture tfcompile converts, each registered by importing its module:
the one list that ``tfcompile import`` (importer.py) and ``export-hf`` (exporter.py) read. Each
spec is the ``candidate`` of one architecture at most, chosen by what decides the architecture
(a learned-position decoder's MQA, norms, window and embedding scale; a RoPE decoder's embedding
scale, then its norms, blocks and K/V heads; an ALiBi decoder is BLOOM's, a sinusoidal one
XGLM's), so the order here changes nothing and a refusal names only that architecture's
problems."""

from tfcompile.hf import (  # noqa: F401 (each registers its architecture)
    albert,
    bart,
    bert,
    bigcode,
    biogpt,
    bloom,
    cohere,
    dbrx,
    distilbert,
    electra,
    ernie,
    falcon,
    gemma,
    gpt2,
    gpt_neo,
    gpt_neox,
    gptj,
    llama,
    llava,
    modernbert,
    mpt,
    opt,
    persimmon,
    phi,
    phi3,
    roberta,
    stablelm,
    starcoder2,
    t5,
    vit,
    xglm,
)

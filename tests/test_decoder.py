"""The decoder-only assembly: parameter counts from the notes, causality, padding, every variant."""

import itertools

import pytest
import torch
from helpers import ROOT, tiny_model

from tfcompile.models import DecoderLM
from tfcompile.nn.moe import MoE
from tfcompile.spec import load_spec
from tfcompile.summary import forward_flops_per_token, summarize
from tfcompile.tasks import build_model

VARIANTS = [
    {"norm": {"position": position, "type": norm}, "activation": act, "positional": pos, "n_kv_heads": kv}
    for position, norm, act, pos, kv in itertools.product(
        ["pre", "post"],
        ["layernorm", "rmsnorm"],
        ["relu", "gelu", "gelu_tanh", "silu", "swiglu", "geglu"],
        ["sinusoidal", "learned", "rope", "relative", "none"],
        [4, 2, 1],
    )
]
# The full grid is 360 models; test a covering slice (every value of every axis, many pairs).
VARIANT_SLICE = VARIANTS[::7]


def _id(v: dict) -> str:
    return (
        f"{v['norm']['position']}-{v['norm']['type']}-{v['activation']}-{v['positional']}-kv{v['n_kv_heads']}"
    )


def test_variant_slice_covers_every_choice() -> None:
    for key in ("activation", "positional", "n_kv_heads"):
        assert {v[key] for v in VARIANT_SLICE} == {v[key] for v in VARIANTS}
    assert {(v["norm"]["position"], v["norm"]["type"]) for v in VARIANT_SLICE} == {
        (p, n) for p in ("pre", "post") for n in ("layernorm", "rmsnorm")
    }


def test_shakespeare_char_has_the_lecture_parameter_count() -> None:
    spec = load_spec(ROOT / "specs" / "shakespeare-char.yaml")
    model = build_model(spec)
    assert sum(p.numel() for p in model.parameters()) == 10_788_929
    assert summarize(spec).total_params == 10_788_929


def test_gpt2_small_has_124m_parameters_with_tied_head() -> None:
    spec = load_spec(ROOT / "specs" / "gpt2.yaml")
    summary = summarize(spec)
    assert summary.total_params == 124_439_808 + (50_304 - 50_257) * 768  # the table padded to 64s
    assert sum(row.params for row in summary.rows) == summary.total_params
    assert "tied" in next(r for r in summary.rows if r.name == "lm_head").note


@pytest.mark.parametrize("spec_file", sorted((ROOT / "specs").glob("*.yaml")), ids=lambda p: p.stem)
def test_example_specs_validate_and_summarise(spec_file) -> None:
    spec = load_spec(spec_file)
    text_without_vocab = spec.model.vocab_size is None and spec.model.family != "vit"
    sizes_from_data = ["model.vocab_size=1000"] if text_without_vocab else []
    if spec.task.type in ("classification", "image_classification"):
        sizes_from_data.append("task.labels=[negative, positive]")
    spec = load_spec(spec_file, sizes_from_data)
    summary = summarize(spec)
    with torch.device("meta"):  # a mixture of experts computes with the experts a token chose
        idle = sum(m.idle_flops_per_token() // 2 for m in build_model(spec).modules() if isinstance(m, MoE))
    active = summary.total_params - idle
    assert summary.total_params > 0 and summary.forward_flops_per_token > 2 * 0.5 * active


@pytest.mark.parametrize("variant", VARIANT_SLICE, ids=_id)
def test_output_at_t_ignores_tokens_after_t(variant: dict) -> None:
    model = DecoderLM(tiny_model(**variant)).eval()
    ids = torch.randint(0, 50, (2, 12))
    changed = ids.clone()
    changed[:, 7:] = torch.randint(0, 50, (2, 5))
    with torch.no_grad():
        a, b = model(ids), model(changed)
    assert a.shape == (2, 12, 50) and torch.isfinite(a).all()
    torch.testing.assert_close(a[:, :7], b[:, :7], atol=1e-5, rtol=1e-5)
    assert not torch.allclose(a[:, 7:], b[:, 7:])


@pytest.mark.parametrize("positional", ["learned", "rope", "relative"])
def test_padding_does_not_change_real_positions(positional: str) -> None:
    model = DecoderLM(tiny_model(positional=positional)).eval()
    ids = torch.randint(0, 50, (2, 10))
    mask = torch.ones(2, 10, dtype=torch.bool)
    mask[1, 6:] = False  # the second row is 6 real tokens and 4 padding
    garbage = ids.clone()
    garbage[1, 6:] = torch.randint(0, 50, (4,))
    with torch.no_grad():
        a, b = model(ids, mask), model(garbage, mask)
        alone = model(ids[1:, :6])
    torch.testing.assert_close(a[1, :6], b[1, :6], atol=1e-5, rtol=1e-5)
    torch.testing.assert_close(a[1, :6], alone[0], atol=1e-5, rtol=1e-5)
    torch.testing.assert_close(a[0], model(ids[:1])[0], atol=1e-5, rtol=1e-5)


def test_padding_mask_also_hides_padded_keys_in_the_middle() -> None:
    """A mask is about keys, not only a suffix: a hole in the middle is ignored too."""
    model = DecoderLM(tiny_model(positional="rope")).eval()
    ids = torch.randint(0, 50, (1, 8))
    mask = torch.ones(1, 8, dtype=torch.bool)
    mask[0, 3] = False
    other = ids.clone()
    other[0, 3] = (ids[0, 3] + 1) % 50
    with torch.no_grad():
        torch.testing.assert_close(model(ids, mask)[0, 4:], model(other, mask)[0, 4:])


def test_tied_embeddings_share_one_tensor() -> None:
    tied = DecoderLM(tiny_model(tie_embeddings=True))
    untied = DecoderLM(tiny_model(tie_embeddings=False))
    assert tied.lm_head.weight is tied.embed.weight
    assert untied.lm_head.weight is not untied.embed.weight
    n = lambda m: sum(p.numel() for p in m.parameters())  # noqa: E731
    assert n(untied) - n(tied) == 50 * 32


def test_final_norm_defaults_follow_norm_position() -> None:
    assert isinstance(DecoderLM(tiny_model()).final_norm, torch.nn.LayerNorm | torch.nn.Module)
    assert not isinstance(DecoderLM(tiny_model()).final_norm, torch.nn.Identity)
    assert isinstance(DecoderLM(tiny_model(norm={"position": "post"})).final_norm, torch.nn.Identity)


def test_scaled_embeddings_multiply_by_sqrt_d_model() -> None:
    spec = tiny_model(scale_embeddings=True, positional="none", n_layers=1)
    model = DecoderLM(spec).eval()
    seen = {}
    model.blocks[0].register_forward_pre_hook(lambda m, args: seen.setdefault("x", args[0]))
    ids = torch.randint(0, 50, (1, 4))
    model(ids)
    torch.testing.assert_close(seen["x"], model.embed(ids) * 32**0.5)


def test_bad_inputs_get_clear_errors() -> None:
    model = DecoderLM(tiny_model())
    with pytest.raises(ValueError, match="exceeds the model's max_seq_len 16"):
        model(torch.zeros(1, 17, dtype=torch.long))
    with pytest.raises(ValueError, match=r"integer tensor of shape \(batch, seq\)"):
        model(torch.zeros(1, 4))
    with pytest.raises(ValueError, match="attention_mask shape"):
        model(torch.zeros(1, 4, dtype=torch.long), torch.ones(1, 5))


def test_missing_vocab_size_is_a_clear_error() -> None:
    with pytest.raises(ValueError, match="vocab_size is not set"):
        DecoderLM(tiny_model(vocab_size=None))


@pytest.mark.parametrize(
    "variant",
    [
        {"positional": "learned"},
        {"positional": "sinusoidal", "norm": {"position": "post"}},
        {"positional": "rope", "n_kv_heads": 2, "activation": "swiglu"},
        {"positional": "relative", "n_kv_heads": 1},
        {"positional": "none", "scale_embeddings": True},
    ],
    ids=lambda v: f"{v['positional']}-kv{v.get('n_kv_heads', 4)}",
)
def test_incremental_decoding_with_a_cache_equals_the_full_forward(variant: dict) -> None:
    model = DecoderLM(tiny_model(**variant)).eval()
    ids = torch.randint(0, 50, (3, 12))
    with torch.no_grad():
        full = model(ids)
        cache = model.empty_cache(3)
        steps = [model(ids[:, :5], cache=cache)]  # a prompt of 5, then one token at a time
        steps += [model(ids[:, t : t + 1], cache=cache) for t in range(5, 12)]
    torch.testing.assert_close(torch.cat(steps, dim=1), full, atol=1e-5, rtol=1e-5)
    assert cache[0].length == 12 and cache[0].key.shape == (3, model.spec.n_kv_heads, 12, 8)


def test_cache_with_padding_mask_over_past_and_new_tokens() -> None:
    model = DecoderLM(tiny_model(positional="rope")).eval()
    ids = torch.randint(0, 50, (2, 8))
    mask = torch.ones(2, 8, dtype=torch.long)
    mask[1, 5:] = 0  # the second row has 5 real tokens
    with torch.no_grad():
        full = model(ids, mask)
        cache = model.empty_cache(2)
        first = model(ids[:, :6], mask[:, :6], cache=cache)
        rest = model(ids[:, 6:], mask, cache=cache)
    torch.testing.assert_close(torch.cat([first, rest], dim=1)[0], full[0], atol=1e-5, rtol=1e-5)
    torch.testing.assert_close(first[1, :5], full[1, :5], atol=1e-5, rtol=1e-5)


def test_cache_past_the_context_is_refused() -> None:
    model = DecoderLM(tiny_model()).eval()
    cache = model.empty_cache(1)
    model(torch.zeros(1, 16, dtype=torch.long), cache=cache)
    with pytest.raises(ValueError, match="sequence length 17 exceeds"):
        model(torch.zeros(1, 1, dtype=torch.long), cache=cache)
    with pytest.raises(ValueError, match=r"must be \(batch, cached \+ new tokens\)"):
        model(torch.zeros(1, 1, dtype=torch.long), torch.ones(1, 2), cache=model.empty_cache(1))


@pytest.mark.parametrize("positional", ["learned", "sinusoidal", "rope", "relative", "none"])
def test_a_left_padded_row_reads_as_it_would_alone(positional: str) -> None:
    """Positions count the real tokens of the mask: padding on the left moves nothing."""
    torch.manual_seed(0)
    model = DecoderLM(tiny_model(positional=positional)).eval()
    rows = [torch.randint(0, 50, (n,)) for n in (1, 5, 9)]
    width = max(len(r) for r in rows)
    ids = torch.stack([torch.cat([torch.zeros(width - len(r), dtype=torch.long), r]) for r in rows])
    mask = torch.stack([torch.arange(width) >= width - len(r) for r in rows]).long()
    with torch.no_grad():
        batched = model(ids, mask)
        cache = model.empty_cache(len(rows))
        model(ids[:, :-2], mask[:, :-2], cache=cache)  # the prompt, then two single steps
        stepped = [model(ids[:, t : t + 1], mask[:, : t + 1], cache=cache) for t in (width - 2, width - 1)]
        for i, row in enumerate(rows):
            alone = model(row[None])[0]
            torch.testing.assert_close(batched[i, width - len(row) :], alone, atol=1e-5, rtol=1e-5)
            torch.testing.assert_close(stepped[-1][i, -1], alone[-1], atol=1e-5, rtol=1e-5)


def test_scale_output_multiplies_the_last_hidden_state_by_d_model_to_the_minus_half() -> None:
    """T5 v1.0's tied head reads d_model^-0.5 times the final norm's output."""
    plain = DecoderLM(tiny_model(bias={"lm_head": False}))
    scaled = DecoderLM(tiny_model(bias={"lm_head": False}, scale_output=True))
    scaled.load_state_dict(plain.state_dict())
    ids = torch.randint(0, 50, (2, 9))
    torch.testing.assert_close(scaled(ids), plain(ids) * 32**-0.5)


def test_qkv_and_output_biases_are_separate_switches() -> None:
    """Qwen2: q, k and v have biases, the output projection none."""
    model = DecoderLM(tiny_model(bias={"qkv": True, "attn_out": False, "ffn": False}))
    names = set(model.state_dict())
    assert "blocks.0.attn.qkv.bias" in names and "blocks.0.attn.out.bias" not in names
    assert "blocks.0.ffn.w_in.bias" not in names


def test_every_norm_takes_the_models_epsilon() -> None:
    model = DecoderLM(tiny_model(norm={"type": "rmsnorm", "eps": 1e-3}))
    eps = {m.eps for m in model.modules() if hasattr(m, "eps")}
    assert eps == {1e-3}


def test_summary_counts_flops_at_the_context_it_prints() -> None:
    spec = load_spec(ROOT / "specs" / "shakespeare-char.yaml", ["train.context_length=128"])
    summary = summarize(spec)
    assert summary.context == 128
    assert summary.forward_flops_per_token == forward_flops_per_token(build_model(spec), spec.model, 128)
    assert (
        summary.forward_flops_per_token
        < summarize(load_spec(ROOT / "specs" / "shakespeare-char.yaml")).forward_flops_per_token
    )


def test_summary_notes_a_shared_layers_tied_attention() -> None:
    spec = load_spec(
        ROOT / "specs" / "bert-mini-shakespeare.yaml", ["model.share_layers=true", "model.vocab_size=100"]
    )
    rows = {row.name: row for row in summarize(spec).rows}
    assert rows["blocks.1.attn"].params == 0 and rows["blocks.1.attn"].note == "weight tied to blocks.0.attn"

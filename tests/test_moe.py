"""``model.moe``: a mixture of experts in place of each layer's feed-forward. The layer held to its
formula written out token by token, the load-balancing loss to Switch's and Mixtral's, the trainer
to adding it to the gradient and not to the loss it reports, the spec's rules and counts to the
built models, the KV cache to the full forward, the FLOP count to the chosen experts, and every
family's graphs to ONNX Runtime. (Hugging Face's MoE models: tests/test_hf_moe.py.)"""

from __future__ import annotations

import copy
import itertools
import re
from pathlib import Path

import onnx
import pytest
import torch
from helpers import ONE_STEP, ROOT, TINY, assert_exports_with_parity, random_run, randomised, tiny_model

from tfcompile.models import DecoderLM
from tfcompile.nn.feedforward import FeedForward
from tfcompile.nn.moe import MoE, balance_loss, half
from tfcompile.spec import load_spec, parse_spec
from tfcompile.spec.errors import SpecError
from tfcompile.spec.schema import MoESpec
from tfcompile.summary import forward_flops_per_token
from tfcompile.tasks import build_model

MODEL = "vocab_size: 20, d_model: 16, n_layers: 2, n_heads: 2, max_seq_len: 12"


class EveryExpert(MoE):
    """A layer computing as the ONNX exporter traces it: every expert through every token."""

    @property
    def dispatch(self) -> bool:
        return False


def _layer(activation: str = "swiglu", bias: bool = False, dispatch: bool = True, **moe: object) -> MoE:
    spec = MoESpec.model_validate({"experts": 4, "top_k": 2, "d_ff": 8} | moe)
    layer = randomised((MoE if dispatch else EveryExpert)(6, spec, activation, bias))
    if layer.selection_bias is not None:  # a buffer: drawn here, as randomised draws the parameters
        layer.selection_bias.copy_(
            torch.randn(len(layer.experts), generator=torch.Generator().manual_seed(1))
        )
    return layer


def _by_token(layer: MoE, x: torch.Tensor) -> torch.Tensor:
    """The formula for one token at a time: its router scores (softmax, or each expert's sigmoid);
    where groups are set, the experts of the groups whose two best scores (plus the selection
    bias) sum highest; among them its top_k experts by score plus selection bias; their outputs
    weighted by their scores (rescaled to sum to 1 where normalize, times scale), plus the shared
    expert (times its sigmoid gate)."""
    out = torch.empty_like(x)
    for index in itertools.product(*map(range, x.shape[:-1])):
        token = x[index]
        logits = layer.router.weight @ token
        probs = torch.sigmoid(logits) if layer.scoring == "sigmoid" else torch.softmax(logits, dim=-1)
        bias = layer.selection_bias if layer.selection_bias is not None else torch.zeros_like(probs)
        choice = [float(p + b) for p, b in zip(probs, bias, strict=True)]
        allowed = list(range(len(probs)))
        if layer.groups is not None:
            size = len(probs) // layer.groups.count
            groups = [allowed[g * size : (g + 1) * size] for g in range(layer.groups.count)]
            score = [sum(sorted((choice[e] for e in group), reverse=True)[:2]) for group in groups]
            best = sorted(range(len(groups)), key=lambda g: -score[g])[: layer.groups.top]
            allowed = [e for g in best for e in groups[g]]
        chosen = sorted(allowed, key=lambda e: -choice[e])[: layer.top_k]
        weights = probs[chosen] / (probs[chosen].sum() if layer.normalize else 1) * layer.scale
        y = sum(w * layer.experts[e](token) for w, e in zip(weights, chosen, strict=True))
        if layer.shared is not None:
            gate = 1 if layer.shared_gate is None else torch.sigmoid(layer.shared_gate.weight @ token)
            y = y + gate * layer.shared(token)
        out[index] = y
    return out


@pytest.mark.parametrize(
    ("activation", "bias", "moe"),
    [
        ("swiglu", False, {}),
        ("swiglu", False, {"normalize": False}),
        ("gelu", True, {"top_k": 1}),
        ("geglu", False, {"shared_d_ff": 5}),
        ("swiglu", False, {"shared_d_ff": 5, "shared_gate": True, "normalize": False, "top_k": 3}),
        ("swiglu", False, {"scoring": "sigmoid", "selection_bias": True, "scale": 2.5, "shared_d_ff": 5}),
        (
            "swiglu",
            False,
            {
                "experts": 8,
                "top_k": 3,
                "scoring": "sigmoid",
                "selection_bias": True,
                "groups": {"count": 4, "top": 2},
            },
        ),
        ("gelu", False, {"experts": 6, "normalize": False, "groups": {"count": 3, "top": 1}, "scale": 0.5}),
    ],
    ids=[
        "mixtral",
        "qwen3 unnormalised",
        "switch top-1 with biases",
        "shared expert",
        "qwen2-moe",
        "sigmoid, selection bias, scale",
        "deepseek-v3 groups",
        "softmax in one group",
    ],
)
@pytest.mark.parametrize("dispatch", [True, False], ids=["dispatched", "every expert"])
def test_a_layer_is_its_formula_token_by_token(
    activation: str, bias: bool, moe: dict, dispatch: bool
) -> None:
    layer = _layer(activation, bias, dispatch, **moe)
    x = torch.randn(2, 5, 6, dtype=torch.float64)
    with torch.no_grad():
        torch.testing.assert_close(layer(x), _by_token(layer, x))


def test_every_expert_gets_a_gradient_where_no_token_chose_it() -> None:
    layer = _layer(top_k=1).train()
    x = torch.randn(1, 1, 6, dtype=torch.float64)
    layer(x).sum().backward()
    grads = [expert.w_in.weight.grad for expert in layer.experts]  # type: ignore[union-attr]
    assert all(g is not None for g in grads)
    assert sorted(bool(g.abs().sum() > 0) for g in grads if g is not None) == [False, False, False, True]


def test_an_expert_no_token_chose_changes_nothing_and_one_that_was_chosen_does() -> None:
    layer = _layer()
    x = torch.randn(1, 1, 6, dtype=torch.float64)
    with torch.no_grad():
        before = layer(x)
        chosen = layer.router(x).topk(2, dim=-1).indices.flatten().tolist()
        idle = next(e for e in range(4) if e not in chosen)
        expert = layer.experts[idle]
        assert isinstance(expert, FeedForward)
        expert.w_out.weight.mul_(3)
        torch.testing.assert_close(layer(x), before)
        expert = layer.experts[chosen[0]]
        assert isinstance(expert, FeedForward)
        expert.w_out.weight.mul_(3)
        assert not torch.allclose(layer(x), before)


def test_the_balance_loss_is_switch_and_mixtrals() -> None:
    layer = _layer(balance_loss=0.5).train()
    x = torch.randn(3, 4, 6, dtype=torch.float64)
    layer(x)
    probs = torch.softmax(layer.router(x), dim=-1).reshape(-1, 4)
    chosen = probs.topk(2, dim=-1).indices  # (N, k)
    share = torch.stack([(chosen == e).sum() / len(probs) for e in range(4)])  # sums to k
    assert layer.balance is not None
    torch.testing.assert_close(layer.balance, 4 * (share * probs.mean(0)).sum())
    model = torch.nn.Sequential(layer, _layer(balance_loss=0.5).train())
    model(x)
    expected = 0.5 * torch.stack([m.balance for m in model if isinstance(m, MoE) and m.balance is not None])
    torch.testing.assert_close(balance_loss(model), expected.mean())


def test_the_selection_bias_chooses_the_experts_and_leaves_their_weights_to_the_scores() -> None:
    """A bias large enough moves every token to the experts it favours, each weighted by its own
    sigmoid score: the bias chooses, it never weighs."""
    layer = _layer(scoring="sigmoid", selection_bias=True, normalize=False)
    x = torch.randn(2, 3, 6, dtype=torch.float64)
    with torch.no_grad():
        assert layer.selection_bias is not None
        layer.selection_bias.copy_(torch.tensor([0.0, 50.0, 0.0, 50.0]))
        scores = torch.sigmoid(layer.router(x))
        expected = sum(scores[..., e, None] * layer.experts[e](x) for e in (1, 3))
        torch.testing.assert_close(layer(x), expected)
    assert "selection_bias" in layer.state_dict() and "selection_bias" not in dict(layer.named_parameters())


def test_sigmoid_scores_balance_as_their_share_of_each_tokens_sum() -> None:
    layer = _layer(scoring="sigmoid", balance_loss=0.5).train()
    x = torch.randn(3, 4, 6, dtype=torch.float64)
    layer(x)
    scores = torch.sigmoid(layer.router(x)).reshape(-1, 4)
    chosen = scores.topk(2, dim=-1).indices
    share = torch.stack([(chosen == e).sum() / len(scores) for e in range(4)])
    shares = scores / scores.sum(-1, keepdim=True)
    assert layer.balance is not None
    torch.testing.assert_close(layer.balance, 4 * (share * shares.mean(0)).sum())


def test_uniform_routing_balances_at_k_and_evaluation_keeps_no_loss() -> None:
    layer = _layer(top_k=3)
    with torch.no_grad():
        layer.router.weight.zero_()
    layer.eval()(torch.randn(2, 3, 6, dtype=torch.float64))
    assert layer.balance is None and balance_loss(layer) is None
    layer.train()(torch.randn(2, 3, 6, dtype=torch.float64))
    assert layer.balance is not None and layer.balance.item() == pytest.approx(3.0)
    unweighted = _layer(balance_loss=0).train()
    unweighted(torch.randn(2, 3, 6, dtype=torch.float64))
    assert balance_loss(unweighted) is None


def _moe_trainer(tmp_path: Path, weight: float, extra: str = "") -> object:
    from tfcompile.train import Trainer

    sets = [*TINY, "model.d_model=32", "model.max_seq_len=32", *ONE_STEP, f"train.runs_dir={tmp_path}"]
    moe = f"model.moe={{experts: 4, top_k: 2, balance_loss: {weight}{extra}}}"
    spec = load_spec(ROOT / "specs" / "shakespeare-char-llama.yaml", [*sets, moe, "model.dropout.residual=0"])
    return Trainer(spec, tmp_path / f"run{weight}", show_progress=False)


def test_the_trainer_adds_the_balance_loss_to_the_gradient_not_to_the_loss_it_reports(tmp_path: Path) -> None:
    grads, losses = [], []
    for weight in (0.0, 10.0):
        trainer = _moe_trainer(tmp_path, weight)
        loss, _ = trainer._forward_backward(1)  # type: ignore[attr-defined]
        losses.append(loss)
        router = trainer.model.blocks[0].ffn.router  # type: ignore[attr-defined]
        grads.append(router.weight.grad.clone())
        trainer.lock.release()  # type: ignore[attr-defined]
    assert losses[0] == pytest.approx(losses[1], rel=1e-6)
    assert not torch.allclose(grads[0], grads[1])


def test_a_bias_update_moves_each_selection_bias_toward_balance_by_the_sign_of_its_load() -> None:
    """DeepSeek-V3's rule, b_e += u * sign(mean(c) - c_e), over the choices c of every forward
    since the last update; evaluation counts none."""
    from tfcompile.nn.moe import update_selection_biases

    layer = _layer(experts=4, top_k=2, selection_bias=True, bias_update=0.1).float().train()
    before = layer.selection_bias.clone()
    x = torch.randn(2, 5, 6, generator=torch.Generator().manual_seed(0))
    chosen = (layer.router(x).softmax(-1) + before).topk(2, dim=-1).indices  # (2, 5, 2)
    counts = torch.bincount(chosen.flatten(), minlength=4).float()
    layer(x)
    layer(x)
    assert layer.load is not None and torch.equal(layer.load, 2 * counts)
    update_selection_biases(layer)
    torch.testing.assert_close(layer.selection_bias, before + 0.1 * torch.sign(counts.mean() - counts))
    assert layer.load is None
    layer.eval()(x)
    assert layer.load is None


def test_the_trainer_updates_the_selection_bias_after_each_step_and_not_without_a_rate(
    tmp_path: Path,
) -> None:
    biases = []
    for rate in (0.0, 0.25):
        trainer = _moe_trainer(tmp_path / str(rate), 0.0, f", selection_bias: true, bias_update: {rate}")
        loss, _ = trainer._forward_backward(1)  # type: ignore[attr-defined]
        trainer._clip_and_update(1, loss)  # type: ignore[attr-defined]
        biases.append(trainer.model.blocks[0].ffn.selection_bias.clone())  # type: ignore[attr-defined]
        trainer.lock.release()  # type: ignore[attr-defined]
    assert not biases[0].any()
    assert set(biases[1].tolist()) <= {-0.25, 0.0, 0.25} and biases[1].any()


@pytest.mark.parametrize(
    ("moe", "field"),
    [
        ("{experts: 4, top_k: 5}", "model.moe.top_k"),
        ("{experts: 1}", "model.moe.experts"),
        ("{experts: 2000}", "model.moe.experts"),
        ("{experts: 4, shared_gate: true}", "model.moe.shared_gate"),
        ("{experts: 4, dense_layers: [2]}", "model.moe.dense_layers"),
        ("{experts: 4, dense_layers: [1, 1]}", "model.moe.dense_layers"),
        ("{experts: 4, balance_loss: -1}", "model.moe.balance_loss"),
        ("{experts: 4, top_k: 2.5}", "model.moe.top_k"),
        ("{experts: 4, router: noisy}", "model.moe.router"),
        ("{experts: 4, scoring: relu}", "model.moe.scoring"),
        ("{experts: 6, groups: {count: 4, top: 1}}", "model.moe.groups.count"),
        ("{experts: 4, groups: {count: 4, top: 1}}", "model.moe.groups.count"),
        ("{experts: 4, groups: {count: 1, top: 1}}", "model.moe.groups.count"),
        ("{experts: 8, groups: {count: 4, top: 5}}", "model.moe.groups.top"),
        ("{experts: 8, top_k: 5, groups: {count: 4, top: 2}}", "model.moe.top_k"),
        ("{experts: 4, scale: 0}", "model.moe.scale"),
        ("{experts: 4, bias_update: 0.001}", "model.moe.bias_update"),  # no selection bias
        ("{experts: 4, selection_bias: true, bias_update: -0.1}", "model.moe.bias_update"),
    ],
)
def test_the_schema_refuses_what_has_no_meaning_at_its_field(moe: str, field: str) -> None:
    with pytest.raises(SpecError) as error:
        parse_spec(f"model: {{{MODEL}, moe: {moe}}}\n")
    assert [issue.path for issue in error.value.issues] == [field], error.value


def test_the_experts_width_defaults_to_the_models_and_one_expert_is_weighted_by_its_probability() -> None:
    spec = tiny_model(activation="swiglu", moe={"experts": 4})
    assert spec.moe is not None and spec.moe.d_ff == spec.d_ff and spec.moe.top_k == 2 and spec.moe.normalize
    switch = tiny_model(moe={"experts": 4, "top_k": 1}).moe
    assert switch is not None and switch.normalize is False
    layer = MoE(6, switch.model_copy(update={"balance_loss": 0}), "gelu", False).train()
    layer(torch.randn(2, 3, 6)).sum().backward()
    assert layer.router.weight.grad is not None and layer.router.weight.grad.abs().sum() > 1e-3  # 1e-7 if 1
    assert spec.routed_layers(spec.n_layers) == {0, 1}
    dense = tiny_model(moe={"experts": 4, "dense_layers": [0]})
    assert dense.routed_layers(2) == {1}
    model = DecoderLM(dense)
    assert isinstance(model.blocks[0].ffn, FeedForward) and isinstance(model.blocks[1].ffn, MoE)


FAMILIES = {
    "decoder": f"model: {{{MODEL}, moe: {{experts: 3, shared_d_ff: 8, shared_gate: true}}}}\n",
    "encoder shared layers": f"model: {{{MODEL}, family: encoder, share_layers: true, moe: {{experts: 4}}}}\n"
    "task: {type: classification, labels: [a, b]}\n",
    "encoder_decoder": f"model: {{{MODEL}, family: encoder_decoder, n_decoder_layers: 3, "
    "moe: {experts: 4, top_k: 1, d_ff: 24, dense_layers: [0]}}\ntask: seq2seq\n",
    "vit": "model: {family: vit, image_size: 8, patch_size: 4, channels: 1, d_model: 16, n_layers: 2, "
    "n_heads: 2, moe: {experts: 2, top_k: 1}}\ntask: {type: image_classification, labels: [a, b]}\n",
}


@pytest.mark.parametrize("text", FAMILIES.values(), ids=FAMILIES)
def test_every_family_counts_what_it_builds_and_trains_its_router(text: str) -> None:
    spec = parse_spec(text)
    model = build_model(spec).train()
    assert spec.parameter_count() == sum(p.numel() for p in model.parameters())
    layers = [m for m in model.modules() if isinstance(m, MoE)]
    assert layers
    example = model.example_inputs(2)  # type: ignore[operator]
    out = model(*example)
    loss = (out if isinstance(out, torch.Tensor) else out[0]).float().square().mean()
    balance = balance_loss(model)
    assert balance is not None
    (loss + balance).backward()
    assert all(m.router.weight.grad is not None and m.router.weight.grad.abs().sum() > 0 for m in layers)


def test_a_decoder_of_experts_agrees_with_its_kv_cache() -> None:
    model = randomised(DecoderLM(tiny_model(positional="rope", activation="swiglu", moe={"experts": 4})))
    ids = torch.randint(0, 50, (2, 9), generator=torch.Generator().manual_seed(0))
    with torch.no_grad():
        expected = model(ids)
        cache = model.empty_cache(2)
        steps = [model(ids[:, :4], cache=cache)]
        steps += [model(ids[:, t : t + 1], cache=cache) for t in range(4, 9)]
        torch.testing.assert_close(torch.cat(steps, 1), expected)


def test_the_flops_count_the_chosen_experts_and_the_router() -> None:
    dense = tiny_model(activation="swiglu", d_ff=64)
    moe = tiny_model(activation="swiglu", d_ff=64, moe={"experts": 8, "top_k": 3, "dense_layers": [1]})
    assert dense.d_ff == 64
    ffn = 2 * (32 * 2 * 64 + 64 * 32)  # a gated feed-forward's two matmuls per token
    extra = 2 * 32 * 8 + (3 - 1) * ffn  # one routed layer: its router and two more experts
    counts = [forward_flops_per_token(DecoderLM(s), s) for s in (dense, moe)]
    assert counts[1] - counts[0] == extra


def test_the_summary_notes_each_layers_experts_and_the_parameters_a_token_reaches() -> None:
    from tfcompile.summary import summarize

    spec = load_spec(ROOT / "specs" / "shakespeare-char-moe.yaml")
    rows = [row for row in summarize(spec).rows if row.kind == "MoE"]
    router, expert = 384 * 8, 3 * 384 * 512
    assert len(rows) == 6 and rows[0].params == router + 8 * expert
    assert rows[0].note == f"2 of 8 experts per token: {router + 2 * expert:,} parameters active"


BUNDLES = {
    "decoder, RoPE, shared gated expert": f"model: {{{MODEL}, positional: rope, activation: swiglu, "
    "moe: {experts: 4, shared_d_ff: 8, shared_gate: true, normalize: false}}\n",
    "encoder classifier": f"model: {{{MODEL}, family: encoder, moe: {{experts: 3, top_k: 1}}}}\n"
    "task: {type: classification, labels: [a, b]}\n",
    "encoder-decoder": f"model: {{{MODEL}, family: encoder_decoder, "
    "moe: {experts: 4, dense_layers: [1]}}\ntask: seq2seq\n",
    "decoder, sigmoid scores in groups": f"model: {{{MODEL}, positional: rope, activation: swiglu, "
    "moe: {experts: 8, top_k: 3, scoring: sigmoid, selection_bias: true, groups: {count: 4, top: 2}, "
    "scale: 2.5, shared_d_ff: 8}}\n",
}


@pytest.mark.slow
@pytest.mark.parametrize("text", BUNDLES.values(), ids=BUNDLES)
def test_every_graph_exports_with_parity(text: str, tmp_path: Path) -> None:
    assert_exports_with_parity(text, tmp_path / "bundle")


@pytest.mark.slow
def test_a_trained_decoder_of_experts_fuses_and_generates_as_pytorch(tmp_path: Path) -> None:
    from helpers import trained_decoder_generates_as_pytorch

    trained_decoder_generates_as_pytorch(tmp_path, ["model.moe={experts: 4, top_k: 2, shared_d_ff: 16}"])


def test_export_hf_writes_a_llama_of_experts_as_mixtral_and_refuses_what_mixtral_lacks_by_field(
    tmp_path: Path,
) -> None:
    from tfcompile.hf.errors import HFError
    from tfcompile.hf.exporter import export_hf

    def run(moe: str, name: str) -> Path:
        return random_run(
            tmp_path / name,
            "model: {vocab_size: 64, d_model: 32, n_heads: 4, n_layers: 1, max_seq_len: 24, "
            "positional: rope, norm: {type: rmsnorm}, activation: swiglu, "
            "bias: {qkv: false, attn_out: false, ffn: false}, "
            f"moe: {moe}}}\n",
        )

    assert export_hf(run("{experts: 4}", "a"), tmp_path / "mixtral") == "MixtralForCausalLM"
    refused = {  # by Mixtral; scored by sigmoids, they are GLM-4.5's (tests/test_hf_glm4_moe.py)
        "normalize": "normalize: false",
        "selection_bias": "selection_bias: true",
        "groups": "groups: {count: 2, top: 1}",
        "scale": "scale: 2.5",
    }
    for field, setting in refused.items():
        with pytest.raises(HFError, match=rf"\n  {re.escape(f'model.moe.{field}')}: "):
            export_hf(run(f"{{experts: 4, {setting}}}", field), tmp_path / "out")
        assert not (tmp_path / "out").exists()


def test_a_layer_keeps_the_activations_dtype() -> None:
    layer = MoE(6, MoESpec(experts=3, d_ff=4), "swiglu", False).to(torch.bfloat16)
    assert layer(torch.randn(2, 3, 6, dtype=torch.bfloat16)).dtype == torch.bfloat16


@pytest.mark.parametrize("sign", [1, -1], ids=["second expert", "first expert"])
def test_a_float16_model_routes_in_float32_so_a_near_tie_chooses_as_float32(sign: int) -> None:
    """Two experts' router rows 1e-5 apart, closer than float16 can tell (its step at 0.5 is
    2^-11): in float16 weights they would tie, and a tie chooses by index whichever of the two the
    float32 model would have chosen. Kept in float32, the half model chooses the float32 model's
    expert for either order."""
    layer = _layer(experts=3, top_k=1, selection_bias=True, scoring="sigmoid").float()
    with torch.no_grad():
        layer.router.weight.copy_(torch.tensor([[0.5] * 6, [0.5 + sign * 1e-5] * 6, [-0.5] * 6]))
        layer.selection_bias.zero_()
    x = torch.rand(1, 4, 6).add(0.1).half()  # u.x > 0: the second row scores above the first
    reference = layer(x.float())
    halved = half(copy.deepcopy(layer))
    assert halved.router.weight.dtype == halved.selection_bias.dtype == torch.float32
    assert halved.experts[0].w_in.weight.dtype == torch.float16
    served = halved(x)
    assert served.dtype == torch.float16
    torch.testing.assert_close(served.float(), reference, rtol=1e-2, atol=1e-2)


@pytest.mark.slow  # an fp16 export and its parity: 6 s
def test_an_fp16_bundle_keeps_its_routers_in_float32(tmp_path: Path) -> None:
    from tfcompile.export import Source, export_bundle

    spec = parse_spec(BUNDLES["decoder, RoPE, shared gated expert"])
    reports = export_bundle(spec, Source(seed=0), tmp_path / "bundle", precision="fp16")
    assert all(r.passed and r.relative for r in reports.values())
    weights = [
        w for w in onnx.load(str(tmp_path / "bundle" / "model.onnx")).graph.initializer if len(w.dims) == 2
    ]
    float32 = [list(w.dims) for w in weights if w.data_type == onnx.TensorProto.FLOAT]
    assert float32 == [[16, 4], [16, 4]]  # each layer's router, (d_model, experts)
    assert len(weights) > 20 and {w.data_type for w in weights} == {
        onnx.TensorProto.FLOAT,
        onnx.TensorProto.FLOAT16,
    }


@pytest.mark.slow  # an export, its fp16 conversion and their parity: 10 s
def test_optimize_to_fp16_keeps_the_routing_in_float32_as_an_fp16_export_does(tmp_path: Path) -> None:
    """onnxruntime's converter, told to keep the routing nodes, would still round the router weights
    it casts and the scores between those nodes to float16: the router reads its float32 weights,
    the scores go from node to node in float32, and only the experts' side is float16."""
    from tfcompile.export import Source, export_bundle
    from tfcompile.optimize import Plan, optimize_bundle, passes

    export_bundle(parse_spec(BUNDLES["decoder, sigmoid scores in groups"]), Source(seed=0), tmp_path / "fp32")
    optimization = optimize_bundle(tmp_path / "fp32", tmp_path / "fp16", Plan(precision="fp16"), None)
    assert max(optimization.parity.values()) <= 1e-2
    for name in ("model.onnx", "decoder_step.onnx"):
        graph = onnx.load(str(tmp_path / "fp16" / name)).graph
        weights = {w.name: w.data_type for w in graph.initializer if len(w.dims) == 2}
        kept = set(passes.routing_nodes(onnx.load(str(tmp_path / "fp32" / name))))
        routing = [n for n in graph.node if n.name in kept]
        routers = [n for n in routing if n.op_type == "MatMul"]
        assert len(routers) == 2  # a layer each
        assert [weights.get(n.input[1]) for n in routers] == [onnx.TensorProto.FLOAT] * 2

        casts = {output: node for node in graph.node if node.op_type == "Cast" for output in node.output}
        # a routing node reading a value cast to float16 and back
        halved = [(n.name, i) for n in routing for i in n.input if i in casts and casts[i].input[0] in casts]
        assert not halved
        assert {weights[w] for w in weights} == {onnx.TensorProto.FLOAT, onnx.TensorProto.FLOAT16}
    assert (passes.MOE_CLASS, passes.EXPERT_CLASS) == tuple(
        f"{c.__module__}.{c.__qualname__}" for c in (MoE, FeedForward)
    )


@pytest.mark.slow  # two fp16 exports and their parity: 12 s
def test_an_fp16_export_of_experts_that_fails_its_parity_says_a_token_may_route_otherwise(
    tmp_path: Path,
) -> None:
    """A token whose experts' scores tie within float16's precision can choose others in the fp16
    graph (the sigmoid-scored model here did at seed 0 while its routers were float16 too): where
    such a model misses its bound (a tight one here), the error says so; a dense model's does not."""
    from tfcompile.errors import ExportError
    from tfcompile.export import Source, export_bundle

    tight = "export: {fp16_tolerance: 1.0e-6}\n"
    routed = r"can send a token to other experts .* raise export\.fp16_tolerance, or export in fp32"
    with pytest.raises(ExportError, match=routed):
        export_bundle(
            parse_spec(BUNDLES["decoder, sigmoid scores in groups"] + tight),
            Source(seed=0),
            tmp_path / "a",
            precision="fp16",
        )
    with pytest.raises(ExportError) as dense:
        export_bundle(
            parse_spec(f"model: {{{MODEL}}}\n" + tight), Source(seed=0), tmp_path / "b", precision="fp16"
        )
    assert "experts" not in str(dense.value)
    assert not list(tmp_path.iterdir())

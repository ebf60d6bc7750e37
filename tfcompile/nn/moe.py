"""Mixture-of-experts feed-forward (Shazeer et al. 2017; Switch, Fedus et al. 2021; Mixtral, Jiang
et al. 2024).

A router scores each token x against the E experts, p = softmax(x W_r [+ b_r]) (``scoring:
sigmoid``: p = sigmoid(x W_r), each expert's own, as DeepSeek-V3); the token goes through the k
experts of highest p (of highest p + b_s where ``selection_bias``, among the experts of the best
``groups`` alone where they are set), whose outputs are summed weighted by their p (rescaled to
sum to 1 where ``normalize``, then times ``scale``), beside a shared expert that every token goes
through (gated by sigmoid(x w_s) where ``shared_gate``):

    MoE(x) = sum_{e in topk(p [+ b_s])} scale w_e FFN_e(x)  [+ sigmoid(x w_s) FFN_s(x)]

Each expert is a FeedForward of its own. In PyTorch each expert reads the tokens that chose it
(``dispatch``), every expert even where none did (a batch of 0 rows), so that every expert's
weights get a gradient, as DDP requires. The graphs the ONNX exporter traces keep one shape for
every input instead: every expert reads every token and the ones a token did not choose are
weighted 0, exact at E / k times the FLOPs (benchmarks/moe_dispatch.py measures both).

While training, each layer keeps the load-balancing loss of Switch (k = 1) and Mixtral (k > 1) in
``balance``: E * sum_e f_e P_e, where f_e is the share of the tokens' choices that went to expert
e (f sums to k) and P_e the mean of e's router probability (sigmoid scores: each token's, rescaled
to sum to 1, as DeepSeek-V3's sequence-wise loss); uniform routing makes it k.
``balance_loss`` averages it over a model's MoE layers, times the spec's ``balance_loss``, for the
trainer to add to the task's loss. Where the spec sets ``bias_update``, each layer counts its
experts' choices instead, and ``update_selection_biases`` moves the selection bias toward balance
after each optimizer step (DeepSeek-V3's balancing without a loss).
"""

from __future__ import annotations

import copy

import torch
import torch.nn.functional as F
from torch import nn

from tfcompile.nn.feedforward import FeedForward
from tfcompile.spec.schema import MoESpec


class MoE(nn.Module):
    """(batch, seq, d_model) -> (batch, seq, d_model)."""

    def __init__(self, d_model: int, spec: MoESpec, activation: str, bias: bool) -> None:
        super().__init__()
        assert spec.d_ff is not None  # resolved by the schema
        self.top_k, self.normalize = spec.top_k, bool(spec.normalize)  # resolved by the schema
        self.scoring, self.groups, self.scale = spec.scoring, spec.groups, spec.scale
        self.router = nn.Linear(d_model, spec.experts, bias=spec.router_bias)
        self.selection_bias: torch.Tensor | None  # read with the weights, never trained: a buffer
        self.register_buffer("selection_bias", torch.zeros(spec.experts) if spec.selection_bias else None)
        self.experts = nn.ModuleList(
            FeedForward(d_model, spec.d_ff, activation, bias) for _ in range(spec.experts)
        )
        shared = spec.shared_d_ff
        self.shared = None if shared is None else FeedForward(d_model, shared, activation, bias)
        self.shared_gate = nn.Linear(d_model, 1, bias=False) if spec.shared_gate else None
        self.balance_weight = spec.balance_loss
        self.balance: torch.Tensor | None = None  # the last training forward's load-balancing loss
        self.bias_update = spec.bias_update
        self.load: torch.Tensor | None = None  # each expert's choices since the last bias update

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        logits = self.router(x.to(self.router.weight.dtype))  # (B, T, E); float32 in fp16 models
        logits = logits.to(torch.promote_types(x.dtype, torch.float32))  # as Mixtral's
        probs = logits.sigmoid() if self.scoring == "sigmoid" else logits.softmax(dim=-1)
        choice = probs if self.selection_bias is None else probs + self.selection_bias
        if self.groups is not None:
            choice = self._in_top_groups(choice)
        chosen = choice.topk(self.top_k, dim=-1).indices  # (B, T, k)
        top = probs.gather(-1, chosen)
        if self.normalize:
            top = top / top.sum(dim=-1, keepdim=True)
        top = top * self.scale
        if self.training and self.bias_update:  # counted, not differentiated
            if self.load is None:
                self.load = torch.zeros(len(self.experts), device=x.device)
            self.load = self.load + F.one_hot(chosen, len(self.experts)).sum(dim=(0, 1, 2)).detach()
        if self.training and self.balance_weight > 0:
            chosen_share = F.one_hot(chosen, len(self.experts)).float().mean(dim=(0, 1)).sum(dim=0)  # (E,)
            # P: each token's sigmoid scores rescaled to sum to 1
            shares = probs / probs.sum(dim=-1, keepdim=True) if self.scoring == "sigmoid" else probs
            self.balance = len(self.experts) * (chosen_share * shares.mean(dim=(0, 1))).sum()
        if self.dispatch and not x.is_meta:
            out = self._dispatched(x, top.to(x.dtype), chosen)
        else:
            weights = torch.zeros_like(probs).scatter(-1, chosen, top).to(x.dtype)  # (B, T, E), 0 if unchosen
            out = torch.zeros_like(x)
            for e, expert in enumerate(self.experts):
                out = out + weights[..., e, None] * expert(x)
        if self.shared is not None:
            shared = self.shared(x)
            out = out + (shared if self.shared_gate is None else torch.sigmoid(self.shared_gate(x)) * shared)
        return out

    def _in_top_groups(self, choice: torch.Tensor) -> torch.Tensor:
        """``choice`` (B, T, E) with the experts outside each token's best groups at -inf: a group's
        score is the sum of its two highest."""
        assert self.groups is not None
        grouped = choice.unflatten(-1, (self.groups.count, -1))  # (B, T, G, E / G)
        scores = grouped.topk(2, dim=-1).values.sum(dim=-1)  # (B, T, G)
        best = scores.topk(self.groups.top, dim=-1).indices
        kept = torch.zeros_like(scores, dtype=torch.bool).scatter(-1, best, True)
        return grouped.masked_fill(~kept[..., None], float("-inf")).flatten(-2)

    @property
    def dispatch(self) -> bool:
        """Whether each token goes through its chosen experts only: everywhere but in the graphs the
        ONNX exporter traces, which keep one shape for every input (torch.compile breaks its graph
        where the experts' token counts are read)."""
        return not torch.onnx.is_in_onnx_export()

    def _dispatched(self, x: torch.Tensor, top: torch.Tensor, chosen: torch.Tensor) -> torch.Tensor:
        """The routed experts' weighted sum, each expert reading the tokens that chose it: the
        (token, choice) pairs sorted by expert, each expert's run through it, and each output
        added to its token's row."""
        d = x.shape[-1]
        flat, choices = x.reshape(-1, d), chosen.flatten()  # (N, d), (N * k,)
        order = choices.argsort(stable=True)
        rows = order // self.top_k  # the token of each sorted choice
        counts = torch.bincount(choices, minlength=len(self.experts)).tolist()
        inputs = flat[rows].split(counts)
        outputs = torch.cat([expert(chunk) for expert, chunk in zip(self.experts, inputs, strict=True)])
        weighted = outputs * top.flatten()[order, None]
        return torch.zeros_like(flat).index_add(0, rows, weighted.to(flat.dtype)).view_as(x)

    def active_parameters(self) -> int:
        """The parameters one token computes with: the router, its top_k experts', the shared
        expert and its gate."""
        expert = sum(p.numel() for p in self.experts[0].parameters())
        idle = (len(self.experts) - self.top_k) * expert
        return sum(p.numel() for p in self.parameters()) - idle

    def idle_flops_per_token(self) -> int:
        """The FLOPs per token of the experts a token does not choose: what a count of every
        Linear's takes back to count the ones a token computes with."""
        expert = self.experts[0]
        assert isinstance(expert, FeedForward)
        per_expert = sum(2 * m.in_features * m.out_features for m in (expert.w_in, expert.w_out))
        return (len(self.experts) - self.top_k) * per_expert


def half(model: nn.Module) -> nn.Module:
    """``model`` in float16 in place, but for its MoE routers and selection biases, kept in float32
    as transformers keeps DeepSeek-V3's and GLM-4.5's: an expert is chosen by comparing scores,
    which float16's weights turn into ties or flip near ties. The routers read their inputs cast to
    float32, a sliver of a layer's FLOPs."""
    kept = {
        m: (copy.deepcopy(m.router).float(), m.selection_bias) for m in model.modules() if isinstance(m, MoE)
    }
    model.half()  # rounds parameters in place: the routers above are copies
    for m, (router, selection_bias) in kept.items():
        m.router, m.selection_bias = router, selection_bias
    return model


@torch.no_grad()
def update_selection_biases(model: nn.Module) -> None:
    """After an optimizer step, each MoE layer with a ``bias_update`` rate u moves its selection
    bias toward balance (DeepSeek-V3's auxiliary-loss-free balancing): b_e += u * sign(mean(c) - c_e),
    c_e the choices of expert e since the last update (every micro-batch, summed over the
    processes), so that an expert chosen less than the mean is chosen more; the counts restart."""
    distributed = torch.distributed.is_available() and torch.distributed.is_initialized()
    for m in model.modules():
        if isinstance(m, MoE) and m.load is not None and m.selection_bias is not None:
            load = m.load
            if distributed:
                torch.distributed.all_reduce(load)
            m.selection_bias += m.bias_update * torch.sign(load.mean() - load).to(m.selection_bias.dtype)
            m.load = None


def balance_loss(model: nn.Module) -> torch.Tensor | None:
    """The mean over the model's MoE layers of the load-balancing losses they kept in their last
    training forward, times the spec's balance_loss; None where it has none."""
    losses = [
        m.balance_weight * m.balance for m in model.modules() if isinstance(m, MoE) and m.balance is not None
    ]
    return torch.stack(losses).mean() if losses else None

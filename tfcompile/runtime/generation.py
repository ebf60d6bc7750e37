"""Text generation from a decoder bundle: greedy, temperature, top-k and top-p sampling, with the
KV-cache graph (one token per step) or the full graph. With the cache, the keys and values stay
where the execution provider keeps them (the GPU, under CUDA) between steps: onnxruntime's I/O
binding hands each step's outputs to the next step without a copy; only the logits come back."""

from __future__ import annotations

from collections.abc import Sequence
from pathlib import Path
from typing import Any

import numpy as np

from tfcompile.runtime.errors import InputError
from tfcompile.runtime.ort import ort, run
from tfcompile.runtime.session import Bundle


class LanguageModel(Bundle):
    """A decoder bundle. ``logits(input_ids, attention_mask)`` -> (batch, seq, vocab) float32;
    ``generate`` and ``generate_text`` decode with the KV-cache graph."""

    def __init__(self, bundle: str | Path, providers: Sequence[str] | None = None) -> None:
        super().__init__(bundle, providers)
        self._step: ort.InferenceSession | None = None  # the incremental graph, loaded on first use

    def logits(self, input_ids: Any, attention_mask: Any | None = None) -> np.ndarray:
        ids = self._token_ids(input_ids)
        mask = np.ones_like(ids) if attention_mask is None else self._mask(attention_mask, ids.shape)
        (logits,) = run(self.session, {"input_ids": ids, "attention_mask": mask}, ["logits"])
        return logits

    def generate(
        self,
        input_ids: Any,
        max_new_tokens: int,
        temperature: float = 1.0,
        top_k: int | None = None,
        top_p: float | None = None,
        seed: int | None = None,
        use_cache: bool = True,
    ) -> np.ndarray:
        """input_ids (batch, prompt) -> (batch, prompt + max_new_tokens). With the cache each step
        runs the incremental graph on one token; without it, the full graph on the whole sequence."""
        ids = self._token_ids(input_ids)
        _check_sampling(max_new_tokens, temperature, top_k, top_p)
        if ids.shape[1] + max_new_tokens > self.max_seq_len:
            raise InputError(
                f"the prompt ({ids.shape[1]} tokens) plus max_new_tokens ({max_new_tokens}) exceeds the "
                f"model's context of {self.max_seq_len}"
            )
        rng = np.random.default_rng(seed)
        if not use_cache:
            for _ in range(max_new_tokens):
                next_ids = sample_next(self.logits(ids)[:, -1], temperature, top_k, top_p, rng)
                ids = np.concatenate([ids, next_ids[:, None]], axis=1)
            return ids
        step = self._step_session()
        names = [i["name"] for i in self.manifest["graphs"]["step"]["inputs"]]
        presents = [o.name for o in step.get_outputs()][1:]
        device = "cuda" if step.get_providers()[0] == "CUDAExecutionProvider" else "cpu"
        binding = step.io_binding()
        past: list[Any] = self._empty_cache("step", ids.shape[0])  # then OrtValues on the device
        new = ids
        for _ in range(max_new_tokens):
            binding.bind_cpu_input("input_ids", np.ascontiguousarray(new, dtype=np.int64))
            binding.bind_cpu_input("attention_mask", np.ones(ids.shape, dtype=np.int64))
            for name, value in zip(names[2:], past, strict=True):
                if isinstance(value, np.ndarray):
                    binding.bind_cpu_input(name, value)
                else:
                    binding.bind_ortvalue_input(name, value)
            binding.bind_output("logits", "cpu")
            for name in presents:
                binding.bind_output(name, device)
            step.run_with_iobinding(binding)
            logits, *past = binding.get_outputs()
            last = logits.numpy()[:, -1].astype(np.float32)
            new = sample_next(last, temperature, top_k, top_p, rng)[:, None]
            ids = np.concatenate([ids, new], axis=1)
        return ids

    def generate_text(self, prompt: str, max_new_tokens: int, **options: Any) -> str:
        """Encode ``prompt`` with the bundle's tokenizer, generate, and decode the whole text."""
        if self.tokenizer is None:
            raise InputError(f"{self.path} has no tokenizer.json: pass token ids to generate()")
        prompt_ids = self.tokenizer.encode(prompt).ids
        if not prompt_ids:
            raise InputError("the prompt encodes to no tokens: give at least one character")
        ids = self.generate(np.array([prompt_ids]), max_new_tokens, **options)
        return self.tokenizer.decode(ids[0].tolist())

    def _step_session(self) -> ort.InferenceSession:
        if self._step is None:
            graph = self.manifest["graphs"]["step"]
            self._step = ort.InferenceSession(str(self.path / graph["file"]), providers=self._providers)
        return self._step


def _check_sampling(max_new_tokens: int, temperature: float, top_k: int | None, top_p: float | None) -> None:
    if max_new_tokens < 0:
        raise InputError(f"max_new_tokens must be >= 0, got {max_new_tokens}")
    if temperature < 0:
        raise InputError(f"temperature must be >= 0 (0 is greedy), got {temperature}")
    if top_k is not None and top_k < 1:
        raise InputError(f"top_k must be >= 1, got {top_k}")
    if top_p is not None and not 0 < top_p <= 1:
        raise InputError(f"top_p must be in (0, 1], got {top_p}")


def sample_next(
    logits: np.ndarray,
    temperature: float = 1.0,
    top_k: int | None = None,
    top_p: float | None = None,
    rng: np.random.Generator | None = None,
) -> np.ndarray:
    """logits (B, V) -> next token ids (B,). Temperature 0 is greedy (argmax); top-k keeps the k
    most likely tokens, top-p the fewest whose probabilities reach p."""
    if temperature == 0:
        return logits.argmax(axis=-1)
    rng = rng or np.random.default_rng()
    scores = logits.astype(np.float64) / temperature
    if top_k is not None and top_k < scores.shape[-1]:
        kth = np.sort(scores, axis=-1)[:, -top_k][:, None]
        scores = np.where(scores < kth, -np.inf, scores)
    probs = np.exp(scores - scores.max(axis=-1, keepdims=True))
    probs /= probs.sum(axis=-1, keepdims=True)
    if top_p is not None and top_p < 1.0:
        order = np.argsort(-probs, axis=-1)
        sorted_probs = np.take_along_axis(probs, order, axis=-1)
        drop_sorted = np.cumsum(sorted_probs, axis=-1) - sorted_probs >= top_p
        drop = np.zeros_like(drop_sorted)
        np.put_along_axis(drop, order, drop_sorted, axis=-1)
        probs = np.where(drop, 0.0, probs)
        probs /= probs.sum(axis=-1, keepdims=True)
    return np.array([rng.choice(len(p), p=p) for p in probs])

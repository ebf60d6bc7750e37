"""Text generation from a decoder bundle: greedy, temperature, top-k and top-p sampling
(tfcompile.search, shared with training), with the KV-cache graph (one token per step) or the full
graph. With the cache, the keys and values stay where the execution provider keeps them (the GPU,
under CUDA) between steps: onnxruntime's I/O binding hands each step's outputs to the next step
without a copy; only the logits come back."""

from __future__ import annotations

from collections.abc import Sequence
from pathlib import Path
from typing import Any

import numpy as np

from tfcompile import search
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
        decoder = _StepDecoder(self) if use_cache else _FullDecoder(self)
        rng = np.random.default_rng(seed)
        new = search.generate(decoder, ids, max_new_tokens, temperature, top_k, top_p, rng)
        return np.concatenate([ids, np.array(new, dtype=np.int64).reshape(len(ids), -1)], axis=1)

    def generate_text(self, prompt: str, max_new_tokens: int, **options: Any) -> str:
        """Encode ``prompt`` with the bundle's tokenizer, generate, and decode the whole text."""
        if self.tokenizer is None:
            raise InputError(f"{self.path} has no tokenizer.json: pass token ids to generate()")
        prompt_ids = self.tokenizer.encode(prompt).ids
        if not prompt_ids:
            raise InputError("the prompt encodes to no tokens: give at least one character")
        ids = self.generate(np.array([prompt_ids]), max_new_tokens, **options)
        return self.tokenizer.decode(ids[0].tolist())

    def step_session(self) -> ort.InferenceSession:
        if self._step is None:
            graph = self.manifest["graphs"]["step"]
            self._step = ort.InferenceSession(str(self.path / graph["file"]), providers=self._providers)
        return self._step


class _StepDecoder:
    """The step graph as a search.Decoder: each step binds the new tokens and the cache, runs, and
    keeps the present keys and values (OrtValues on the provider's device) as the next past."""

    def __init__(self, model: LanguageModel) -> None:
        self.model = model
        self.session = model.step_session()
        self.names = [i["name"] for i in model.manifest["graphs"]["step"]["inputs"]]
        self.presents = [o.name for o in self.session.get_outputs()][1:]
        self.device = "cuda" if self.session.get_providers()[0] == "CUDAExecutionProvider" else "cpu"
        self.binding = self.session.io_binding()
        self.past: list[Any] = []
        self.length = 0  # tokens in the cache

    def step(self, tokens: np.ndarray) -> np.ndarray:
        if not self.past:
            self.past = self.model.empty_cache("step", len(tokens))
        self.length += tokens.shape[1]
        binding = self.binding
        binding.bind_cpu_input("input_ids", np.ascontiguousarray(tokens, dtype=np.int64))
        binding.bind_cpu_input("attention_mask", np.ones((len(tokens), self.length), dtype=np.int64))
        for name, value in zip(self.names[2:], self.past, strict=True):
            if isinstance(value, np.ndarray):
                binding.bind_cpu_input(name, value)
            else:
                binding.bind_ortvalue_input(name, value)
        binding.bind_output("logits", "cpu")
        for name in self.presents:
            binding.bind_output(name, self.device)
        self.session.run_with_iobinding(binding)
        logits, *self.past = binding.get_outputs()
        return logits.numpy()[:, -1].astype(np.float32)

    def reorder(self, rows: np.ndarray) -> None:
        self.past = [(p if isinstance(p, np.ndarray) else p.numpy())[rows] for p in self.past]

    def reset(self) -> None:
        self.past, self.length = [], 0


class _FullDecoder:
    """The full graph as a search.Decoder: no cache, the whole sequence each step."""

    def __init__(self, model: LanguageModel) -> None:
        self.model = model
        self.ids: np.ndarray | None = None

    def step(self, tokens: np.ndarray) -> np.ndarray:
        self.ids = tokens if self.ids is None else np.concatenate([self.ids, tokens], axis=1)
        return self.model.logits(self.ids)[:, -1]

    def reorder(self, rows: np.ndarray) -> None:
        assert self.ids is not None
        self.ids = self.ids[rows]

    def reset(self) -> None:
        self.ids = None


def _check_sampling(max_new_tokens: int, temperature: float, top_k: int | None, top_p: float | None) -> None:
    if max_new_tokens < 0:
        raise InputError(f"max_new_tokens must be >= 0, got {max_new_tokens}")
    if temperature < 0:
        raise InputError(f"temperature must be >= 0 (0 is greedy), got {temperature}")
    if top_k is not None and top_k < 1:
        raise InputError(f"top_k must be >= 1, got {top_k}")
    if top_p is not None and not 0 < top_p <= 1:
        raise InputError(f"top_p must be in (0, 1], got {top_p}")

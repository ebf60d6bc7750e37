"""BERT's masking rule (15%; 80/10/10; never special tokens) and next-sentence pairs."""

from __future__ import annotations

import math
from pathlib import Path

import pytest
import torch
from helpers import SHARED_DATA

from tfcompile.sequences import SPECIAL_TOKENS
from tfcompile.spec import Spec, SpecError, parse_spec
from tfcompile.tasks.causal_lm import IGNORE_INDEX
from tfcompile.tasks.masked_lm import MaskedLanguageModelling, MaskingRule, mask_tokens

MASK_ID, VOCAB = 4, 1000


def test_masking_rule_on_a_large_batch() -> None:
    g = torch.Generator().manual_seed(0)
    ids = torch.randint(len(SPECIAL_TOKENS), VOCAB, (256, 512), generator=g)
    ids[:, 0], ids[:, -1] = 2, 3  # [CLS] ... [SEP]
    ids[::3, 400:] = 0  # padding
    maskable = ids >= len(SPECIAL_TOKENS)
    replacements = torch.arange(len(SPECIAL_TOKENS), VOCAB)
    corrupted, targets = mask_tokens(ids, maskable, MaskingRule(), MASK_ID, replacements, g)
    chosen = targets != IGNORE_INDEX
    assert not chosen[~maskable].any(), "a special or padding token was chosen"
    assert torch.equal(corrupted[~maskable], ids[~maskable])
    assert torch.equal(targets[chosen], ids[chosen])
    assert abs(chosen.sum().item() / maskable.sum().item() - 0.15) < 0.01
    n = chosen.sum().item()
    masked = (corrupted == MASK_ID) & chosen
    unchanged = (corrupted == ids) & chosen
    random = chosen & ~masked & ~unchanged
    # A random replacement that draws the original token counts as unchanged: 1 in ~1000.
    assert abs(masked.sum().item() / n - 0.8) < 0.02
    assert abs(random.sum().item() / n - 0.1) < 0.02
    assert abs(unchanged.sum().item() / n - 0.1) < 0.02
    assert (corrupted[random] >= len(SPECIAL_TOKENS)).all(), "random replacements are never special tokens"
    assert not ((corrupted != ids) & ~chosen).any(), "only chosen tokens change"


@pytest.mark.parametrize("length", [1, 3, 40])
def test_every_example_has_a_target_however_short(length: int) -> None:
    """BERT masks at least one token of every example; without that, a batch of short examples
    could hold no target and its loss would be NaN."""
    g = torch.Generator().manual_seed(0)
    ids = torch.randint(len(SPECIAL_TOKENS), VOCAB, (64, length + 2), generator=g)
    ids[:, 0], ids[:, -1] = 2, 3  # [CLS] ... [SEP]
    ids[-1, 1:-1] = 0  # a row of padding alone has nothing to choose
    maskable = ids >= len(SPECIAL_TOKENS)
    rule = MaskingRule(mask_prob=1e-6)
    _, targets = mask_tokens(ids, maskable, rule, MASK_ID, torch.arange(len(SPECIAL_TOKENS), VOCAB), g)
    chosen = targets != IGNORE_INDEX
    assert chosen[:-1].sum(-1).tolist() == [1] * 63 and not chosen[-1].any()
    assert not chosen[~maskable].any()


def _objective(
    tmp_path: Path, next_sentence: bool, lines: int = 400, context: int = 32
) -> MaskedLanguageModelling:
    corpus = tmp_path / "lines.txt"
    corpus.write_text("".join(f"{i:04d}\n" for i in range(lines)))
    spec = Spec.model_validate(
        {
            "model": {
                "family": "encoder",
                "d_model": 16,
                "n_layers": 1,
                "n_heads": 2,
                "max_seq_len": context,
            },
            "data": {"path": str(corpus), "tokenizer": "char", "val_fraction": 0.1},
            "task": {"type": "masked_lm", "next_sentence": next_sentence},
        }
    )
    assert spec.data is not None and spec.task.type == "masked_lm"
    return MaskedLanguageModelling(spec, tmp_path)


def test_next_sentence_pairs_are_half_consecutive_lines(tmp_path: Path) -> None:
    objective = _objective(tmp_path, next_sentence=True)
    batch = objective.batch("train", 400, torch.Generator().manual_seed(1))
    ids, types, is_next = batch["input_ids"], batch["token_type_ids"], batch["is_next"]
    assert abs(is_next.float().mean().item() - 0.5) < 0.08
    original = torch.where(batch["targets"] != IGNORE_INDEX, batch["targets"], ids)
    decode = objective.tokenizer.id_to_token
    for row in range(len(ids)):
        tokens = [
            decode(int(t)) for t, m in zip(original[row], batch["attention_mask"][row], strict=True) if m
        ]
        assert tokens[0] == "[CLS]" and tokens[-1] == "[SEP]" and tokens.count("[SEP]") == 2
        first_sep = tokens.index("[SEP]")
        a, b = "".join(tokens[1:first_sep]), "".join(tokens[first_sep + 1 : -1])
        segments = types[row, : len(tokens)].tolist()
        assert segments == [0] * (first_sep + 1) + [1] * (len(tokens) - first_sep - 1)
        a_lines, b_lines = [int(x) for x in a.split()], [int(x) for x in b.split()]
        assert a_lines == list(range(a_lines[0], a_lines[0] + len(a_lines))), "A is consecutive lines"
        if is_next[row]:
            assert b_lines[0] == a_lines[-1] + 1, "B follows A"
        assert len(tokens) <= 32


def test_without_next_sentence_one_segment_and_validation_lines_stay_apart(tmp_path: Path) -> None:
    objective = _objective(tmp_path, next_sentence=False)
    batch = objective.batch("val", 64, torch.Generator().manual_seed(2))
    assert "is_next" not in batch and not batch["token_type_ids"].any()
    original = torch.where(batch["targets"] != IGNORE_INDEX, batch["targets"], batch["input_ids"])
    text = "".join(objective.tokenizer.decode(row.tolist()) for row in original)
    assert all(int(n) >= 360 for n in text.split()), "validation reads only the last 10% of lines"


def test_masked_lm_spec_rules() -> None:
    with pytest.raises(SpecError, match="mask_token_prob \\+ random_token_prob must be at most 1"):
        parse_spec(
            "model: {family: encoder, d_model: 16, n_layers: 1, n_heads: 2, max_seq_len: 8}\n"
            "task: {type: masked_lm, mask_token_prob: 0.9, random_token_prob: 0.2}\n"
        )
    with pytest.raises(SpecError, match="needs a model of family 'encoder'"):
        parse_spec("model: {d_model: 16, n_layers: 1, n_heads: 2, max_seq_len: 8}\ntask: masked_lm\n")


@pytest.mark.slow  # 150 training steps: 16-40 s on a 2-core CPU
def test_masked_lm_learns_on_tiny_shakespeare(tmp_path: Path) -> None:
    from tfcompile.train import Trainer

    spec = Spec.model_validate(
        {
            "model": {"family": "encoder", "d_model": 64, "n_layers": 2, "n_heads": 4, "max_seq_len": 48},
            "data": {"path": str(SHARED_DATA / "tinyshakespeare.txt"), "tokenizer": "char"},
            "task": {"type": "masked_lm", "next_sentence": True},
            "train": {
                "steps": 150,
                "batch_size": 32,
                "optimizer": {"lr": 2e-3},
                "schedule": {"type": "constant", "warmup_steps": 10},
                "eval_interval": 150,
                "eval_batches": 8,
                "runs_dir": str(tmp_path),
            },
        }
    )
    trainer = Trainer(spec, tmp_path / "mlm", show_progress=False)
    result = trainer.train()
    # Far below guessing uniformly over the 70 tokens (and over is-next): the model has at least
    # learned which characters are common. Context beyond that takes longer (see the README).
    uniform = math.log(trainer.spec.model.vocab_size or 0) + math.log(2)
    assert result.metrics["val_loss"] < 0.8 * uniform
    assert result.metrics["val_mlm_accuracy"] > 5 / (trainer.spec.model.vocab_size or 1)

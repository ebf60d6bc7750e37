"""The README's examples: every bash and Python block either runs here or is marked illustrative
(with the reason), and a test fails when a block is neither.

The mark is an HTML comment on the line above the block:

    <!-- tested -->                 run as written
    <!-- tested: small -->          run with small overrides (SMALL_TRAIN, TINY_EXPORT, two processes)
    <!-- tested: small, slow -->    the same, in the slow suite (`pytest -m slow`)
    <!-- illustrative: REASON -->   not run: REASON says why (the network, a server, a second machine)

The blocks run in the README's order in one folder, as a reader would run them: `runs/` and
`exported/` are that folder's, `specs/` and `examples/` are the project's.
"""

from __future__ import annotations

import re
import shlex
import subprocess
import sys
from dataclasses import dataclass
from pathlib import Path

import pytest
from helpers import ROOT

from tfcompile.cli import main

README = ROOT / "README.md"
MARK = re.compile(r"<!-- (tested(?:: small)?(?:, slow|: slow)?|illustrative: .+) -->")
# A training run cut to a few steps, and a spec's export cut to a tiny model.
SMALL_TRAIN = [
    "train.steps=2",
    "train.batch_size=2",
    "train.eval_interval=1",
    "train.eval_batches=1",
    "train.checkpoint_interval=1",
]
SMALL_BY_SPEC = {"multi30k-de-en": ["data.test_path=null"]}  # the test set's beam search
TINY_EXPORT = ["model.n_layers=1", "model.d_model=32", "model.max_seq_len=32"]


@dataclass(frozen=True)
class Block:
    line: int  # of the opening fence
    language: str
    mark: str | None
    body: str

    @property
    def small(self) -> bool:
        return self.mark is not None and "small" in self.mark

    @property
    def slow(self) -> bool:
        return self.mark is not None and "slow" in self.mark

    @property
    def tested(self) -> bool:
        return self.mark is not None and self.mark.startswith("tested")


def blocks(text: str) -> list[Block]:
    """Every bash and Python block of ``text`` with the mark on the line above it, if any."""
    found, lines = [], text.splitlines()
    i = 0
    while i < len(lines):
        if lines[i].startswith("```"):
            end = next(j for j in range(i + 1, len(lines)) if lines[j].startswith("```"))
            language = lines[i][3:].strip()
            mark = MARK.fullmatch(lines[i - 1].strip()) if i else None
            if language in ("bash", "python"):
                found.append(Block(i + 1, language, mark and mark[1], "\n".join(lines[i + 1 : end])))
            i = end
        i += 1
    return found


def test_every_shell_and_python_block_is_tested_or_marked_illustrative() -> None:
    unmarked = [f"README.md:{b.line} ({b.language})" for b in blocks(README.read_text()) if b.mark is None]
    assert not unmarked, f"mark these blocks <!-- tested... --> or <!-- illustrative: why -->: {unmarked}"


def test_the_parser_finds_marks_and_unmarked_blocks() -> None:
    text = "<!-- tested: small, slow -->\n```bash\ntfcompile x\n```\n\n```python\nprint(1)\n```\n"
    first, second = blocks(text)
    assert (first.mark, first.small, first.slow, first.body) == (
        "tested: small, slow",
        True,
        True,
        "tfcompile x",
    )
    assert second.mark is None and second.language == "python"


def commands(block: Block) -> list[list[str]]:
    """The block's commands as argument lists: comments dropped, continued lines joined, and, for
    a small block, the overrides that make it quick."""
    if block.language == "python":
        return [[sys.executable, "-c", block.body]]
    result = []
    for line in block.body.replace("\\\n", " ").splitlines():
        words = shlex.split(line, comments=True)
        if words:
            result.append(_small(words) if block.small else words)
    return [_runnable(words) for words in result]


def _small(words: list[str]) -> list[str]:
    if "--nproc_per_node" in words:  # two processes on the CPU (gloo), whatever the README's GPUs
        words[words.index("--nproc_per_node") + 1] = "2"
    tfcompile = words.index("tfcompile") if "tfcompile" in words else None
    if tfcompile is None:
        return words
    command, target = words[tfcompile + 1], words[tfcompile + 2]
    if command == "train" and target.endswith(".yaml"):
        extra = [*SMALL_TRAIN, *SMALL_BY_SPEC.get(Path(target).stem, [])]
    elif command == "export" and target.endswith(".yaml"):
        extra = TINY_EXPORT
    else:
        extra = []
    return words + [arg for setting in extra for arg in ("--set", setting)]


def _runnable(words: list[str]) -> list[str]:
    """The installed commands as this interpreter's modules."""
    programs = {"tfcompile": ["-m", "tfcompile"], "torchrun": ["-m", "torch.distributed.run"], "python": []}
    return [sys.executable, *programs[words[0]], *words[1:]] if words[0] in programs else words


def run_blocks(folder: Path, chosen: list[Block], monkeypatch: pytest.MonkeyPatch) -> None:
    """Run ``chosen`` in order in ``folder``, as a reader of the README would: `tfcompile` in this
    process (`tfcompile.cli.main`, what the console script calls), anything else as a process."""
    for name in ("specs", "examples"):
        (folder / name).symlink_to(ROOT / name)
    _digit_images(folder)
    monkeypatch.chdir(folder)
    for block in chosen:
        for command in commands(block):
            where = f"README.md:{block.line}: {shlex.join(command)}"
            if command[1:3] == ["-m", "tfcompile"]:
                assert main(command[3:]) == 0, where
                continue
            done = subprocess.run(command, capture_output=True, text=True, check=False)
            assert done.returncode == 0, f"{where}\n{done.stderr[-3000:]}"


def _digit_images(folder: Path) -> None:
    """The three.png and seven.png the ViT example classifies: scikit-learn's digits as PNG files."""
    import numpy as np
    from PIL import Image
    from sklearn.datasets import load_digits

    digits = load_digits()
    for name, digit in (("three.png", 3), ("seven.png", 7)):
        image = digits.images[list(digits.target).index(digit)]
        Image.fromarray((image * 255 / 16).astype(np.uint8)).save(folder / name)


def test_the_quick_blocks_run(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    chosen = [b for b in blocks(README.read_text()) if b.tested and not b.slow]
    assert any("tfcompile summary" in b.body for b in chosen)
    run_blocks(tmp_path, chosen, monkeypatch)


@pytest.mark.slow
def test_every_tested_block_runs(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """The quick start (train, sample, export, generate) first, then every other tested block."""
    run_blocks(tmp_path, [b for b in blocks(README.read_text()) if b.tested], monkeypatch)
    assert (tmp_path / "exported" / "quickstart" / "manifest.json").is_file()

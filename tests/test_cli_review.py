"""The command line as a careless user meets it: words where numbers go, typos, flags that a
command would ignore, --help's defaults."""

from __future__ import annotations

import pytest

from tfcompile.cli import main


@pytest.mark.parametrize(
    ("argv", "expected"),
    [
        (["generate", "b", "--top-k", "abc"], "argument --top-k: expected a positive integer, found abc"),
        (["generate", "b", "--seed", "x"], "argument --seed: expected a seed from 0 to 2^63 - 1, found x"),
        (["generate", "b", "--top-p", "most"], "argument --top-p: expected a number in (0, 1], found most"),
        (
            ["serve", "b", "--port", "http"],
            "--port: expected a TCP port from 0 to 65535, found http",
        ),
        (
            ["serve", "b", "--threads", "all"],
            "--threads: expected threads from 1 to 1,024, found all",
        ),
        (
            ["serve", "b", "--max-wait-ms", "5ms"],
            "--max-wait-ms: expected a finite number >= 0, found 5ms",
        ),
        (
            ["export-triton", "b", "--out", "r", "--instances", "two"],
            "expected a positive integer, found two",
        ),
    ],
)
def test_a_word_where_a_number_goes_says_what_number(
    argv: list[str], expected: str, capsys: pytest.CaptureFixture[str]
) -> None:
    with pytest.raises(SystemExit) as exit_:
        main(argv)
    assert exit_.value.code == 2
    err = capsys.readouterr().err
    assert expected in err and "invalid" not in err and "_int" not in err, err

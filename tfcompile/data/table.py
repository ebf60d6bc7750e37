"""Labelled sentences (or sentence pairs) from a .tsv, .csv or .jsonl file, optionally gzipped."""

from __future__ import annotations

import csv
import io
import json
import math
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Literal

from tfcompile.data.corpus import DataError, read_text, require_file

FORMATS = (".tsv", ".csv", ".jsonl")


@dataclass
class LabelledTexts:
    texts: list[str]
    pairs: list[str] | None  # the second sentence of each pair, or None for single sentences
    labels: list[str]

    def __len__(self) -> int:
        return len(self.texts)


def read_table(path: Path, text_column: str, pair_column: str | None, label_column: str) -> LabelledTexts:
    """Rows of ``path`` -> the named columns as strings. A missing column, an empty cell, a line
    that does not parse or a number written two ways in the label column is a DataError naming
    the file, the row or line and what was expected."""
    require_file(path)
    suffix = path.suffixes[-2] if path.suffix == ".gz" and len(path.suffixes) > 1 else path.suffix
    if suffix not in FORMATS:
        raise DataError(f"{path}: expected one of {', '.join(FORMATS)} (optionally .gz), found {suffix!r}")
    text = read_text(path)
    rows = _json_lines(path, text) if suffix == ".jsonl" else _delimited(path, text, suffix)
    if not rows:
        raise DataError(f"{path} holds no rows")
    wanted = [c for c in (text_column, pair_column, label_column) if c is not None]
    columns = list(rows[0])
    for column in wanted:
        if column not in columns:
            raise DataError(
                f"{path} has no column {column!r}; it has {columns}. Set task.text_column, "
                f"task.pair_column or task.label_column to the right names"
            )
    values: dict[str, list[str]] = {c: [] for c in wanted}
    for i, row in enumerate(rows):
        for column in wanted:
            value = row.get(column)
            if value is None or str(value).strip() == "":
                raise DataError(f"{path}, row {i + 1}: the {column!r} cell is empty")
            if isinstance(value, dict | list):
                raise DataError(
                    f"{path}, row {i + 1}: the {column!r} cell holds a JSON "
                    f"{'object' if isinstance(value, dict) else 'list'}, expected text or a number"
                )
            values[column].append(str(value).strip())
    _check_number_spellings(path, label_column, values[label_column])
    return LabelledTexts(
        values[text_column], values[pair_column] if pair_column else None, values[label_column]
    )


def _json_lines(path: Path, text: str) -> list[dict[str, Any]]:
    """One JSON object a line (blank lines skipped); split on newlines only, since a JSON string
    may hold the other characters that str.splitlines breaks at."""
    rows = []
    for number, line in enumerate(text.split("\n"), 1):
        if not line.strip():
            continue
        try:
            row = json.loads(line)
        except json.JSONDecodeError as e:
            raise DataError(
                f"{path}, line {number}: not JSON ({e.msg} at column {e.colno}): each line of a "
                f'.jsonl file is one object, such as {{"sentence": "a fine film", "label": "positive"}}'
            ) from None
        if not isinstance(row, dict):
            raise DataError(
                f'{path}, line {number}: expected a JSON object of columns ({{"column": value, ...}}), '
                f"found {type(row).__name__} {line.strip()[:40]}"
            )
        rows.append(row)
    return rows


def _delimited(path: Path, text: str, suffix: str) -> list[dict[str, Any]]:
    delimiter = "\t" if suffix == ".tsv" else ","
    quoting: Literal[0, 1, 2, 3] = csv.QUOTE_NONE if suffix == ".tsv" else csv.QUOTE_MINIMAL
    reader = csv.DictReader(io.StringIO(text, newline=""), delimiter=delimiter, quoting=quoting)
    try:
        return list(reader)
    except csv.Error as e:  # a NUL byte, a field past the csv module's size limit
        raise DataError(f"{path}, line {reader.line_num + 1}: cannot read it as {suffix[1:]}: {e}") from None


def _check_number_spellings(path: Path, column: str, labels: list[str]) -> None:
    """Labels that are all numbers (SST-2's 0 and 1) must write each number one way: '1' and '1.0'
    would be two classes, or, with task.labels, neither an index into the names."""
    numbers = {label: _number(label) for label in set(labels)}
    if None in numbers.values():
        return  # names, not numbers
    first: dict[float | None, int] = {}
    for row, label in enumerate(labels):
        seen = first.setdefault(numbers[label], row)
        if labels[seen] != label:
            raise DataError(
                f"{path}, row {row + 1}: the {column!r} cell is {label!r}, but row {seen + 1} writes "
                f"the same number as {labels[seen]!r}: write every label of a class the same way"
            )


def _number(text: str) -> float | None:
    try:
        value = float(text)
    except ValueError:
        return None
    return value if math.isfinite(value) else None

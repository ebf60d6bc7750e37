"""Labelled sentences (or sentence pairs) from a .tsv, .csv or .jsonl file, optionally gzipped."""

from __future__ import annotations

import csv
import gzip
import io
import json
from dataclasses import dataclass
from pathlib import Path
from typing import Literal

from tfcompile.data.corpus import DataError

FORMATS = (".tsv", ".csv", ".jsonl")


@dataclass
class LabelledTexts:
    texts: list[str]
    pairs: list[str] | None  # the second sentence of each pair, or None for single sentences
    labels: list[str]

    def __len__(self) -> int:
        return len(self.texts)


def read_table(path: Path, text_column: str, pair_column: str | None, label_column: str) -> LabelledTexts:
    """Rows of ``path`` -> the named columns as strings. A missing column or an empty cell is a
    DataError naming the file, the row and the columns the file has."""
    if not path.is_file():
        raise DataError(f"no file at {path}")
    suffix = path.suffixes[-2] if path.suffix == ".gz" and len(path.suffixes) > 1 else path.suffix
    if suffix not in FORMATS:
        raise DataError(f"{path}: expected one of {', '.join(FORMATS)} (optionally .gz), found {suffix!r}")
    raw = gzip.decompress(path.read_bytes()) if path.suffix == ".gz" else path.read_bytes()
    text = raw.decode("utf-8")
    if suffix == ".jsonl":
        rows = [json.loads(line) for line in text.splitlines() if line.strip()]
    else:
        delimiter = "\t" if suffix == ".tsv" else ","
        quoting: Literal[0, 1, 2, 3] = csv.QUOTE_NONE if suffix == ".tsv" else csv.QUOTE_MINIMAL
        rows = list(csv.DictReader(io.StringIO(text), delimiter=delimiter, quoting=quoting))
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
            values[column].append(str(value).strip())
    return LabelledTexts(
        values[text_column], values[pair_column] if pair_column else None, values[label_column]
    )

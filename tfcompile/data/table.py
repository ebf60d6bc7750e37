"""Labelled sentences (or sentence pairs) from a .tsv, .csv or .jsonl file, optionally gzipped."""

from __future__ import annotations

import csv
import io
import json
import math
import sys
import threading
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
    suffixes = [s.lower() for s in path.suffixes]
    suffix = suffixes[-2] if suffixes[-1:] == [".gz"] and len(suffixes) > 1 else path.suffix.lower()
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
            if isinstance(value, float) and not math.isfinite(value):  # 'nan' was a class of its own
                found = "NaN (how pandas writes a missing value)" if math.isnan(value) else "infinite"
                raise DataError(
                    f"{path}, row {i + 1}: the {column!r} cell is {found}, expected text or a finite "
                    f"number: fill it in or remove the row"
                )
            values[column].append(str(value).strip())
    _check_number_spellings(path, label_column, values[label_column])
    return LabelledTexts(
        values[text_column], values[pair_column] if pair_column else None, values[label_column]
    )


class _Repeated(Exception):
    def __init__(self, key: str) -> None:
        self.key = key


def _refuse_repeats(pairs: list[tuple[str, Any]]) -> dict[str, Any]:
    """A JSON object, unless it names a key twice (json.loads would keep the last, silently)."""
    keys = [k for k, _ in pairs]
    if len(set(keys)) != len(keys):
        raise _Repeated(next(k for k in keys if keys.count(k) > 1))
    return dict(pairs)


def _json_lines(path: Path, text: str) -> list[dict[str, Any]]:
    """One JSON object a line (blank lines skipped); split on newlines only, since a JSON string
    may hold the other characters that str.splitlines breaks at."""
    rows = []
    for number, line in enumerate(text.split("\n"), 1):
        if not line.strip():
            continue
        try:
            row = json.loads(line, object_pairs_hook=_refuse_repeats)
        except _Repeated as e:
            raise DataError(
                f"{path}, line {number}: the key {e.key!r} is given twice in one object (JSON keeps the "
                f"last): give each column once"
            ) from None
        except (ValueError, RecursionError) as e:  # a JSONDecodeError, or what Python cannot hold
            found = (
                f"{e.msg} at column {e.colno}"
                if isinstance(e, json.JSONDecodeError)
                else "nested too deeply"
                if isinstance(e, RecursionError)
                else f"a number of more than {sys.get_int_max_str_digits():,} digits"
            )
            raise DataError(
                f"{path}, line {number}: not JSON ({found}): each line of a .jsonl file is one "
                f'object, such as {{"sentence": "a fine film", "label": "positive"}}'
            ) from None
        if not isinstance(row, dict):
            raise DataError(
                f'{path}, line {number}: expected a JSON object of columns ({{"column": value, ...}}), '
                f"found {type(row).__name__} {line.strip()[:40]}"
            )
        rows.append(row)
    return rows


def _delimited(path: Path, text: str, suffix: str) -> list[dict[str, Any]]:
    """The rows of a .tsv (never quoted, as GLUE writes it) or .csv file under its header's names;
    a row of more or fewer fields than the header, or a header that names a column twice, is a
    DataError: the values would land in the wrong columns."""
    delimiter = "\t" if suffix == ".tsv" else ","
    quoting: Literal[0, 1, 2, 3] = csv.QUOTE_NONE if suffix == ".tsv" else csv.QUOTE_MINIMAL
    reader = csv.reader(io.StringIO(text, newline=""), delimiter=delimiter, quoting=quoting)
    # The csv module refuses a cell of more than 131,072 characters (a long review or article); the
    # file is in memory already, so a cell as long as the file is allowed while it is read. The
    # limit is the process's: one table at a time raises it and puts it back.
    with _FIELD_LIMIT:
        limit = csv.field_size_limit(min(max(len(text), csv.field_size_limit()), MAX_FIELD))
        try:
            return _rows(path, reader, suffix)
        finally:
            csv.field_size_limit(limit)


_FIELD_LIMIT = threading.Lock()
MAX_FIELD = (1 << 31) - 1  # the csv module's limit is a C long (32 bits on Windows)


def _rows(path: Path, reader: Any, suffix: str) -> list[dict[str, Any]]:
    """The rows of ``reader`` under its header's names (see _delimited)."""
    try:
        header: list[str] = next((fields for fields in reader if fields), [])  # after any blank lines
        twice = next((name for i, name in enumerate(header) if name in header[:i]), None)
        if twice is not None:
            raise DataError(f"{path}: the header names the column {twice!r} twice: rename one")
        rows = []
        for fields in reader:
            if not fields:
                continue  # a blank line
            if len(fields) != len(header):
                raise DataError(
                    f"{path}, line {reader.line_num}: {len(fields)} fields, but the header names "
                    f"{len(header)}: {_split_hint(suffix) if len(fields) > len(header) else MISSING}"
                )
            rows.append(dict(zip(header, fields, strict=True)))
    except csv.Error as e:
        raise DataError(f"{path}, line {reader.line_num}: cannot read it as {suffix[1:]}: {e}") from None
    return rows


MISSING = "a value is missing, or a line break inside one splits the row"


def _split_hint(suffix: str) -> str:
    """Why a row has more fields than its header, and the fix."""
    if suffix == ".tsv":
        return "a tab inside a value splits it (a .tsv file is not quoted): remove the tab"
    return 'a comma inside a value splits it: quote the value ("a, b")'


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

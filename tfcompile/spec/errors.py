"""Spec errors that a person can act on: where (file:line:column and the dotted field), what was
expected, what was found, and how to fix it."""

from __future__ import annotations

from dataclasses import dataclass


@dataclass(frozen=True)
class SpecIssue:
    path: str  # dotted field path, e.g. "model.norm.type"; "" for the whole file
    message: str  # what was expected and what was found
    hint: str | None = None  # how to fix it
    line: int | None = None  # 1-based
    column: int | None = None  # 1-based
    width: int = 1  # characters to underline
    note: str | None = None  # where a value came from when the file does not hold it
    origin: str | None = None  # the command-line argument that gave the value ("--set FIELD=VALUE")


class SpecError(Exception):
    """One or more problems with a spec; ``str()`` renders them like a compiler's diagnostics."""

    def __init__(self, source: str, issues: list[SpecIssue], text: str | None = None) -> None:
        self.source = source
        self.issues = sorted(issues, key=lambda i: (i.line or 0, i.column or 0, i.path))
        self.lines = text.splitlines() if text is not None else []
        super().__init__(self.render())

    def render(self) -> str:
        blocks = [self._render_issue(issue) for issue in self.issues]
        n = len(self.issues)
        blocks.append(f"{n} error{'s' if n != 1 else ''} in {self.source}")
        return "\n".join(blocks)

    def _render_issue(self, issue: SpecIssue) -> str:
        where = issue.origin or self.source  # a --set argument has no line in the file
        if issue.line is not None:
            where += f":{issue.line}:{issue.column or 1}"
        field = f"{issue.path}: " if issue.path else ""
        out = [f"{where}: error: {field}{issue.message}"]
        if issue.line is not None and 0 < issue.line <= len(self.lines):
            gutter = len(str(issue.line))
            text, column, width = _window(self.lines[issue.line - 1], issue.column or 1, max(issue.width, 1))
            out.append(f"  {issue.line} | {text}")
            out.append(f"  {' ' * gutter} | {' ' * (column - 1)}{'^' * width}")
        if issue.note:
            out.append(f"  = note: {issue.note}")
        if issue.hint:
            out.append(f"  = hint: {issue.hint}")
        return "\n".join(out)


MAX_LINE = 120  # characters of a source line shown under an error


def _window(line: str, column: int, width: int) -> tuple[str, int, int]:
    """At most MAX_LINE characters of ``line`` around ``column`` ('…' where it is cut), and the
    column and underline width within them, so that a long line (a 5,000-digit number) takes as
    little room as a short one."""
    if len(line) <= MAX_LINE:
        return line, column, width
    start = max(0, min(column - 1 - MAX_LINE // 4, len(line) - MAX_LINE))
    lead = "…" if start else ""
    text = lead + line[start : start + MAX_LINE] + ("…" if start + MAX_LINE < len(line) else "")
    column += len(lead) - start
    return text, column, max(1, min(width, len(lead) + MAX_LINE - (column - 1)))

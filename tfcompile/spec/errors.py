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
            out.append(f"  {issue.line} | {self.lines[issue.line - 1]}")
            caret = " " * ((issue.column or 1) - 1) + "^" * max(issue.width, 1)
            out.append(f"  {' ' * gutter} | {caret}")
        if issue.note:
            out.append(f"  = note: {issue.note}")
        if issue.hint:
            out.append(f"  = hint: {issue.hint}")
        return "\n".join(out)

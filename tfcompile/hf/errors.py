"""What goes wrong converting a checkpoint, said so that the user can act: the file, the field or
tensor, what was found, and what to do."""

from __future__ import annotations

from dataclasses import dataclass

from tfcompile.errors import UserError


class HFError(UserError, ValueError):
    """A Hugging Face folder that cannot be imported, or a run that cannot be written as one."""


class HFWarning(UserWarning):
    """Something an import or export leaves behind that does not change the model's outputs
    (a training-only setting, a tensor the architecture never reads)."""


@dataclass(frozen=True)
class Problem:
    field: str  # a config.json field (dotted into nested ones), a tensor, or a spec field
    message: str  # what was found and why it cannot be converted
    hint: str  # what to do


def refuse(where: str, problems: list[Problem]) -> HFError:
    """One error that lists every problem found in ``where`` (a file or a run), each on its line."""
    lines = [f"  {p.field}: {p.message}; {p.hint}" for p in problems]
    n = len(problems)
    return HFError(f"{where}: {n} problem{'s' if n != 1 else ''}:\n" + "\n".join(lines))

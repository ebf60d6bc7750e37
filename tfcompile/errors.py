"""The base of every error a user can fix from its message (no torch import: the runtime uses it)."""


class UserError(Exception):
    """A problem with the user's spec, data, run or bundle; the CLI prints it without a traceback."""


class InputError(UserError, ValueError):
    """An input that does not fit the model: wrong dtype, rank, vocabulary range, length or image."""


class BundleError(UserError):
    """A bundle that cannot be trusted or read: missing files, changed files, a newer format."""


class ExportError(UserError, RuntimeError):
    """An export that cannot be done or whose parity check fails."""


class DataWarning(UserWarning):
    """Data that trains, but perhaps not as its writer meant; the message says what and where."""


def first_line(error: BaseException, limit: int | None = None) -> str:
    """An exception's message's first line, cut at ``limit`` characters (its type's name when it
    has no message): what a one-line error quotes of a library's failure."""
    lines = str(error).strip().splitlines()
    return lines[0][:limit] if lines else type(error).__name__

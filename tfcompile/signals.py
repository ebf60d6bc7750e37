"""Signal handlers set for the length of a block: the CLI's SIGTERM (tfcompile.cli) and training's
Ctrl-C and SIGTERM (tfcompile.train.loop)."""

from __future__ import annotations

import contextlib
import signal
from collections.abc import Callable, Iterable, Iterator


@contextlib.contextmanager
def handling(signals: Iterable[int], handler: Callable[[int, object], None]) -> Iterator[None]:
    """``handler`` for each of ``signals`` while the block runs, the handlers before it after.
    Only the main thread can handle signals: elsewhere they are left alone."""
    try:
        previous = {signum: signal.signal(signum, handler) for signum in signals}
    except ValueError:  # not the main thread
        yield
        return
    try:
        yield
    finally:
        for signum, action in previous.items():
            signal.signal(signum, action)

"""Clean process exit on SIGINT/SIGTERM for servers run with uvicorn."""

from __future__ import annotations

import contextlib
import signal
import threading
from collections.abc import Iterator


@contextlib.contextmanager
def clean_stop_signals() -> Iterator[None]:
    """Make SIGINT/SIGTERM a clean stop (exit 0) rather than death by signal.

    uvicorn shuts down gracefully, then re-raises the signal under the handlers it found on
    entry; with these no-op handlers in place the re-raise is harmless and we return.
    """
    if threading.current_thread() is not threading.main_thread():
        yield
        return
    sigs = (signal.SIGINT, signal.SIGTERM)
    previous = {sig: signal.signal(sig, lambda *_: None) for sig in sigs}
    try:
        yield
    finally:
        for sig, handler in previous.items():
            signal.signal(sig, handler)

"""Memory given back to the system after a large, short-lived piece of work (an answer of megabytes read and
dropped). glibc's malloc keeps what is freed in its arenas for reuse, so the process would stay at its peak
for good; ``malloc_trim(0)`` hands their free pages back. Where the C library has no ``malloc_trim`` (musl),
nothing is done. ctypes is loaded only the first time, so an agent that never reads a large answer pays
nothing for it::

    size = len(answer)
    holders = holders_of(answer)
    del answer
    if size >= LARGE:
        give_back()        # blocks for milliseconds on a large heap: call it from a worker thread
"""

from __future__ import annotations

from collections.abc import Callable

# What counts as large: an answer this big leaves megabytes freed behind it.
LARGE = 1024 * 1024

_trim: Callable[[int], int] | None = None
_loaded = False


def give_back() -> bool:
    """Hand the pages malloc holds free back to the system; False where the C library cannot."""
    global _trim, _loaded
    if not _loaded:
        _loaded = True
        import ctypes

        try:
            _trim = ctypes.CDLL(None).malloc_trim
        except (AttributeError, OSError):
            _trim = None
    if _trim is None:
        return False
    _trim(0)
    return True

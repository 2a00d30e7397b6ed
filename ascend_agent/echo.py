"""What a message shows of a value it did not make (a device ID a client sent, a chip a pod's annotation
names, a claim's device): at most a bounded length of it. An error that echoed a 200 KB device ID whole took
seconds to send, and no reader needs more than its start and its length::

    raise LookupError(f"Volcano chose {cut(name)}, which this node does not have")

Imports nothing: every floor may use it.
"""

from __future__ import annotations

# What a message shows of one value.
MOST = 64
# What an error line may be in all, whatever it echoes (the gRPC status message of every served socket).
MOST_LINE = 1024


def cut(value: str, most: int = MOST) -> str:
    """``value`` as a message shows it: whole up to ``most`` characters, else its start and its length.

    >>> cut("Ascend910-3"), cut("Ascend910-" + "9" * 200_000, 12)
    ('Ascend910-3', 'Ascend910-99... (200010 characters)')
    """
    if len(value) <= most:
        return value
    return f"{value[:most]}... ({len(value)} characters)"

"""What one hot reset is, between the reset manager and the backend that runs it: the in-band reset's npu-smi
arguments (named in the manager's log lines and Events, run by ``backends/npusmi_reset.py``) and its
outcome::

    " ".join(reset_args(3, 1))                   # 'set -t reset -i 3 -c 1 -m 1'
    ResetOutcome(ok=False, reason="hung", detail="npu-smi set -t reset ... timed out after 400 s")
"""

from __future__ import annotations

from dataclasses import dataclass


@dataclass(frozen=True, slots=True)
class ResetOutcome:
    """What one ``npu-smi set -t reset`` did: ``ok`` when npu-smi says the chip was reset; ``reason`` is
    ``ok``, ``failed`` (npu-smi refused or failed) or ``hung`` (killed at the timeout); ``detail`` is its
    words in one line."""

    ok: bool
    reason: str
    detail: str


def reset_args(npu_id: int, chip: int) -> list[str]:
    """The in-band chip reset's arguments.

    >>> " ".join(reset_args(3, 1))
    'set -t reset -i 3 -c 1 -m 1'
    """
    return ["set", "-t", "reset", "-i", str(npu_id), "-c", str(chip), "-m", "1"]

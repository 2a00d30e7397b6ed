"""npu-smi's in-band chip reset, ``npu-smi set -t reset -i <card> -c <chip> -m 1``, with its confirmation
prompts answered (which chips run processes is :mod:`.npusmi_processes`)::

    outcome = await reset_chip("npu-smi", npu_id=0, chip=0, timeout=300)
    outcome.ok, outcome.detail                  # (True, 'Reset chip successfully.')

The reset asks ``Are you sure you want to continue resetting?(Y/N)`` and, on 310P Duo and A3, whether to
reboot all devices ``[y/n]``; each prompt reads one token, so ``Y`` and ``y`` on their own lines answer both.
"""

from __future__ import annotations

import re

from ascend_agent.backends.npusmi import NpuSmiError
from ascend_agent.backends.tool import diagnose, run_tool
from ascend_agent.health.hotreset.command import ResetOutcome, reset_args

# One token per prompt: the first asks Y/N, the second (310P Duo, A3, SMP 910A) y/n.
RESET_ANSWERS = b"Y\ny\n"


_STATUS = re.compile(r"^\s*Status\s*:\s*(\S+)", re.MULTILINE)
_MESSAGE = re.compile(r"^\s*Message\s*:\s*(.+?)\s*$", re.MULTILINE)


def reset_result(returncode: int, output: str) -> ResetOutcome:
    """The outcome npu-smi's exit status and words show: ``Status : OK`` with exit status 0 is success;
    anything else is a failure named by its last ``Message`` (or its last line).

    >>> reset_result(0, "\\tStatus : OK\\n\\tMessage : Reset chip successfully.\\n")
    ResetOutcome(ok=True, reason='ok', detail='Reset chip successfully.')
    >>> reset_result(0, "This device does not support setting reset.\\n").detail
    'This device does not support setting reset.'
    """
    statuses = _STATUS.findall(output)
    messages = [m for m in _MESSAGE.findall(output) if not m.lower().startswith("resetting")]
    lines = [line.strip() for line in output.splitlines() if line.strip()]
    if returncode == 0 and statuses and statuses[-1].upper() == "OK":
        return ResetOutcome(True, "ok", messages[-1] if messages else "Status : OK")
    detail = messages[-1] if messages else (lines[-1] if lines else f"exit status {returncode}, no output")
    known = diagnose(output)
    if known is not None:
        detail = str(known)
    elif returncode != 0:
        detail = f"{detail} (exit status {returncode})"
    return ResetOutcome(False, "failed", detail)


async def reset_chip(executable: str, npu_id: int, chip: int, timeout: float) -> ResetOutcome:
    """Run the in-band reset of chip ``chip`` of card ``npu_id``, answering its prompts; a run past
    ``timeout`` is killed (``hung``). Never raises for what npu-smi does."""
    args = reset_args(npu_id, chip)
    try:
        returncode, stdout, stderr = await run_tool(executable, args, timeout, answers=RESET_ANSWERS)
    except NpuSmiError as exc:
        return ResetOutcome(False, "hung" if exc.reason == "timeout" else "failed", str(exc))
    return reset_result(returncode, (stdout + stderr).decode("utf-8", errors="replace"))

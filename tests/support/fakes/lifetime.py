"""How long a fake tool lives when it hangs: it never answers, as a hung driver tool does, but it does not
outlive the process that ran it (the agent, killed by a test, leaves no fake npu-smi behind) and ends after
:data:`HANG_LIMIT` s in any case. Copied beside each fake; a fake imports it first thing, so that the
parent it notes is the one that started it."""

import ctypes
import os
import signal
import sys
import time

# Longer than any test waits for an answer from a hung tool.
HANG_LIMIT = 300
_PR_SET_PDEATHSIG = 1
PARENT = os.getppid()


def hang() -> None:
    """Never answer: exit when the parent dies (SIGKILL from the kernel), or fail after HANG_LIMIT s."""
    ctypes.CDLL(None, use_errno=True).prctl(_PR_SET_PDEATHSIG, signal.SIGKILL)
    if os.getppid() != PARENT:  # it died before the kernel was told
        os._exit(1)
    time.sleep(HANG_LIMIT)
    sys.stderr.write(f"hung for {HANG_LIMIT} s\n")
    sys.exit(1)

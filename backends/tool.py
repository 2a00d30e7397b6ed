"""Running npu-smi (and, through :func:`run_tool`, any driver tool such as hccn_tool): every run bounded by a
timeout and its output capped at :data:`MAX_OUTPUT`, a tool that hangs killed with its process group, and a
failure named in one line, the DCMI error code diagnosed where the tool printed one::

    out = await run_npu_smi(["info", "-t", "board", "-i", "0", "-c", "0"], timeout=10.0)
    table = await query_info("npu-smi", timeout=10)        # `npu-smi info`, parsed
"""

from __future__ import annotations

import asyncio
import contextlib
import errno
import os
import re
import signal
from collections.abc import Mapping, Sequence

import anyio

from ascend_agent.backends.npusmi import InfoTable, NpuSmiError, NpuSmiParseError, parse_info

# What npu-smi prints when it cannot work, and what to do about it ------------------------------------------
# Builds word a dcmi failure differently ("dcmi module initialize failed. ret is -8005", "dcmi model
# initialized failed, because the device is used. ret is -8020"): the code after `ret` is what counts.
_DCMI_CODE = re.compile(r"\bret\s*(?:is|=|:)?\s*(-\d{1,6})\b", re.IGNORECASE)


_NO_ROOT = "run the agent as root in a privileged container"


_ASK_ON_HOST = "check the driver and firmware with npu-smi info on the host"


_WAIT = "wait: the agent asks again every health interval; if it lasts, run npu-smi info on the host"


# The dcmi library's return codes (dcmi_interface_api.h): reason, what it means, the next step.
DCMI_CODES: dict[int, tuple[str, str, str]] = {
    -8001: ("driver", "invalid parameter", _ASK_ON_HOST),
    -8002: ("permission", "operation not permitted", _NO_ROOT),
    -8003: ("resources", "memory operation failed", "the node is short of memory; it tries again"),
    -8004: ("driver", "secure function failed", _ASK_ON_HOST),
    -8005: (
        "driver",
        "the driver is not visible here",
        "mount the host's driver and its libraries (/usr/local/Ascend/driver with lib64, /usr/local/dcmi) "
        "and /dev into the agent's container, and run it privileged",
    ),
    -8006: ("busy", "the driver timed out", _WAIT),
    -8007: ("driver", "invalid device id", _ASK_ON_HOST),
    -8008: ("driver", "the device does not exist", "check dmesg and /dev/davinci*; reload the driver"),
    -8009: ("driver", "an ioctl to the driver failed", _ASK_ON_HOST),
    -8010: ("driver", "sending a message to the chip failed", _ASK_ON_HOST),
    -8011: ("driver", "receiving a message from the chip failed", _ASK_ON_HOST),
    -8012: ("busy", "the chips are not ready yet", _WAIT),
    -8013: ("permission", "not supported inside a container", _NO_ROOT),
    -8014: ("driver", "a file operation failed", _ASK_ON_HOST),
    -8015: ("driver", "resetting the chip failed", _ASK_ON_HOST),
    -8016: ("driver", "the operation was aborted", _WAIT),
    -8017: ("busy", "the firmware is being upgraded", "wait for the upgrade to finish"),
    -8020: ("busy", "another process holds the device (the chips are busy)", _WAIT),
    -8023: ("driver", "configuration information does not exist", _ASK_ON_HOST),
    -8255: (
        "driver",
        "not supported by this chip or driver",
        "this chip or driver version does not offer the operation (vNPU needs a chip that supports it)",
    ),
}


_DENIED = (
    "permission",
    "npu-smi was denied access to the chips (permission denied)",
    _NO_ROOT,
)


def dcmi_code(output: str) -> int | None:
    """The dcmi return code in ``output``, wherever and however it is worded; None when there is none.

    >>> dcmi_code("DrvMngGetConsoleLogLevel failed.\\ndcmi model initialized failed, ... ret is -8020")
    -8020
    """
    match = _DCMI_CODE.search(output) if "dcmi" in output.lower() else None
    return int(match.group(1)) if match is not None else None


def diagnose(output: str) -> NpuSmiError | None:
    """The known failure ``output`` shows (permission denied, a dcmi return code), as the error to raise;
    None when it shows none. Every code in :data:`DCMI_CODES` is named; an unknown one by its number.

    >>> print(diagnose("dcmi module initialize failed. ret is -8020\\n"))  # doctest: +ELLIPSIS
    npu-smi cannot reach the chips (dcmi module initialize failed, ret -8020): another process holds ...
    """
    if "permission denied" in output.lower():
        return NpuSmiError(*_DENIED)
    code = dcmi_code(output)
    if code is None:
        return None
    known = DCMI_CODES.get(code)
    if known is None:
        return NpuSmiError(
            "driver",
            f"npu-smi cannot reach the chips (dcmi module initialize failed, ret {code}: a code not known "
            "here)",
            _ASK_ON_HOST,
        )
    reason, meaning, next_step = known
    return NpuSmiError(
        reason,
        f"npu-smi cannot reach the chips (dcmi module initialize failed, ret {code}): {meaning}",
        next_step,
    )


# The largest real npu-smi output is tens of KiB; more than this is a runaway, read no further.
MAX_OUTPUT = 4 * 1024 * 1024


# After a kill, how long to wait for the process to be reaped and its pipes to close.
_REAP_TIMEOUT = 2.0


_CHUNK = 64 * 1024


class _OutputTooLong(Exception):
    pass


async def run_npu_smi(executable: str, args: Sequence[str], timeout: float) -> str:
    """Run ``executable args`` with :func:`run_tool` and return its output; a non-zero exit status is an
    :class:`NpuSmiError` that names the cause. Raises only :class:`NpuSmiError`."""
    command = " ".join([executable, *args])
    returncode, stdout, stderr = await run_tool(executable, args, timeout)
    if returncode != 0:
        said = (stderr + stdout).decode("utf-8", errors="replace")
        known = diagnose(said)
        if known is not None:
            raise known
        lines = said.strip().splitlines()
        raise NpuSmiError(
            "exit",
            f"{command} exited with status {returncode}: {lines[-1] if lines else 'no output'}",
        )
    return stdout.decode("utf-8", errors="replace")


async def run_tool(
    executable: str,
    args: Sequence[str],
    timeout: float,
    answers: bytes | None = None,
    env: Mapping[str, str] | None = None,
) -> tuple[int, bytes, bytes]:
    """Run one of the driver's tools (npu-smi, hccn_tool), ``executable args`` (no shell), in a process
    group of its own: its exit status, stdout and stderr. ``answers`` is written to its stdin, which is then
    closed (its confirmation prompts); without them stdin is empty. ``env``: its whole environment (the
    agent's by default). After ``timeout`` s, or once it has
    printed more than :data:`MAX_OUTPUT` bytes, the whole group is killed (a wrapper's children too, which
    would otherwise keep the pipes open) and reaped, every wait bounded. Raises only :class:`NpuSmiError`."""
    command = " ".join([executable, *args])
    try:
        process = await asyncio.create_subprocess_exec(
            executable,
            *args,
            stdin=asyncio.subprocess.DEVNULL if answers is None else asyncio.subprocess.PIPE,
            stdout=asyncio.subprocess.PIPE,
            stderr=asyncio.subprocess.PIPE,
            start_new_session=True,
            env=env,
        )
    except PermissionError as exc:
        raise NpuSmiError(
            "permission",
            f"cannot run {executable}: {exc.strerror or exc}",
            "make it executable, or run the agent as root",
        ) from None
    except (FileNotFoundError, NotADirectoryError) as exc:
        raise NpuSmiError("missing", f"cannot run {executable}: {exc.strerror or exc}") from None
    except OSError as exc:
        if exc.errno == errno.ETXTBSY:
            raise NpuSmiError(
                "missing",
                f"cannot run {executable}: it is being written (Text file busy)",
                "a driver install or upgrade is replacing it; the agent tries again next health interval",
            ) from None
        # EMFILE, ENFILE, ENOMEM, EAGAIN: this process or the node is short of descriptors or memory now.
        raise NpuSmiError(
            "resources",
            f"cannot start {executable}: {exc.strerror or exc}",
            "the agent is out of file descriptors or memory; it tries again next health interval",
        ) from None
    try:
        async with asyncio.timeout(timeout):
            if answers is not None:
                await _answer(process, answers)
            stdout, stderr = await _read_output(process)
            await process.wait()
    except TimeoutError:
        await _kill(process)
        raise NpuSmiError("timeout", f"{command} timed out after {timeout:g} s and was killed") from None
    except _OutputTooLong:
        await _kill(process)
        raise NpuSmiError(
            "output",
            f"{command} printed more than {MAX_OUTPUT // (1024 * 1024)} MiB and was killed",
            f"check the {os.path.basename(executable)} executable the agent runs",
        ) from None
    except asyncio.CancelledError:
        with anyio.CancelScope(shield=True):
            await _kill(process)
        raise
    assert process.returncode is not None
    return process.returncode, stdout, stderr


async def _answer(process: asyncio.subprocess.Process, answers: bytes) -> None:
    """Write ``answers`` to the tool's stdin and close it; a tool that exits without reading them is fine."""
    assert process.stdin is not None
    with contextlib.suppress(BrokenPipeError, ConnectionResetError):
        process.stdin.write(answers)
        await process.stdin.drain()
    process.stdin.close()


async def _read_output(process: asyncio.subprocess.Process) -> tuple[bytes, bytes]:
    """(stdout, stderr), each read to its end; when one fails, the other reader is stopped too."""
    assert process.stdout is not None and process.stderr is not None
    readers = [asyncio.ensure_future(_read_capped(pipe)) for pipe in (process.stdout, process.stderr)]
    try:
        stdout, stderr = await asyncio.gather(*readers)
    finally:
        for reader in readers:
            reader.cancel()
        await asyncio.wait(readers)
        for reader in readers:  # both may have failed; one failure is enough to report
            if not reader.cancelled():
                reader.exception()
    return stdout, stderr


async def _read_capped(stream: asyncio.StreamReader) -> bytes:
    data = bytearray()
    while chunk := await stream.read(_CHUNK):
        data += chunk
        if len(data) > MAX_OUTPUT:
            raise _OutputTooLong
    return bytes(data)


async def _drain(stream: asyncio.StreamReader) -> None:
    while await stream.read(_CHUNK):
        pass


async def _kill(process: asyncio.subprocess.Process) -> None:
    """Kill npu-smi's process group and reap it, waiting at most :data:`_REAP_TIMEOUT`: a child that left
    the group and holds the pipes must not hold the agent too."""
    with contextlib.suppress(ProcessLookupError, PermissionError):
        os.killpg(process.pid, signal.SIGKILL)
    with contextlib.suppress(ProcessLookupError):
        process.kill()
    try:
        async with asyncio.timeout(_REAP_TIMEOUT):
            # What it printed last is read and dropped: a full pipe buffer would hide the end of its output.
            assert process.stdout is not None and process.stderr is not None
            await asyncio.gather(process.wait(), _drain(process.stdout), _drain(process.stderr))
    except TimeoutError:
        # Our ends of its pipes go: the event loop stops waiting for them, and the child watcher reaps it.
        for pipe in (process.stdout, process.stderr):
            transport = getattr(pipe, "_transport", None)
            if transport is not None:
                transport.close()


async def query_info(executable: str, timeout: float) -> InfoTable:
    """``npu-smi info``, run and parsed; unparsable output or no chips is NpuSmiError("output")."""
    text = await run_npu_smi(executable, ["info"], timeout)
    try:
        return parse_info(text)
    except NpuSmiParseError as exc:
        known = diagnose(text)
        if known is not None:
            raise known from None
        raise NpuSmiError("output", f"{executable} info printed something unexpected: {exc}") from None

"""The agent's own process. ``ascend-agent run`` reads its flags and environment, then replaces itself
(``execv``, same PID) with ``python -P -X no_debug_ranges [-OO] -m ascend_agent.runner FD``, which reads them
back from the file FD, reads the config file, checks the settings (a bad one is one line, exit status 2) and
runs the agent. The command line's libraries (typer, click) and the other commands' modules never load into
the process that lives as long as the node::

    exec_agent(source)        # in the command line, its flags parsed; never returns

``-OO`` (no docstrings or asserts in memory) is used where the installation has that level's bytecode
(the image compiles it, and so does ``make install``); compiled from source at every start it would cost
more than it saves. SIGTERM and SIGINT are blocked across the exec, so one sent in between waits for the
runner's own early handler instead of killing the agent.
"""

from __future__ import annotations

import importlib.util
import json
import os
import signal
import sys
from pathlib import Path
from typing import Any, NoReturn

from ascend_agent.config import ConfigError, SettingsSource
from ascend_agent.stopping import catch_early, stop_requested

EXIT_USAGE = 2
_STOP_SIGNALS = {signal.SIGTERM, signal.SIGINT}
_SELF = "/proc/self/exe"
# A module every agent loads, installed beside the package: whether its -OO bytecode is there says whether
# the installation was compiled for -OO.
_BYTECODE_PROBE = "grpclib"


def encode(source: SettingsSource) -> bytes:
    """``source`` as the runner reads it back; paths as text, which the settings' converters take."""
    overrides = {
        name: str(value) if isinstance(value, Path) else value for name, value in source.overrides.items()
    }
    document = {
        "overrides": overrides,
        "config_file": None if source.config_file is None else str(source.config_file),
        "from_environment": sorted(source.from_environment),
    }
    return json.dumps(document).encode()


def decode(data: bytes) -> SettingsSource:
    """The inverse of :func:`encode`."""
    document: dict[str, Any] = json.loads(data)
    config_file = document["config_file"]
    return SettingsSource(
        overrides=document["overrides"],
        config_file=None if config_file is None else Path(config_file),
        from_environment=frozenset(document["from_environment"]),
    )


def interpreter_flags() -> list[str]:
    """``-P``: the working directory stays off ``sys.path``; ``-X no_debug_ranges``: code objects keep line
    numbers but not the column ranges that mark a traceback's expression (0.19 to 0.27 MiB fewer after the
    agent's imports, measured); ``-OO`` where its bytecode is installed."""
    flags = ["-P", "-X", "no_debug_ranges"]
    spec = importlib.util.find_spec(_BYTECODE_PROBE)
    origin = spec.origin if spec is not None else None
    if origin and os.path.exists(importlib.util.cache_from_source(origin, optimization=2)):
        flags.append("-OO")
    return flags


def exec_agent(source: SettingsSource) -> NoReturn:
    """Replace this process with the runner, handing it ``source`` in an anonymous file. A stop signal that
    came while the command line started ends the process here, with status 0."""
    signal.pthread_sigmask(signal.SIG_BLOCK, _STOP_SIGNALS)
    if stop_requested():
        sys.exit(0)
    # An anonymous file, not a pipe: nobody reads a pipe before the exec, so values past its 64 KiB buffer
    # would block the write for good (with the stop signals blocked too).
    handed = os.memfd_create("ascend-agent-settings", 0)
    with os.fdopen(handed, "wb", closefd=False) as file:
        file.write(encode(source))
    os.lseek(handed, 0, os.SEEK_SET)
    os.set_inheritable(handed, True)
    sys.stdout.flush()
    sys.stderr.flush()
    # /proc/self/exe: the running interpreter even where a directory on its path is closed to this user (the
    # kernel resolves that link, not the path); argv[0] keeps the virtual environment it was started in.
    try:
        os.execv(_SELF, [sys.executable, *interpreter_flags(), "-m", "ascend_agent.runner", str(handed)])
    except OSError as exc:
        print(
            f"ascend-agent: cannot start the agent's runner ({_SELF}: {exc.strerror}); is /proc mounted?",
            file=sys.stderr,
        )
        sys.exit(1)


def _read(descriptor: int) -> bytes:
    chunks = []
    while chunk := os.read(descriptor, 65536):
        chunks.append(chunk)
    os.close(descriptor)
    return b"".join(chunks)


def main(argv: list[str]) -> int:
    """The runner: the agent until SIGTERM or SIGINT; the exit status."""
    catch_early()
    signal.pthread_sigmask(signal.SIG_UNBLOCK, _STOP_SIGNALS)
    if len(argv) != 1 or not argv[0].isdigit():
        print("ascend-agent: the runner is started by `ascend-agent run`, not by hand", file=sys.stderr)
        return EXIT_USAGE
    source = decode(_read(int(argv[0])))
    import asyncio

    from ascend_agent.process import run_agent

    try:
        return asyncio.run(run_agent(source, source.load_effective()))
    except ConfigError as exc:
        print(f"ascend-agent: {exc}", file=sys.stderr)
        return EXIT_USAGE


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))

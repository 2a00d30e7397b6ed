"""Which A3 card the driver resets together with each card: its "brother card", which shares its network
ports, as the driver's own library says (``dcmi_get_netdev_brother_device`` of ``libdcmi.so``, what Huawei's
device plugin asks). npu-smi prints no such thing; guessing it (the card half the node away) would, on a
board paired otherwise, reset a card whose pods were never checked.

The library is loaded in a child process (``python -m ascend_agent.backends.dcmi_pairs LIB CARD...``), never
in the agent: a driver call can block, and only a process can be killed at its timeout. The child prints one
``CARD BROTHER`` line per card (-1: none, as on Atlas 9000 A3 SuperPoD boards); the agent checks the answer::

    pairs = await read_paired_cards(settings, [0, 1, 2, 3, 4, 5, 6, 7])   # {0: 4, 1: 5, ..., 7: 3}
    # PairingError("libdcmi's dcmi_get_netdev_brother_device returned -8255 ...") when it cannot say
"""

from __future__ import annotations

import os
import sys
from collections.abc import Sequence
from pathlib import Path

from ascend_agent.model import NO_PAIRED_CARD, is_chip_id

# The driver's library under the host root, and where its own libraries are.
LIBDCMI = "usr/local/dcmi/libdcmi.so"
_LIBRARY_DIRS = (
    "usr/local/dcmi",
    "usr/local/Ascend/driver/lib64",
    "usr/local/Ascend/driver/lib64/common",
    "usr/local/Ascend/driver/lib64/driver",
)
_MODULE = "ascend_agent.backends.dcmi_pairs"
_CALL = "dcmi_get_netdev_brother_device"
# More than any node has; a longer answer is not the child's.
_MAX_ANSWER = 64 * 1024


class PairingError(Exception):
    """The pairing could not be read; the message says why in one line."""


async def read_paired_cards(host_root: Path, cards: Sequence[int], timeout: float) -> dict[int, int]:
    """Each of ``cards`` (npu-smi's NPU ids) with the card the driver pairs it with (``NO_PAIRED_CARD``:
    none), read from ``<host_root>/usr/local/dcmi/libdcmi.so`` in a child process bounded by ``timeout``.
    :class:`PairingError` when the library is missing or refuses, or its answer makes no sense."""
    from ascend_agent.backends.npusmi import NpuSmiError
    from ascend_agent.backends.tool import run_tool

    library = host_root / LIBDCMI
    if not library.is_file():
        raise PairingError(f"{library} is not there")
    search = [str(host_root / directory) for directory in _LIBRARY_DIRS]
    inherited = os.environ.get("LD_LIBRARY_PATH")
    env = {**os.environ, "LD_LIBRARY_PATH": ":".join([*search, *([inherited] if inherited else [])])}
    args = ["-P", "-m", _MODULE, str(library), *map(str, cards)]
    try:
        code, stdout, stderr = await run_tool(sys.executable, args, timeout, env=env)
    except NpuSmiError as exc:
        raise PairingError(f"asking {library}: {exc.cause}") from None
    said = stderr.decode("utf-8", "replace").strip().splitlines()
    if code != 0:
        raise PairingError(said[-1][:300] if said else f"asking {library} exited with status {code}")
    return parse_pairs(stdout[:_MAX_ANSWER].decode("ascii", "replace"), cards)


def parse_pairs(text: str, cards: Sequence[int]) -> dict[int, int]:
    """The child's ``CARD BROTHER`` lines, checked: every card answered once, each brother -1 or a card of
    the node, and the pairing symmetric (the driver resets both cards whichever one faults).

    >>> parse_pairs("0 2\\n1 -1\\n2 0\\n", [0, 1, 2])
    {0: 2, 1: -1, 2: 0}
    >>> parse_pairs("0 4\\n1 -1\\n", [0, 1])
    Traceback (most recent call last):
    ...
    ascend_agent.backends.dcmi_pairs.PairingError: the driver pairs card 0 with card 4, which npu-smi \
does not list
    """
    pairs: dict[int, int] = {}
    for line in text.splitlines():
        words = line.split()
        if len(words) != 2 or not all(is_chip_id(word.removeprefix("-")) for word in words):
            raise PairingError(f"the answer has a line that is not CARD BROTHER: {line[:60]!r}")
        card, brother = int(words[0]), int(words[1])
        if card not in cards or card in pairs:
            raise PairingError(f"the answer names card {card} twice or unasked")
        pairs[card] = brother
    missing = sorted(set(cards) - set(pairs))
    if missing:
        raise PairingError(f"the answer leaves out card {missing[0]}")
    for card, brother in sorted(pairs.items()):
        if brother == NO_PAIRED_CARD:
            continue
        if brother not in pairs:
            raise PairingError(
                f"the driver pairs card {card} with card {brother}, which npu-smi does not list"
            )
        if pairs[brother] != card:
            raise PairingError(
                f"the driver pairs card {card} with card {brother}, but card {brother} with {pairs[brother]}"
            )
    return pairs


def _ask(library: str, cards: Sequence[str]) -> int:
    """The child: load ``library``, initialise it and ask each card's brother (die 0 speaks for its card);
    one ``CARD BROTHER`` line each, or one line on stderr and exit status 1."""
    import ctypes

    from ascend_agent.backends.tool import DCMI_CODES

    def failed(what: str, code: int) -> int:
        meaning = DCMI_CODES.get(code, ("", "a code not known here", ""))[1]
        sys.stderr.write(f"{library}: {what} returned {code} ({meaning})\n")
        return 1

    try:
        dcmi = ctypes.CDLL(library)
        init, brother_of = dcmi.dcmi_init, getattr(dcmi, _CALL)
    except OSError as exc:
        sys.stderr.write(f"cannot load {library}: {exc}\n")
        return 1
    except AttributeError:
        sys.stderr.write(f"{library} has no {_CALL}: a driver older than A3's\n")
        return 1
    init.restype = ctypes.c_int
    brother_of.restype = ctypes.c_int
    brother_of.argtypes = [ctypes.c_int, ctypes.c_int, ctypes.POINTER(ctypes.c_int)]
    code = init()
    if code != 0:
        return failed("dcmi_init", code)
    lines = []
    for card in cards:
        brother = ctypes.c_int(NO_PAIRED_CARD)
        code = brother_of(int(card), 0, ctypes.byref(brother))
        if code != 0:
            return failed(f"{_CALL} for card {card}", code)
        lines.append(f"{card} {brother.value}\n")
    sys.stdout.write("".join(lines))
    return 0


if __name__ == "__main__":
    if len(sys.argv) < 3 or not all(arg.isdigit() for arg in sys.argv[2:]):
        sys.stderr.write(f"usage: python -m {_MODULE} LIBDCMI CARD...\n")
        raise SystemExit(2)
    raise SystemExit(_ask(sys.argv[1], sys.argv[2:]))

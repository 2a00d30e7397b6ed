"""Running the driver's ``hccn_tool`` (bounded as npu-smi is) and parsing what it prints.

``hccn_tool -i <phys id> <command> -g`` takes the chip's physical id. Every parser takes the text one command
printed (the link and net health ones also the chip asked, to refuse an answer that names another) and raises
only :class:`HccnParseError`; :func:`run_hccn_tool` raises only ``NpuSmiError`` (the error
of running any driver tool) and returns None for "nothing configured" (exit status 13, "no ip was
preset")::

    text = await run_hccn_tool("hccn_tool", 0, ["-ip", "-g"], timeout=10)
    address = parse_ip(text) if text is not None else None
"""

from __future__ import annotations

import re
from collections.abc import Sequence

from ascend_agent.backends.npusmi import NpuSmiError
from ascend_agent.backends.tool import run_tool
from ascend_agent.model import IpAddress, unzoned_address

# hccn_tool's exit status (UDA_DSMI_IPCONF_NOT_PRESET_ERR & 0xff) and message when a chip has no address.
NOT_PRESET_STATUS = 13
_NOT_PRESET = re.compile(r"no \w+ was preset", re.IGNORECASE)
# Where the driver installs hccn_tool, under --host-root.
HOST_PATH = "usr/local/Ascend/driver/tools/hccn_tool"


class HccnParseError(ValueError):
    """The text is not what the hccn_tool command prints."""


def _lines(text: str, label: str) -> list[str]:
    """The values of every ``<label>:<value>`` line (``label`` matched without regard to spaces around
    the colon)."""
    pattern = re.compile(rf"^\s*{re.escape(label)}\s*:\s*(.*?)\s*$")
    return [match.group(1) for line in text.splitlines() if (match := pattern.match(line))]


def _address(value: str, version: int, command: str) -> IpAddress:
    """The IPv``version`` address ``value`` gives, without an IPv6 zone (``model.unzoned_address``).

    >>> str(_address("2001:db8::5%eth0", 6, "-ip -inet6 -g"))
    '2001:db8::5'
    """
    try:
        address = unzoned_address(value)
    except ValueError:
        raise HccnParseError(f"{command}: {value[:40]!r} is not an IP address") from None
    if address.version != version:
        raise HccnParseError(f"{command}: {value[:40]!r} is not an IPv{version} address")
    return address


def _first_usable(values: Sequence[str], version: int, command: str) -> str | None:
    """The first address that can carry traffic: ``0.0.0.0``, ``::`` and link-local ones are none."""
    for value in values:
        address = _address(value, version, command)
        if not (address.is_unspecified or address.is_link_local):
            return str(address)
    return None


def parse_ip(text: str) -> str | None:
    """``hccn_tool -i N -ip -g``: the chip's first IPv4 address (one ``ipaddr:``/``netmask:`` pair per
    port); None when it names only ``0.0.0.0``.

    >>> parse_ip("ipaddr:10.10.0.10\\nnetmask:255.255.255.0\\n")
    '10.10.0.10'
    """
    values = _lines(text, "ipaddr")
    if not values:
        raise HccnParseError("-ip -g: no 'ipaddr:' line")
    for mask in _lines(text, "netmask"):
        _address(mask, 4, "-ip -g netmask")
    return _first_usable(values, 4, "-ip -g")


def parse_ipv6(text: str) -> str | None:
    """``hccn_tool -i N -ip -inet6 -g``: the chip's first global IPv6 address; link-local ones
    (``fe80::/10``) are refused, as Huawei's plugin refuses them: None when there is no other.

    >>> parse_ipv6("ipv6_address:fe80::1\\nprefix_length:64\\nipv6_address:2001:db8::5\\nprefix_length:64\\n")
    '2001:db8::5'
    """
    values = _lines(text, "ipv6_address")
    if not values:
        raise HccnParseError("-ip -inet6 -g: no 'ipv6_address:' line")
    return _first_usable(values, 6, "-ip -inet6 -g")


def parse_vnic(text: str) -> str | None:
    """``hccn_tool -i N -vnic -g`` (A3): the virtual NIC's IPv4 address; None for ``0.0.0.0``.

    >>> parse_vnic("vnic link status: UP\\nvnic ipaddr: 192.168.2.199\\nvnic netmask: 255.255.255.0\\n")
    '192.168.2.199'
    """
    values = _lines(text, "vnic ipaddr")
    if len(values) != 1:
        raise HccnParseError("-vnic -g: not one 'vnic ipaddr:' line")
    return _first_usable(values, 4, "-vnic -g")


async def run_hccn_tool(executable: str, phys_id: int, args: Sequence[str], timeout: float) -> str | None:
    """``hccn_tool -i <phys_id> args``: what it printed, or None when it says nothing is configured (exit
    status 13, "no ip was preset"). Any other failure is an ``NpuSmiError`` naming the command."""
    command = [executable, "-i", str(phys_id), *args]
    returncode, stdout, stderr = await run_tool(executable, command[1:], timeout)
    said = (stderr + stdout).decode("utf-8", errors="replace")
    if returncode == NOT_PRESET_STATUS and _NOT_PRESET.search(said):
        return None
    if returncode != 0:
        lines = said.strip().splitlines()
        last = lines[-1][:200] if lines else "no output"
        raise NpuSmiError("exit", f"{' '.join(command)} exited with status {returncode}: {last}")
    return stdout.decode("utf-8", errors="replace")


# `net health status:` values (the driver's table; older drivers print "Socket failed"). Success and Init
# are what Huawei's plugin counts as a ready network; the others name a failed probe of the detect address.
NET_HEALTH_READY = frozenset({"Success", "Init"})
_NET_HEALTH_VALUE = re.compile(r"[A-Za-z][A-Za-z ]{0,39}")
# What names a chip in hccn_tool's answers (`-link_stat -g`, `-tls -g`): `[devid 3]`, `[device 3]`,
# `dev_id:3`.
_NAMES_CHIP = re.compile(r"\[dev(?:id|ice) (\d+)\]|\bdev_id:(\d+)")


def _only_line(text: str, label: str, command: str, phys_id: int) -> str:
    """The value of the one ``<label>:`` line of ``text``, the answer of ``-i phys_id command``: refused when
    the text names another chip, has no such line, more than one, or any other line."""
    for match in _NAMES_CHIP.finditer(text):
        named = int(match.group(1) or match.group(2))
        if named != phys_id:
            raise HccnParseError(
                f"{command}: the answer names chip {named}: an answer meant for another chip"
            )
    values = _lines(text, label)
    others = [
        line
        for line in text.splitlines()
        if line.strip() and not re.match(rf"\s*{re.escape(label)}\s*:", line)
    ]
    if len(values) != 1 or others:
        shown = (others or [text.strip()])[0][:40]
        raise HccnParseError(f"{command}: not one {label!r} line ({shown!r})")
    return values[0]


def parse_link(text: str, phys_id: int) -> bool:
    """``hccn_tool -i N -link -g``: whether the chip's RoCE link is up (``link status: UP``) or down.

    >>> parse_link("link status: UP\\n", 0), parse_link("link status: DOWN\\n", 0)
    (True, False)
    """
    value = _only_line(text, "link status", "-link -g", phys_id)
    if value.upper() not in ("UP", "DOWN"):
        raise HccnParseError(f"-link -g: link status {value[:40]!r} is neither UP nor DOWN")
    return value.upper() == "UP"


def parse_net_health(text: str, phys_id: int) -> str:
    """``hccn_tool -i N -net_health -g``: the status of the chip's network probe, as printed (``Success``,
    ``Init``, ``Fault``, ``Socket fail``, ``Receive timeout``, ...).

    >>> parse_net_health("net health status: Socket failed\\n", 0)
    'Socket failed'
    """
    value = _only_line(text, "net health status", "-net_health -g", phys_id)
    if not _NET_HEALTH_VALUE.fullmatch(value):
        raise HccnParseError(f"-net_health -g: {value[:40]!r} is not a net health status")
    return value

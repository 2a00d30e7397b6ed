"""hccn_tool and npu-smi spod-info parsers over the shared real outputs, hypothesis on made-up and mutated
text, and hccn_tool run through a fake one that answers, says "no ip was preset", fails, hangs or prints
garbage."""

from __future__ import annotations

import contextlib
import ipaddress
from pathlib import Path

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from ascend_agent.backends.hccn import (
    HccnParseError,
    parse_ip,
    parse_ipv6,
    parse_link,
    parse_net_health,
    parse_vnic,
    run_hccn_tool,
)
from ascend_agent.backends.npusmi import NpuSmiError, NpuSmiParseError, parse_spod_info
from ascend_agent.model import SuperPod
from tests.support.hccn_fake import FakeHccnTool
from tests.support.training_fixtures import per_chip, per_command, read

EIGHT = per_chip("hccn_tool-ip-g_fixture-8dev.txt")
A3_IPS = per_chip("hccn_tool-ip-g_A3-log-decoded.txt")
A3_SPOD = per_chip("npu-smi-info-t-spod-info_A3-log-decoded.txt")
DOC = per_command("hccn_tool-multi_doc-example_collecting-logs.txt")
LINK_STAT = per_chip("hccn_tool-link_stat-g_fixture.txt")


def test_eight_chips_ip() -> None:
    assert {chip: parse_ip(text) for chip, text in EIGHT.items()} == {i: f"10.10.0.1{i}" for i in range(8)}


def test_a3_ips_and_the_doc_example() -> None:
    assert parse_ip(A3_IPS[0]) == "10.0.245.11"
    assert parse_ip(A3_IPS[12]) == "10.0.245.17"
    doc = per_chip("hccn_tool-multi_doc-example_collecting-logs.txt")
    # The doc masks the address (10.xx.xx.10): that is not an address, and is refused as garbage.
    with pytest.raises(HccnParseError):
        parse_ip(doc[0])


def test_empty_output_is_garbage_not_none() -> None:
    sections = per_chip("hccn_tool-ip-g_fixture-with-empty-output.txt")
    assert parse_ip(sections[0]) == "192.161.200.10"
    with pytest.raises(HccnParseError):
        parse_ip(sections[2])


def test_vnic_doc_example() -> None:
    text = read("hccn_tool-vnic-g_doc-Ascend950.txt").split("\n", 1)[1]
    assert parse_vnic(text) == "192.168.2.199"


def test_ipv6_link_local_is_refused() -> None:
    assert parse_ipv6("ipv6_address:fe80::1\nprefix_length:64\n") is None
    assert parse_ipv6("ipv6_address:2001:db8::7\nprefix_length:64\n") == "2001:db8::7"
    with pytest.raises(HccnParseError):
        parse_ipv6("ipv6_address:10.0.0.1\nprefix_length:64\n")


def test_an_ipv6_address_is_given_without_its_zone() -> None:
    """A zone (``%eth0``) names an interface of the host that printed it: no use to a peer, a rank table or a
    claim, and a long one made the DRA attribute longer than the API server takes (64 bytes)."""
    assert parse_ipv6("ipv6_address:2001:db8::7%eth0\nprefix_length:64\n") == "2001:db8::7"
    assert parse_ipv6(f"ipv6_address:fe80::1%eth0\nipv6_address:2001:db8::8%{'x' * 200}\n") == "2001:db8::8"


def test_unspecified_address_is_none() -> None:
    assert parse_ip("ipaddr:0.0.0.0\nnetmask:0.0.0.0\n") is None


def test_spod_info_of_five_a3_dies() -> None:
    pods = {die: parse_spod_info(text) for die, text in A3_SPOD.items()}
    assert pods[0] == SuperPod(sdid=167772160, size=384, super_pod_id=0, server_index=40)
    assert [pods[die].sdid for die in (1, 10, 11, 12)] == [167837697, 169082890, 169148427, 169345036]


def test_spod_info_driver_none_is_minus_one_and_bad_numbers_refused() -> None:
    text = "SDID : 5\nSuper Pod Size : 384\nSuper Pod ID : 4294967295\nServer Index : 4294967295\n"
    assert parse_spod_info(text) == SuperPod(5, 384, -1, -1)
    with pytest.raises(NpuSmiParseError):
        parse_spod_info(text.replace("SDID : 5", "SDID : -5"))
    with pytest.raises(NpuSmiParseError):
        parse_spod_info("This device does not support get spod info.\n")


def test_link_and_net_health_doc_examples() -> None:
    assert parse_link(DOC["-i 0 -link -g"], 0) is True
    assert parse_net_health(DOC["-i 0 -net_health -g"], 0) == "Init"
    documented = [line for line in read("hccn_tool-net_health-g_doc-fault-and-success.txt").splitlines()
                  if not line.startswith("#")]  # fmt: skip
    assert [parse_net_health(line, 3) for line in documented if line] == ["Fault", "Success"]
    socket = per_chip("hccn_tool-net_health-g_fixture-socket-failed.txt")[0]
    assert parse_net_health(socket, 0) == "Socket failed"


def test_another_chips_answer_is_refused_naming_it() -> None:
    # Chip 1 asked, chip 0's -link_stat answer printed: it names chip 0.
    with pytest.raises(HccnParseError, match="names chip 0: an answer meant for another chip"):
        parse_link(LINK_STAT[0], 1)
    with pytest.raises(HccnParseError, match="names chip 0"):
        parse_net_health(DOC["-i 0 -tls -g"], 5)
    # The right chip, but another command's answer: still not a link state.
    with pytest.raises(HccnParseError, match="not one 'link status' line"):
        parse_link(LINK_STAT[1], 1)


def test_another_commands_answer_is_refused() -> None:
    with pytest.raises(HccnParseError):
        parse_link(DOC["-i 0 -net_health -g"], 0)
    with pytest.raises(HccnParseError):
        parse_net_health(DOC["-i 0 -link -g"], 0)
    # The whole log of chip 0 (every command's answer at once) is none of them.
    whole = read("hccn_tool-multi_doc-example_collecting-logs.txt")
    for parse in (parse_link, parse_net_health):
        with pytest.raises(HccnParseError):
            parse(whole, 0)
    with pytest.raises(HccnParseError, match="neither UP nor DOWN"):
        parse_link("link status: FLAPPING\n", 0)
    with pytest.raises(HccnParseError):
        parse_net_health("net health status: \x1b[31mFault\n", 0)


# hypothesis ---------------------------------------------------------------------------------------------
@given(
    st.booleans(),
    st.sampled_from(["", " ", "\t"]),
    st.sampled_from(["\n", "\r\n", ""]),
    st.sampled_from(["UP", "DOWN", "up", "Down"]),
)
def test_any_link_line_round_trips(blank_before: bool, space: str, newline: str, state: str) -> None:
    text = ("\n" if blank_before else "") + f"{space}link status{space}:{space}{state}{space}{newline}"
    assert parse_link(text, 0) is (state.upper() == "UP")


@given(st.from_regex(r"[A-Za-z][A-Za-z ]{0,38}[A-Za-z]", fullmatch=True), st.integers(0, 63))
def test_any_net_health_word_round_trips(status: str, phys_id: int) -> None:
    assert parse_net_health(f"net health status: {status}\n", phys_id) == status


@given(st.integers(0, 63), st.integers(0, 63))
def test_a_chip_named_in_the_answer_must_be_the_one_asked(asked: int, named: int) -> None:
    text = f"[devid {named}]link status: UP\n"
    try:
        parse_link(text, asked)
    except HccnParseError as exc:
        assert ("another chip" in str(exc)) is (asked != named)
    else:
        raise AssertionError("a [devid N] line is no -link -g answer")


ipv4 = st.ip_addresses(v=4).filter(lambda a: not (a.is_unspecified or a.is_link_local))
ipv6 = st.ip_addresses(v=6).filter(lambda a: not (a.is_unspecified or a.is_link_local))


@given(ipv4, st.sampled_from(["", " ", "\t"]), st.sampled_from(["\n", "\r\n"]))
def test_any_ipv4_round_trips(address: ipaddress.IPv4Address, space: str, newline: str) -> None:
    text = f"ipaddr:{space}{address}{newline}netmask:255.255.255.0{newline}"
    assert parse_ip(text) == str(address)
    assert parse_vnic(f"vnic link status: UP\nvnic ipaddr: {address}\nvnic netmask: 255.255.0.0\n") == str(
        address
    )


@given(ipv6, st.from_regex(r"[A-Za-z0-9._-]{1,200}", fullmatch=True))
def test_any_global_ipv6_round_trips(address: ipaddress.IPv6Address, zone: str) -> None:
    assert parse_ipv6(f"ipv6_address:{address}\nprefix_length:64\n") == str(address)
    assert parse_ipv6(f"ipv6_address:{address}%{zone}\nprefix_length:64\n") == str(address)


@given(st.integers(0, 2**32 - 1), st.integers(0, 2**32 - 1), st.integers(0, 2**32 - 2))
def test_any_spod_info_round_trips(sdid: int, size: int, index: int) -> None:
    text = (
        f"\tSDID{' ' * 27}: {sdid}\n\tSuper Pod Size : {size}\n\tSuper Pod ID : 0\n\tServer Index : {index}\n"
    )
    assert parse_spod_info(text) == SuperPod(sdid, size, 0, index)


@settings(suppress_health_check=[HealthCheck.too_slow])
@given(
    st.sampled_from(
        sorted(EIGHT.values())
        + sorted(A3_SPOD.values())
        + [DOC["-i 0 -link -g"], DOC["-i 0 -net_health -g"], LINK_STAT[0]]
    ),
    st.data(),
)
def test_mutated_outputs_raise_only_parse_errors(text: str, data: st.DataObject) -> None:
    position = data.draw(st.integers(0, len(text)))
    cut = data.draw(st.integers(0, 8))
    inserted = data.draw(st.text(max_size=12))
    mutated = text[:position] + inserted + text[position + cut :]
    for parse in (parse_ip, parse_ipv6, parse_vnic):
        try:
            result = parse(mutated)
        except HccnParseError:
            continue
        assert result is None or ipaddress.ip_address(result)
    with contextlib.suppress(HccnParseError):
        assert isinstance(parse_link(mutated, 0), bool)
    with contextlib.suppress(HccnParseError):
        assert parse_net_health(mutated, 0).strip()
    with contextlib.suppress(NpuSmiParseError):
        parse_spod_info(mutated)


@given(st.text(max_size=200))
def test_any_text_raises_only_parse_errors(text: str) -> None:
    for parse in (parse_ip, parse_ipv6, parse_vnic):
        with contextlib.suppress(HccnParseError):
            parse(text)
    for parse_state in (parse_link, parse_net_health):
        with contextlib.suppress(HccnParseError):
            parse_state(text, 0)
    with contextlib.suppress(NpuSmiParseError):
        parse_spod_info(text)


# the runner through a fake hccn_tool ---------------------------------------------------------------------
@pytest.fixture
def tool(short_dir: Path) -> FakeHccnTool:
    return FakeHccnTool(short_dir / "hccn")


async def test_runner_answers_and_not_preset_is_none(tool: FakeHccnTool) -> None:
    tool.set_output("-i 3 -ip -g", EIGHT[3])
    assert await run_hccn_tool(str(tool.path), 3, ["-ip", "-g"], timeout=5) == EIGHT[3]
    assert await run_hccn_tool(str(tool.path), 4, ["-ip", "-g"], timeout=5) is None


async def test_runner_failure_hang_and_missing_are_errors(tool: FakeHccnTool, short_dir: Path) -> None:
    tool.set_error("-i 0 -ip -g", "dsmi_get_device_ip_address failed, ret = -8020\n", status=13)
    with pytest.raises(NpuSmiError, match="exited with status 13: dsmi_get"):
        await run_hccn_tool(str(tool.path), 0, ["-ip", "-g"], timeout=5)
    tool.set_mode("hang")
    with pytest.raises(NpuSmiError, match="timed out after 1 s") as hung:
        await run_hccn_tool(str(tool.path), 1, ["-ip", "-g"], timeout=1)
    assert hung.value.reason == "timeout"
    with pytest.raises(NpuSmiError) as missing:
        await run_hccn_tool(str(short_dir / "absent" / "hccn_tool"), 0, ["-ip", "-g"], timeout=5)
    assert missing.value.reason == "missing"

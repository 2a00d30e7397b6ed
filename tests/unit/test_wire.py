"""The pre-encoded answers are byte for byte what the message classes encode, and the request readers agree
with the message classes on every request, including hostile ones, in linear time."""

from __future__ import annotations

import pytest
from hypothesis import given
from hypothesis import strategies as st

from ascend_agent._proto.v1beta1 import (
    AllocateRequest,
    ContainerAllocateRequest,
    ContainerPreferredAllocationRequest,
    Device,
    ListAndWatchResponse,
    NumaNode,
    PreferredAllocationRequest,
    PreferredAllocationResponse,
    TopologyInfo,
)
from ascend_agent.kubelet.deviceplugin import wire
from ascend_agent.model import Chip, Health

_IDS = st.lists(st.text(min_size=1, max_size=20), max_size=6)


def test_device_list_equals_the_message_encoding() -> None:
    chips = [Chip.make(i, "910B4", numa_node=i // 4) for i in range(300)]
    chips[7] = chips[7].with_health(Health.UNHEALTHY, "test")
    devices = wire.DeviceList()
    snapshot = devices.encode({chip.device_id: chip for chip in chips})
    expected = ListAndWatchResponse(
        devices=[
            Device(
                id=c.device_id, health=c.health.value, topology=TopologyInfo(nodes=[NumaNode(id=c.numa_node)])
            )
            for c in chips
        ]
    )
    assert snapshot == bytes(expected)
    chips[7] = chips[7].with_health(Health.HEALTHY)
    again = devices.encode({chip.device_id: chip for chip in chips})
    assert ListAndWatchResponse.parse(again).devices[7].health == "Healthy"


@given(st.lists(_IDS, max_size=5))
def test_allocate_request_reads_what_the_messages_encode(containers: list[list[str]]) -> None:
    message = AllocateRequest(
        container_requests=[ContainerAllocateRequest(devices_ids=ids) for ids in containers]
    )
    assert wire.allocate_request(bytes(message)) == containers


@given(st.lists(st.tuples(_IDS, _IDS, st.integers(-(2**31), 2**31 - 1)), max_size=4))
def test_preferred_request_reads_what_the_messages_encode(
    containers: list[tuple[list[str], list[str], int]],
) -> None:
    message = PreferredAllocationRequest(
        container_requests=[
            ContainerPreferredAllocationRequest(
                available_deviceIDs=available, must_include_deviceIDs=must, allocation_size=size
            )
            for available, must, size in containers
        ]
    )
    parsed = wire.preferred_request(bytes(message))
    assert [(r.available, r.must_include, r.size) for r in parsed] == containers


def test_preferred_response_equals_the_message_encoding() -> None:
    choices = [["Ascend910-0", "Ascend910-1"], []]
    decoded = PreferredAllocationResponse.parse(wire.preferred_response(choices))
    assert [list(r.device_i_ds) for r in decoded.container_responses] == choices


@given(st.binary(max_size=200))
def test_any_bytes_decode_or_raise_wire_error(data: bytes) -> None:
    try:
        wire.allocate_request(data)
        wire.preferred_request(data)
    except wire.WireError:
        pass


def test_unknown_fields_are_skipped() -> None:
    inner = b"\x0a\x0bAscend910-3" + b"\x10\x05" + b"\x1d\x00\x00\x00\x00" + b"\x21" + b"\x00" * 8
    data = b"\x0a" + bytes([len(inner)]) + inner + b"\x12\x02hi"
    assert wire.allocate_request(data) == [["Ascend910-3"]]


@pytest.mark.parametrize(
    "data",
    [
        b"\x0a\x05abc",
        b"\x0a\x02\x0a\x05",
        b"\x0b",
        b"\x08" + b"\xff" * 11,
        b"\x0a\x02\x08\x01"[:2] + b"\x0f\x00",
    ],
)
def test_malformed_requests_raise_wire_error(data: bytes) -> None:
    with pytest.raises(wire.WireError):
        wire.allocate_request(data)


def test_a_request_full_of_unknown_fields_names_nothing() -> None:
    # 64 KiB of one-byte varint fields, the largest request the plugin socket accepts (bench/allocate.py
    # measures what reading it costs).
    assert wire.allocate_request(b"\x10\x01" * (32 * 1024)) == []

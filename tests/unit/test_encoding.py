"""The pre-encoded answers are byte for byte what the message classes encode."""

from __future__ import annotations

from pathlib import Path

from ascend_agent._proto.v1beta1 import Device, ListAndWatchResponse, NumaNode, TopologyInfo
from ascend_agent.model import Chip, Health
from ascend_agent.plugin import PluginServer


def test_published_list_equals_the_message_encoding() -> None:
    chips = [Chip.make(i, "910B4", numa_node=i // 4) for i in range(300)]
    chips[7] = chips[7].with_health(Health.UNHEALTHY, "test")
    server = PluginServer("huawei.com/Ascend910", Path("/nonexistent/x.sock"), lambda chips: None)  # type: ignore[arg-type,return-value]
    server.publish({chip.device_id: chip for chip in chips})
    expected = ListAndWatchResponse(
        devices=[
            Device(
                id=c.device_id, health=c.health.value, topology=TopologyInfo(nodes=[NumaNode(id=c.numa_node)])
            )
            for c in chips
        ]
    )
    assert server._snapshot == bytes(expected)
    assert ListAndWatchResponse.parse(server._snapshot).devices[7].health == "Unhealthy"
    chips[7] = chips[7].with_health(Health.HEALTHY)
    server.publish({chip.device_id: chip for chip in chips})
    assert ListAndWatchResponse.parse(server._snapshot).devices[7].health == "Healthy"

"""What a large answer costs the agent as a process: a kubelet whose PodResources List answers 12 MB, naming
120,000 devices, again at every health interval, leaves the agent's memory where it was (it held 460 MB
while such answers came, 70 MB after); the answer is refused with one line."""

from __future__ import annotations

from types import ModuleType

from tests.support.agent_process import fake_agent
from tests.support.kubelet_standin import KubeletStandin
from tests.support.podresources import PodResourcesStandin

T = "huawei.com/Ascend910"


def _large_answer(pb: ModuleType) -> object:
    return pb.ListPodResourcesResponse(
        pod_resources=[
            pb.PodResources(
                name=f"pod-{n:04d}",
                namespace="team-a",
                containers=[
                    pb.ContainerResources(
                        name=f"c{c}",
                        devices=[
                            pb.ContainerDevices(
                                resource_name=T, device_ids=[f"Ascend910-{n}-{c}-{i}" for i in range(60)]
                            )
                        ],
                        cpu_ids=list(range(8)),
                    )
                    for c in range(5)
                ],
            )
            for n in range(1300)
        ]
    )


def test_large_pod_resources_answers_leave_memory_where_it_was(
    kubelet: KubeletStandin, podresources: PodResourcesStandin, podresources_api: ModuleType
) -> None:
    agent = fake_agent(
        kubelet.directory,
        *("--fake-model", "910B3", "--pod-resources-socket", str(podresources.path)),
        *("--health-interval", "1", "--no-cluster"),
    )
    try:
        kubelet.wait_update(lambda u: len(u.devices) == 8, what="the device list")
        podresources.wait_calls(podresources.calls + 2, timeout=30)
        before = agent.rss_kib()
        podresources.answer = _large_answer(podresources_api)
        podresources.wait_calls(podresources.calls + 3, timeout=120)
        during = agent.rss_kib()
        assert during - before < 30 * 1024, f"RSS {before} KiB before, {during} KiB while the answers came"
        agent.wait_log(r"Cannot tell which pod holds which chip: .* answered List with \d+ bytes, over the")
        assert len(agent.matching("Cannot tell which pod holds which chip")) == 1
    finally:
        agent.close()

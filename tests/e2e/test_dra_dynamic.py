"""Dynamic vNPUs end to end: the agent as a DRA driver on the devfs backend, over a host tree of 310P3 chips
and a fake npu-smi that keeps vNPUs as a node does (create and destroy change what ``info-vnpu`` shows, and
the ``/dev/vdavinci*`` nodes). A claim for a template device is carved at prepare and destroyed at unprepare;
bad input and faults end in the claim's error or a clean retry, and leave no vNPU behind."""

from __future__ import annotations

import json
import os
import re
import signal
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import anyio
import kubernetes_validate
import pytest

from ascend_agent._proto.dra.k8s.io.kubelet.pkg.apis.dra import v1 as dra_v1
from tests.support.agent_process import AgentProcess
from tests.support.apiserver import ApiServer
from tests.support.dra_kubelet import DraKubelet
from tests.support.host_tree import HostTree
from tests.support.npusmi_fake import FakeNpuSmi
from tests.support.processes import outliving, owner_of_this_test, running
from tests.support.vnpu_node import TEMPLATE_INFO, TEMPLATES_310P, info_310p

NODE = "node-1"
DRIVER = "npu.huawei.com"
KUBERNETES = "1.36"
NPU_CONFIG = {"apiVersion": "npu.huawei.com/v1alpha1", "kind": "NpuConfig"}


class _Node:
    """Two 310P3 chips (physical ids 0 and 1, NPU ids the same), both dynamic."""

    def __init__(self, directory: Path, host: HostTree, apiserver: ApiServer) -> None:
        self.directory = directory
        self.host = host.add_chips([0, 1])
        self.apiserver = apiserver
        self.registry = directory / "kubelet" / "plugins_registry"
        for kubelets_own in (self.registry, directory / "kubelet" / "plugins"):
            kubelets_own.mkdir(parents=True)
        self.plugin_dir = directory / "kubelet" / "plugins" / DRIVER
        self.cdi = directory / "cdi"
        self.npu_smi = FakeNpuSmi(directory / "npu-smi")
        self.npu_smi.set_output("info", info_310p([0, 1]))
        for npu_id in (0, 1):
            self.npu_smi.set_output(f"info -t template-info -i {npu_id}", TEMPLATE_INFO)
        self.state()
        self.config = directory / "config.yaml"
        self.config.write_text("vnpu: {dynamic: true}\n")
        self.agents: list[AgentProcess] = []

    def state(self, **options: Any) -> None:
        chips = {(n, 0): {"phys": n, "aicore": 8, "memory": 21, "aicpu": 7, "vnpus": []} for n in (0, 1)}
        self.npu_smi.set_vnpu_state(self.host.dev, chips, TEMPLATES_310P, **options)

    def options(self, **options: Any) -> None:
        """Change how the fake npu-smi answers creates, keeping its vNPUs."""
        state = self.npu_smi.vnpu_state()
        for key in ("fail_create", "hang_after_create", "reject"):
            state.pop(key, None)
        state.update(options)
        temporary = self.npu_smi.directory / "vnpu.json.tmp"
        temporary.write_text(json.dumps(state))
        temporary.replace(self.npu_smi.directory / "vnpu.json")

    def vnpus(self) -> dict[int, list[tuple[int, str]]]:
        """What info-vnpu shows, by physical id."""
        state = self.npu_smi.vnpu_state()
        return {
            chip["phys"]: [(v["id"], v["template"]) for v in chip["vnpus"]]
            for chip in state["chips"].values()
        }

    def made(self) -> list[dict[str, Any]]:
        path = self.plugin_dir / "vnpus.json"
        return list(json.loads(path.read_text())["vnpus"]) if path.exists() else []

    def start(self, *extra: str) -> AgentProcess:
        agent = AgentProcess(
            [
                "run",
                "--backend=devfs",
                f"--host-root={self.host.root}",
                f"--npu-smi={self.npu_smi.path}",
                f"--config={self.config}",
                f"--kubelet-dir={self.directory / 'kubelet' / 'device-plugins'}",
                f"--cdi-spec-dir={self.cdi}",
                "--metrics-address=",
                f"--kubeconfig={self.apiserver.kubeconfig}",
                f"--node-name={NODE}",
                "--kubelet-api=dra",
                *extra,
            ]
        )
        self.agents.append(agent)
        return agent

    async def started(self, *extra: str) -> tuple[AgentProcess, DraKubelet]:
        agent = self.start(*extra)
        await anyio.to_thread.run_sync(
            lambda: agent.wait_log("Serving DRA driver")
        )  # not a killed one's socket
        kubelet = DraKubelet(self.registry)
        await kubelet.register(DRIVER)
        await anyio.to_thread.run_sync(lambda: agent.wait_log("ResourceSlices of pool node-1"))
        assert "npu-1-vir04-0" in _devices(self.apiserver)
        return agent, kubelet

    def claim(
        self, name: str, devices: list[str], parameters: list[Any] | None = None, admin_access: bool = False
    ) -> dra_v1.Claim:
        uid = self.apiserver.put_claim(
            name, devices, driver=DRIVER, pool=NODE, parameters=parameters, admin_access=admin_access
        )
        return dra_v1.Claim(namespace="default", uid=uid, name=name)


@pytest.fixture
def node(short_dir: Path, host: HostTree, apiserver: ApiServer) -> Iterator[_Node]:
    apiserver.put("nodes", {"metadata": {"name": NODE, "uid": "node-uid-1"}})
    made = _Node(short_dir, host, apiserver)
    yield made
    for agent in made.agents:
        agent.close()


def _slices(apiserver: ApiServer) -> list[dict[str, Any]]:
    return [s for s in apiserver.list("resourceslices") if s["spec"]["nodeName"] == NODE]


def _devices(apiserver: ApiServer) -> dict[str, dict[str, Any]]:
    return {d["name"]: d for s in _slices(apiserver) for d in s["spec"].get("devices") or ()}


async def test_a_template_device_is_carved_at_prepare_and_destroyed_at_unprepare(
    node: _Node, apiserver: ApiServer
) -> None:
    _, kubelet = await node.started()
    slices = _slices(apiserver)
    for found in slices:
        assert kubernetes_validate.validate(found, KUBERNETES, strict=True) == KUBERNETES
    (counters,) = [s["spec"]["sharedCounters"] for s in slices if "sharedCounters" in s["spec"]]
    assert [c["name"] for c in counters] == ["npu-0", "npu-1"]
    assert counters[1]["counters"] == {
        "ai-cores": {"value": "8"},
        "memory": {"value": "24Gi"},
        "ai-cpus": {"value": "7"},
    }
    devices = _devices(apiserver)
    assert devices["npu-1"]["consumesCounters"] == [
        {"counterSet": "npu-1", "counters": counters[1]["counters"]}
    ]
    vir04 = devices["npu-1-vir04-0"]
    assert vir04["attributes"]["template"] == {"string": "vir04"}
    assert vir04["capacity"] == {
        "aiCores": {"value": "4"},
        "memory": {"value": "12Gi"},
        "aiCpus": {"value": "4"},
    }
    assert vir04["attributes"]["deviceType"] == {"string": "Ascend310P-4c"}
    assert vir04["consumesCounters"] == [
        {"counterSet": "npu-1", "counters": {"ai-cores": {"value": "4"}, "memory": {"value": "12Gi"},
                                             "ai-cpus": {"value": "4"}}}
    ]  # fmt: skip
    # as many of a template as the chip could hold of it alone: 7 AI CPUs hold one vir04, three vir02
    assert [n for n in devices if re.fullmatch(r"npu-1-vir04-\d+", n)] == ["npu-1-vir04-0"]
    assert [n for n in devices if re.fullmatch(r"npu-1-vir02-\d+", n)] == [
        f"npu-1-vir02-{i}" for i in range(3)
    ]

    claim = node.claim("infer", ["npu-1-vir04-0"])
    prepared = (await kubelet.prepare([claim])).claims[claim.uid]
    assert prepared.error == ""
    assert node.vnpus() == {0: [], 1: [(116, "vir04")]}
    assert node.npu_smi.calls_of("set -t create-vnpu") == ["set -t create-vnpu -i 1 -c 0 -f vir04 -v 116"]
    cdi = json.loads((node.cdi / f"{DRIVER}-claim-{claim.uid}.json").read_text())
    (device,) = cdi["devices"]
    assert device["containerEdits"]["deviceNodes"] == [
        {"path": "/dev/davinci116", "permissions": "rw", "hostPath": "/dev/vdavinci116"}
    ]
    assert "ASCEND_VISIBLE_DEVICES=116" in cdi["containerEdits"]["env"]
    checkpoint = json.loads((node.plugin_dir / "checkpoint.json").read_text())
    (recorded,) = checkpoint["claims"][0]["devices"]
    assert (recorded["vnpu_id"], recorded["template"]) == (116, "vir04")
    assert [(m["claim"], m["vnpu_id"]) for m in node.made()] == [(claim.uid, 116)]
    # a retry is answered from memory: nothing carved again
    assert (await kubelet.prepare([claim])).claims[claim.uid].error == ""
    assert len(node.npu_smi.calls_of("set -t create-vnpu")) == 1

    done = await kubelet.unprepare([claim])
    assert done.claims[claim.uid].error == ""
    assert node.vnpus() == {0: [], 1: []}
    assert node.made() == [] and not (node.cdi / f"{DRIVER}-claim-{claim.uid}.json").exists()
    # the slices never changed: carving is the scheduler's counting, not a new device
    assert "npu-1-vir04-0" in _devices(apiserver) and not any("vnpu" in n for n in _devices(apiserver))


async def test_admin_access_to_a_template_device_is_its_whole_chip_and_carves_nothing(node: _Node) -> None:
    _, kubelet = await node.started()
    carved = node.claim("infer", ["npu-1-vir04-0"])
    assert (await kubelet.prepare([carved])).claims[carved.uid].error == ""
    monitor = node.claim("monitor", ["npu-1-vir04-0"], admin_access=True)
    assert (await kubelet.prepare([monitor])).claims[monitor.uid].error == ""
    assert node.vnpus() == {0: [], 1: [(116, "vir04")]}, "the monitor carves nothing"
    assert len(node.npu_smi.calls_of("set -t create-vnpu")) == 1
    cdi = json.loads((node.cdi / f"{DRIVER}-claim-{monitor.uid}.json").read_text())
    (device,) = cdi["devices"]
    assert [d["path"] for d in device["containerEdits"]["deviceNodes"]] == ["/dev/davinci1"]

    assert (await kubelet.unprepare([monitor])).claims[monitor.uid].error == ""
    assert node.vnpus() == {0: [], 1: [(116, "vir04")]}, "the monitor destroys nothing"
    assert node.npu_smi.calls_of("set -t destroy-vnpu") == []
    assert (await kubelet.unprepare([carved])).claims[carved.uid].error == ""
    assert node.vnpus() == {0: [], 1: []}


async def test_a_failed_or_hung_create_is_the_claims_error_and_leaves_nothing(node: _Node) -> None:
    _, kubelet = await node.started("--npu-smi-timeout=3")
    node.options(fail_create=True)
    claim = node.claim("infer", ["npu-0-vir02-0"])
    refused = (await kubelet.prepare([claim])).claims[claim.uid]
    assert "cannot carve a vir02 vNPU on chip 0 (310P3)" in refused.error
    assert "no free vgroup on this chip" in refused.error  # npu-smi's words
    assert node.vnpus() == {0: [], 1: []} and node.made() == []

    # npu-smi makes the vNPU, then hangs past the timeout: what it made is destroyed again
    node.options(hang_after_create=True)
    refused = (await kubelet.prepare([claim])).claims[claim.uid]
    assert "cannot carve a vir02 vNPU" in refused.error and "timed out" in refused.error, refused.error
    assert node.vnpus() == {0: [], 1: []} and node.made() == []

    node.options()  # the kubelet retries once npu-smi answers again
    assert (await kubelet.prepare([claim])).claims[claim.uid].error == ""
    assert node.vnpus()[0] == [(100, "vir02")]


async def test_claims_racing_for_the_last_of_a_chip_those_past_it_get_the_error(node: _Node) -> None:
    _, kubelet = await node.started()
    # More than the chip holds, as a scheduler that overcounted would allocate it: 4 + 2 + 2 + 2 cores of 8,
    # and 4 + 2 + 2 AI CPUs of 7 already at the third (which npu-smi's core count let through: 8 of 7).
    claims = [
        node.claim("big", ["npu-0-vir04-0"]),
        node.claim("small-a", ["npu-0-vir02-0"]),
        node.claim("small-b", ["npu-0-vir02-1"]),
        node.claim("small-c", ["npu-0-vir02-2"]),
    ]
    answers = (await kubelet.prepare(claims)).claims
    assert [answers[c.uid].error for c in claims[:2]] == ["", ""]
    for late in claims[2:]:
        assert answers[late.uid].error == (
            "cannot carve a vir02 vNPU on chip 0 (310P3): it would take 8 ai-cpus of the 7 the chip has "
            "(vNPUs there now: vir04, vir02)"
        )
    assert sorted(t for _, t in node.vnpus()[0]) == ["vir02", "vir04"]
    assert len(node.made()) == 2
    assert len(node.npu_smi.calls_of("set -t create-vnpu")) == 2, "npu-smi is not asked for what cannot fit"
    done = await kubelet.unprepare(claims)
    assert all(not answer.error for answer in done.claims.values())
    assert node.vnpus() == {0: [], 1: []} and node.made() == []


async def test_a_chip_whose_vnpus_take_more_than_it_has_stays_dynamic(
    node: _Node, apiserver: ApiServer
) -> None:
    """vNPUs made by hand take 8 of the chip's 7 AI CPUs: npu-smi prints ``-1/7``. The chip kept no totals,
    left the pool's counters, and a claim for it was told it is no dynamic chip."""
    chips = {(n, 0): {"phys": n, "aicore": 8, "memory": 21, "aicpu": 7, "vnpus": []} for n in (0, 1)}
    chips[(0, 0)]["vnpus"] = [
        {"id": 100, "template": "vir04"},
        {"id": 101, "template": "vir02"},
        {"id": 102, "template": "vir02"},
    ]
    node.npu_smi.set_vnpu_state(node.host.dev, chips, TEMPLATES_310P)
    _, kubelet = await node.started()
    (counters,) = [s["spec"]["sharedCounters"] for s in _slices(apiserver) if "sharedCounters" in s["spec"]]
    assert [c["name"] for c in counters] == ["npu-0", "npu-1"]
    claim = node.claim("infer", ["npu-0-vir01-0"])
    assert (await kubelet.prepare([claim])).claims[claim.uid].error == (
        "cannot carve a vir01 vNPU on chip 0 (310P3): it would take 9 ai-cores of the 8 the chip has (vNPUs "
        "there now: vir04, vir02, vir02)"
    )


async def test_a_crash_between_create_and_checkpoint_is_cleaned_at_start(node: _Node) -> None:
    agent, kubelet = await node.started("--npu-smi-timeout=60")
    node.options(hang_after_create=True)
    claim = node.claim("infer", ["npu-1-vir02-0"])
    async with anyio.create_task_group() as tasks:
        tasks.start_soon(kubelet.prepare, [claim])
        await anyio.to_thread.run_sync(
            node.npu_smi.wait_count, "set -t create-vnpu -i 1 -c 0 -f vir02 -v 116", 1
        )
        os.kill(agent.proc.pid, signal.SIGKILL)
        agent.proc.wait(10)
        tasks.cancel_scope.cancel()
    # the hung npu-smi, in a session of its own, ends with the agent: a node's would not, a test's must
    assert outliving(running(owner_of_this_test()), timeout=10) == []
    assert node.vnpus()[1] == [(116, "vir02")]  # made, and no checkpoint says for whom
    assert [m["vnpu_id"] for m in node.made()] == [116]
    node.options()
    agent, kubelet = await node.started("--npu-smi-timeout=60")
    agent.wait_log(re.escape("Destroyed vNPU 116 (vir02) on chip 1"))
    assert node.vnpus()[1] == [] and node.made() == []
    assert (await kubelet.prepare([claim])).claims[claim.uid].error == ""  # the kubelet's retry
    assert node.vnpus()[1] == [(116, "vir02")]


async def test_a_vnpu_made_by_hand_is_never_destroyed(node: _Node) -> None:
    chips = {(n, 0): {"phys": n, "aicore": 8, "memory": 21, "aicpu": 7, "vnpus": []} for n in (0, 1)}
    chips[(0, 0)]["vnpus"] = [{"id": 100, "template": "vir02"}]
    node.npu_smi.set_vnpu_state(node.host.dev, chips, TEMPLATES_310P)
    agent, kubelet = await node.started()
    claim = node.claim("infer", ["npu-0-vir04-0"])
    assert (await kubelet.prepare([claim])).claims[claim.uid].error == ""
    assert node.vnpus()[0] == [(100, "vir02"), (101, "vir04")]  # the next free id
    await kubelet.unprepare([claim])
    agent.proc.send_signal(signal.SIGTERM)
    assert agent.proc.wait(10) == 0
    await node.started()
    assert node.vnpus()[0] == [(100, "vir02")]


@pytest.mark.parametrize("damage", ["truncated", "symlink"])
async def test_a_damaged_checkpoint_leaks_no_vnpu(node: _Node, damage: str) -> None:
    agent, kubelet = await node.started()
    claim = node.claim("infer", ["npu-1-vir04-0"])
    assert (await kubelet.prepare([claim])).claims[claim.uid].error == ""
    agent.proc.send_signal(signal.SIGTERM)
    assert agent.proc.wait(10) == 0
    checkpoint = node.plugin_dir / "checkpoint.json"
    if damage == "truncated":
        checkpoint.write_bytes(checkpoint.read_bytes()[:20])
    else:
        target = node.directory / "elsewhere.json"
        checkpoint.rename(target)
        checkpoint.symlink_to(target)
    agent, kubelet = await node.started()
    agent.wait_log("starting with no prepared claims")
    # the vNPU stays: its claim may still run, and the record says whose it is
    assert node.vnpus()[1] == [(116, "vir04")]
    # prepared again (as the kubelet asks): the same vNPU, not a second one
    assert (await kubelet.prepare([claim])).claims[claim.uid].error == ""
    assert node.vnpus()[1] == [(116, "vir04")]
    assert (await kubelet.unprepare([claim])).claims[claim.uid].error == ""
    assert node.vnpus()[1] == [] and node.made() == []


async def test_a_reboot_that_took_the_vnpu_carves_it_again(node: _Node) -> None:
    agent, kubelet = await node.started()
    claim = node.claim("infer", ["npu-0-vir02-1"])
    assert (await kubelet.prepare([claim])).claims[claim.uid].error == ""
    agent.proc.send_signal(signal.SIGTERM)
    assert agent.proc.wait(10) == 0
    # a reboot: the vNPUs and the CDI directory (a tmpfs) are gone, the checkpoint is not
    node.state()
    (node.cdi / f"{DRIVER}-claim-{claim.uid}.json").unlink()
    (node.host.dev / "vdavinci100").unlink(missing_ok=True)
    _, kubelet = await node.started()
    prepared = (await kubelet.prepare([claim])).claims[claim.uid]
    assert prepared.error == ""
    assert node.vnpus()[0] == [(100, "vir02")]  # the same id, so the spec written again names it
    cdi = json.loads((node.cdi / f"{DRIVER}-claim-{claim.uid}.json").read_text())
    assert cdi["devices"][0]["containerEdits"]["deviceNodes"][0]["hostPath"] == "/dev/vdavinci100"


async def test_npu_config_carves_a_whole_chip_and_sets_the_runtime(node: _Node) -> None:
    _, kubelet = await node.started()
    whole = node.claim(
        "whole", ["npu-0"], [{**NPU_CONFIG, "template": "vir02_1c", "runtime": "ascend-runtime"}]
    )
    assert (await kubelet.prepare([whole])).claims[whole.uid].error == ""
    assert node.vnpus()[0] == [(100, "vir02_1c")]
    cdi = json.loads((node.cdi / f"{DRIVER}-claim-{whole.uid}.json").read_text())
    (device,) = cdi["devices"]
    assert "deviceNodes" not in device["containerEdits"]  # the Ascend runtime adds them
    assert "ASCEND_VISIBLE_DEVICES=100" in cdi["containerEdits"]["env"]
    assert "ASCEND_RUNTIME_OPTIONS=VIRTUAL" in cdi["containerEdits"]["env"]

    bad = {
        "typo": ([{**NPU_CONFIG, "templat": "vir02"}], "NpuConfig: unknown field 'templat'"),
        "kind": ([{**NPU_CONFIG, "kind": "GpuConfig"}], "kind 'GpuConfig', not NpuConfig"),
        "runtime": (
            [{**NPU_CONFIG, "runtime": "docker"}],
            "runtime 'docker' is not one of plain, ascend-runtime",
        ),
        "offered": ([{**NPU_CONFIG, "template": "vir16"}], "chip 1 (310P3) offers no template vir16"),
    }
    claims = {name: node.claim(name, ["npu-1"], parameters) for name, (parameters, _) in bad.items()}
    answers = (await kubelet.prepare(list(claims.values()))).claims
    for name, (_, words) in bad.items():
        assert words in answers[claims[name].uid].error, (name, answers[claims[name].uid].error)
    # a template device the chip does not offer (never published; an allocation from a stale slice)
    foreign = node.claim("foreign", ["npu-1-vir16-0"])
    refused = (await kubelet.prepare([foreign])).claims[foreign.uid].error
    assert "chip 1 (310P3) offers no template vir16 (it offers vir01, vir02," in refused
    templated = node.claim("templated", ["npu-1-vir04-0"], [{**NPU_CONFIG, "template": "vir02"}])
    refused = (await kubelet.prepare([templated])).claims[templated.uid].error
    assert "NpuConfig template applies to a whole chip; npu-1-vir04-0 is a vir04 already" in refused
    assert node.vnpus()[1] == [] and all(m["phys_id"] == 0 for m in node.made())

"""The DRA driver as the last line of defense and during a rolling update, against a real file tree and the
Kubernetes API emulator: a device another prepared claim holds is refused for the claim that asks for it,
and two instances of the driver sharing the checkpoint (each call under the shared file lock) act on what
the other one wrote."""

from __future__ import annotations

import fcntl
import json
import os
import socket
from pathlib import Path

import pytest

from ascend_agent.cluster.client import KubeApi
from ascend_agent.cluster.credentials import ClusterTarget
from ascend_agent.config import ConfigError, Settings
from ascend_agent.doctor.dra import pod_paths
from ascend_agent.kubelet.dra.claimread import ClaimReader, ClaimRef
from ascend_agent.kubelet.dra.claims import Prepared, PreparedClaim
from ascend_agent.kubelet.dra.partitions import chip_offer
from ascend_agent.kubelet.dra.paths import DraPaths, pod_uid, remove_stale
from ascend_agent.kubelet.dra.serialize import CallLock
from ascend_agent.kubelet.dra.service import DraService
from ascend_agent.model import Carvable, Chip, ContainerSpec, Template, VNpu
from tests.support.apiserver import ApiServer

DRIVER = "npu.huawei.com"
CHIPS = [Chip.make(i, "310P3") for i in range(4)]
VNPU = Chip.make(3, "310P3").slice(VNpu(130, "vir02"))


def _put_claim(apiserver: ApiServer, name: str, devices: list[str]) -> ClaimRef:
    return ClaimRef("default", name, apiserver.put_claim(name, devices, driver=DRIVER, pool="node-1"))


def _service(directory: Path, api: KubeApi, calls: CallLock | None = None) -> DraService:
    prepared, _ = Prepared.open(directory / "checkpoint.json", directory / "cdi", DRIVER, "boot-1")
    reader = ClaimReader(lambda: api, DRIVER, "node-1")
    service = DraService(DRIVER, "node-1", prepared, reader, **({"calls": calls} if calls else {}))
    service.publish([*CHIPS, VNPU], lambda chips: ContainerSpec(envs={"ASCEND_VISIBLE_DEVICES": "x"}))
    return service


def _api(apiserver: ApiServer) -> KubeApi:
    return KubeApi.connect(ClusterTarget("kubeconfig", apiserver.kubeconfig), "node-1", timeout=2.0)


def _checkpointed(directory: Path) -> set[str]:
    return {claim["uid"] for claim in json.loads((directory / "checkpoint.json").read_text())["claims"]}


# the last line of defense -----------------------------------------------------------------------------------
async def test_a_device_another_prepared_claim_holds_is_refused_for_that_claim(
    short_dir: Path, apiserver: ApiServer
) -> None:
    api = _api(apiserver)
    service = _service(short_dir, api)
    first = _put_claim(apiserver, "first", ["npu-1"])
    second = _put_claim(apiserver, "second", ["npu-2", "npu-1"])
    held = (await service.prepare([first]))[first.uid]
    assert isinstance(held, PreparedClaim)

    refused = (await service.prepare([second]))[second.uid]
    assert isinstance(refused, str)
    assert "npu-1 is in use" in refused and "default/first" in refused and first.uid in refused
    assert not (short_dir / "cdi" / f"{DRIVER}-claim-{second.uid}.json").exists()
    assert _checkpointed(short_dir) == {first.uid}
    assert (await service.prepare([first]))[first.uid] == held, "the holder is answered as before"

    assert (await service.unprepare([first])) == {first.uid: ""}
    again = (await service.prepare([second]))[second.uid]
    assert isinstance(again, PreparedClaim), again
    assert [d.device_name for d in again.devices] == ["npu-1", "npu-2"]
    await api.close()


async def test_of_two_claims_in_one_call_with_one_device_the_second_is_refused(
    short_dir: Path, apiserver: ApiServer
) -> None:
    api = _api(apiserver)
    service = _service(short_dir, api)
    first = _put_claim(apiserver, "first", ["npu-0"])
    second = _put_claim(apiserver, "second", ["npu-0"])
    other = _put_claim(apiserver, "other", ["npu-2"])
    answers = await service.prepare([first, second, other])
    assert isinstance(answers[first.uid], PreparedClaim) and isinstance(answers[other.uid], PreparedClaim)
    assert "npu-0 is in use" in str(answers[second.uid])
    assert _checkpointed(short_dir) == {first.uid, other.uid}
    await api.close()


async def test_a_vnpu_of_a_chip_another_claim_holds_whole_is_refused(
    short_dir: Path, apiserver: ApiServer
) -> None:
    api = _api(apiserver)
    service = _service(short_dir, api)
    whole = _put_claim(apiserver, "whole", ["npu-3"])
    part = _put_claim(apiserver, "part", ["npu-3-vnpu-130"])
    assert isinstance((await service.prepare([whole]))[whole.uid], PreparedClaim)
    refused = (await service.prepare([part]))[part.uid]
    assert "npu-3-vnpu-130 is in use" in str(refused) and "npu-3 (the same chip)" in str(refused)
    await api.close()


# two instances during a rolling update ----------------------------------------------------------------------
async def test_two_instances_act_on_what_the_other_wrote(short_dir: Path, apiserver: ApiServer) -> None:
    api = _api(apiserver)
    lock = short_dir / "serialize.lock"
    old, new = _service(short_dir, api, CallLock(lock)), _service(short_dir, api, CallLock(lock))
    claim = _put_claim(apiserver, "train", ["npu-1"])
    rival = _put_claim(apiserver, "rival", ["npu-1"])
    spec = short_dir / "cdi" / f"{DRIVER}-claim-{claim.uid}.json"

    prepared = (await old.prepare([claim]))[claim.uid]
    assert isinstance(prepared, PreparedClaim) and spec.exists()
    # The new instance knows the claim the old one prepared: the same answer, the device held.
    assert (await new.prepare([claim]))[claim.uid] == prepared
    assert "npu-1 is in use" in str((await new.prepare([rival]))[rival.uid])
    # Unprepared by the new instance: the spec the old one wrote is gone, and the old one knows it.
    assert (await new.unprepare([claim])) == {claim.uid: ""}
    assert not spec.exists() and _checkpointed(short_dir) == set()
    assert isinstance((await old.prepare([rival]))[rival.uid], PreparedClaim)
    assert _checkpointed(short_dir) == {rival.uid}
    await api.close()


async def test_a_call_waits_for_the_other_instance_and_gives_up_with_the_claims_error(
    short_dir: Path, apiserver: ApiServer
) -> None:
    api = _api(apiserver)
    lock = short_dir / "serialize.lock"
    service = _service(short_dir, api, CallLock(lock, timeout=0.2))
    claim = _put_claim(apiserver, "train", ["npu-1"])
    descriptor = os.open(lock, os.O_RDWR | os.O_CREAT, 0o600)
    try:
        fcntl.flock(descriptor, fcntl.LOCK_EX)  # the other instance, in the middle of a call
        refused = (await service.prepare([claim]))[claim.uid]
        assert isinstance(refused, str) and "another instance of the driver has held" in refused
        assert str(lock) in refused
        assert (await service.unprepare([claim]))[claim.uid].startswith("another instance")
        assert not (short_dir / "checkpoint.json").exists()
    finally:
        os.close(descriptor)
    assert isinstance((await service.prepare([claim]))[claim.uid], PreparedClaim)
    await api.close()


def test_the_pods_uid_names_its_sockets_and_the_shared_lock(short_dir: Path) -> None:
    settings = Settings(kubelet_dir=short_dir / "device-plugins", kubelet_api="dra")
    plugins, registry = short_dir / "plugins" / DRIVER, short_dir / "plugins_registry"
    alone = DraPaths.of(settings, pod="")
    assert (alone.socket, alone.registration, alone.lock) == (
        plugins / "dra.sock",
        registry / f"{DRIVER}-reg.sock",
        None,
    )
    pod = "6f1c0a52-1b7e-4c55-9d0e-2a4b8c9d7e10"
    mine = DraPaths.of(settings, pod=pod)
    assert (mine.socket, mine.registration, mine.lock) == (
        plugins / f"dra-{pod}.sock",
        registry / f"{DRIVER}-{pod}-reg.sock",
        plugins / "serialize.lock",
    )
    assert mine.checkpoint == alone.checkpoint, "one checkpoint for both pods"
    assert pod_uid({"POD_UID": pod}) == pod and pod_uid({}) == ""
    with pytest.raises(ConfigError, match=r"POD_UID '\.\./x' is not a Kubernetes UID"):
        pod_uid({"POD_UID": "../x"})


def test_the_doctor_outside_the_pod_checks_the_newest_pods_sockets(short_dir: Path) -> None:
    settings = Settings(kubelet_dir=short_dir / "device-plugins", kubelet_api="dra")
    registry = short_dir / "plugins_registry"
    registry.mkdir()
    older, newer = "0a1b2c3d-0000-4000-8000-000000000001", "0a1b2c3d-0000-4000-8000-000000000002"
    assert pod_paths(settings) == DraPaths.of(settings, pod=""), "nothing served: the plain names"
    for uid, seconds in ((older, 100), (newer, 200)):
        path = registry / f"{DRIVER}-{uid}-reg.sock"
        path.touch()
        os.utime(path, (seconds, seconds))
    (registry / f"{DRIVER}-NOT_A_UID-reg.sock").touch()
    (registry / f"{DRIVER}-x-{older}-reg.sock").touch()  # driver npu.huawei.com-x
    assert pod_paths(settings) == DraPaths.of(settings, pod=newer)


def test_the_sockets_a_killed_pod_left_are_removed_and_a_live_pods_kept(short_dir: Path) -> None:
    settings = Settings(kubelet_dir=short_dir / "device-plugins", kubelet_api="dra")
    mine, killed, alive = (f"0a1b2c3d-0000-4000-8000-00000000000{n}" for n in (1, 2, 3))
    paths = DraPaths.of(settings, pod=mine)
    paths.registration.parent.mkdir()
    paths.socket.parent.mkdir(parents=True)
    listening = []
    for uid, listens in ((mine, False), (killed, False), (alive, True)):
        for path in (
            paths.registration.with_name(f"{DRIVER}-{uid}-reg.sock"),
            paths.socket.with_name(f"dra-{uid}.sock"),
        ):
            server = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
            server.bind(str(path))  # closed without removing the file: what a killed process leaves
            if listens:
                server.listen()
                listening.append(server)
            else:
                server.close()
    other_driver = paths.registration.with_name(f"{DRIVER}-x-{killed}-reg.sock")  # driver npu.huawei.com-x
    with socket.socket(socket.AF_UNIX, socket.SOCK_STREAM) as server:
        server.bind(str(other_driver))
    try:
        assert remove_stale(paths, DRIVER) == [killed]
        left = sorted(p.name for p in (*paths.registration.parent.iterdir(), *paths.socket.parent.iterdir()))
        assert left == sorted(
            [
                other_driver.name,
                f"{DRIVER}-{mine}-reg.sock",
                f"{DRIVER}-{alive}-reg.sock",
                f"dra-{mine}.sock",
                f"dra-{alive}.sock",
            ]
        )
    finally:
        for server in listening:
            server.close()


async def test_a_device_name_of_200_kb_in_an_allocation_is_refused_in_one_bounded_line(
    short_dir: Path, apiserver: ApiServer
) -> None:
    """What the API server says a claim was allocated is echoed in the claim's error, the log and the
    kubelet's answer: a device name is a DNS label, and one that is not is named by its start and length."""
    api = _api(apiserver)
    service = _service(short_dir, api)
    claim = _put_claim(apiserver, "odd", ["npu-" + "9" * 200_000])
    refused = (await service.prepare([claim]))[claim.uid]
    assert refused == (
        f"ResourceClaim default/odd is allocated device 'npu-{'9' * 60}... (200004 characters)', which is no "
        "device name (a DNS label): check what wrote its allocation"
    )
    await api.close()


async def test_a_dynamic_chip_that_offers_nothing_says_why(short_dir: Path, apiserver: ApiServer) -> None:
    """A dynamic chip npu-smi gives no totals for offers nothing; a claim for one of its template devices is
    told that and why, not that the chip is no dynamic chip."""
    api = _api(apiserver)
    service = _service(short_dir, api)
    vir04 = Template("vir04", 4, 12, 4)
    offers = {phys: chip_offer(Carvable(phys, (vir04,), ())) for phys in (0, 1)}
    service.publish(CHIPS, lambda chips: ContainerSpec(), offers=offers)
    claim = _put_claim(apiserver, "carve", ["npu-1-vir04-0"])
    assert (await service.prepare([claim]))[claim.uid] == (
        "ResourceClaim default/carve: chip 1 is dynamic but offers nothing now (npu-1: npu-smi gives no AI "
        "core total): check npu-smi info -t info-vnpu on the node"
    )
    await api.close()

"""Admin-access claims and the claims' ``status.devices``, against a real file tree and the Kubernetes API
emulator: a claim with admin access prepares beside an exclusive one on the same device (and the reverse),
gets whole chips and holds nothing; each prepared claim's devices are written to its status with their
conditions and hardware, again when their health changes, and through API faults."""

from __future__ import annotations

import json
from collections.abc import AsyncIterator, Callable
from pathlib import Path
from typing import Any

import anyio
import kubernetes_validate
import pytest

from ascend_agent.backoff import Backoff
from ascend_agent.cluster.client import KubeApi
from ascend_agent.cluster.credentials import ClusterTarget
from ascend_agent.config import Settings
from ascend_agent.container import container_spec
from ascend_agent.doctor.dra import kubelet_checks
from ascend_agent.kubelet.dra.claimread import ClaimReader, ClaimRef
from ascend_agent.kubelet.dra.claims import Prepared, PreparedClaim, UnusableCheckpoint, parse_checkpoint
from ascend_agent.kubelet.dra.claimstatus import ClaimStatuses
from ascend_agent.kubelet.dra.paths import DraPaths
from ascend_agent.kubelet.dra.service import DraService
from ascend_agent.kubelet.holders import Holdings
from ascend_agent.kubelet.podresources import PodHolders
from ascend_agent.model import Chip, ContainerBase, ContainerSpec, Health, Inventory, VNpu
from tests.support.apiserver import ApiServer

DRIVER = "npu.huawei.com"
CHIPS = [Chip.make(i, "310P3") for i in range(3)]
VNPU = Chip.make(3, "310P3").slice(VNpu(130, "vir02"))


def _api(apiserver: ApiServer) -> KubeApi:
    return KubeApi.connect(ClusterTarget("kubeconfig", apiserver.kubeconfig), "node-1", timeout=2.0)


def _claim(apiserver: ApiServer, name: str, devices: list[str], admin: bool = False) -> ClaimRef:
    uid = apiserver.put_claim(name, devices, driver=DRIVER, pool="node-1", admin_access=admin)
    return ClaimRef("default", name, uid)


def _service(directory: Path, api: KubeApi, statuses: ClaimStatuses | None = None) -> DraService:
    prepared, _ = Prepared.open(directory / "checkpoint.json", directory / "cdi", DRIVER, "boot-1")
    reader = ClaimReader(lambda: api, DRIVER, "node-1")
    service = DraService(DRIVER, "node-1", prepared, reader, statuses=statuses)
    service.publish([*CHIPS, VNPU], lambda chips: container_spec(chips, ContainerBase()))
    return service


def _spec(directory: Path, claim: ClaimRef) -> dict[str, Any]:
    loaded: dict[str, Any] = json.loads((directory / "cdi" / f"{DRIVER}-claim-{claim.uid}.json").read_text())
    return loaded


def _nodes(spec: dict[str, Any]) -> list[str]:
    return [n["path"] for d in spec["devices"] for n in d["containerEdits"].get("deviceNodes", ())]


# admin access -----------------------------------------------------------------------------------------------
async def test_an_admin_claim_prepares_beside_an_exclusive_one_and_holds_nothing(
    short_dir: Path, apiserver: ApiServer
) -> None:
    api = _api(apiserver)
    service = _service(short_dir, api)
    exclusive = _claim(apiserver, "train", ["npu-1"])
    monitor = _claim(apiserver, "monitor", ["npu-0", "npu-1", "npu-2", "npu-3-vnpu-130"], admin=True)
    later = _claim(apiserver, "later", ["npu-0"])

    assert isinstance((await service.prepare([exclusive]))[exclusive.uid], PreparedClaim)
    watching = (await service.prepare([monitor]))[monitor.uid]
    assert isinstance(watching, PreparedClaim), watching
    assert all(d.admin_access for d in watching.devices)
    # Every device's chip whole: the vNPU's chip's own node, no vNPU node, nothing carved.
    assert sorted(_nodes(_spec(short_dir, monitor))) == [f"/dev/davinci{i}" for i in range(4)]
    # The admin claim holds nothing: an exclusive claim of one of its devices is prepared after it.
    assert isinstance((await service.prepare([later]))[later.uid], PreparedClaim)

    # Unprepared, the admin claim removes its own spec only; the exclusive claims keep theirs.
    assert await service.unprepare([monitor]) == {monitor.uid: ""}
    assert not (short_dir / "cdi" / f"{DRIVER}-claim-{monitor.uid}.json").exists()
    assert _nodes(_spec(short_dir, exclusive)) == ["/dev/davinci1"]
    assert _nodes(_spec(short_dir, later)) == ["/dev/davinci0"]

    # The flag is kept across a restart: still no holder.
    assert isinstance((await service.prepare([monitor]))[monitor.uid], PreparedClaim)
    again = _service(short_dir, api)
    second = _claim(apiserver, "second", ["npu-2"])
    assert isinstance((await again.prepare([second]))[second.uid], PreparedClaim)
    reloaded = again.prepared.get(monitor.uid)
    assert reloaded is not None and all(d.admin_access for d in reloaded.devices)
    await api.close()


async def test_an_exclusive_claim_is_still_refused_beside_another_exclusive_one(
    short_dir: Path, apiserver: ApiServer
) -> None:
    api = _api(apiserver)
    service = _service(short_dir, api)
    monitor = _claim(apiserver, "monitor", ["npu-2"], admin=True)
    first, second = _claim(apiserver, "first", ["npu-2"]), _claim(apiserver, "second", ["npu-2"])
    answers = await service.prepare([monitor, first, second])
    assert isinstance(answers[monitor.uid], PreparedClaim) and isinstance(answers[first.uid], PreparedClaim)
    assert "npu-2 is in use: ResourceClaim default/first" in str(answers[second.uid])
    await api.close()


async def test_what_prepared_claims_hold_is_held_for_the_hot_reset_and_the_vnpu_layout(
    short_dir: Path, apiserver: ApiServer
) -> None:
    """A claim holds its devices from its prepare: the hot reset and the vNPU layout read them through
    ``Holdings.held_devices`` (PodResources names a claim's devices by their DRA names, once its pod runs)."""
    api = _api(apiserver)
    service = _service(short_dir, api)
    train = _claim(apiserver, "train", ["npu-1", "npu-3-vnpu-130"])
    monitor = _claim(apiserver, "monitor", ["npu-2"], admin=True)
    assert service.held_device_ids() == frozenset()
    answers = await service.prepare([train, monitor])
    assert all(isinstance(answer, PreparedClaim) for answer in answers.values()), answers
    held = {CHIPS[1].device_id, VNPU.device_id, CHIPS[2].device_id}
    assert service.held_device_ids() == held

    pods = PodHolders(short_dir / "no-kubelet.sock", 5.0)
    holdings = Holdings(pods)
    holdings.claimed = service.held_device_ids
    assert holdings.held_devices() == held
    assert await service.unprepare([train, monitor]) == {train.uid: "", monitor.uid: ""}
    assert holdings.held_devices() == frozenset()
    await api.close()


async def test_an_admin_claim_on_a_split_chip_gets_the_chips_own_health(
    short_dir: Path, apiserver: ApiServer
) -> None:
    """One vNPU's own fault (its device node gone) is not the whole chip's an admin claim watches."""
    api = _api(apiserver)
    prepared, _ = Prepared.open(short_dir / "checkpoint.json", short_dir / "cdi", DRIVER, "boot-1")
    service = DraService(DRIVER, "node-1", prepared, ClaimReader(lambda: api, DRIVER, "node-1"))
    chip = Chip.make(1, "310P3")
    healthy = chip.slice(VNpu(116, "vir02"))
    gone = chip.slice(VNpu(117, "vir02")).with_health(
        Health.UNHEALTHY, "device node /dev/vdavinci117 is missing"
    )
    service.publish([healthy, gone], lambda chips: container_spec(chips, ContainerBase()), wholes=[chip])
    monitor = _claim(apiserver, "monitor", ["npu-1-vnpu-117"], admin=True)
    answer = (await service.prepare([monitor]))[monitor.uid]
    assert isinstance(answer, PreparedClaim), answer
    # what its status is written from: the chip as npu-smi reports it, Healthy
    assert service._devices_of(answer) == {"npu-1-vnpu-117": chip}
    await api.close()


@pytest.mark.parametrize("value", ["yes", 1, None, [True]])
def test_a_checkpoint_whose_admin_flag_is_not_a_boolean_is_unusable(short_dir: Path, value: object) -> None:
    device = {
        "request_names": ["npus"],
        "pool_name": "node-1",
        "device_name": "npu-0",
        "cdi_device_ids": [],
        "admin_access": value,
    }
    claim = {"uid": "a-1", "namespace": "default", "name": "c", "devices": [device]}
    document = json.dumps({"version": 2, "claims": [claim]}).encode()
    with pytest.raises(UnusableCheckpoint, match="admin_access is not a boolean"):
        parse_checkpoint(short_dir / "checkpoint.json", document)


async def test_the_doctor_does_not_fail_an_admin_claim_on_a_failing_chip(short_dir: Path) -> None:
    settings = Settings(kubelet_dir=short_dir / "device-plugins", kubelet_api="dra", cdi_spec_dir=short_dir)
    paths = DraPaths.of(settings)
    prepared = Prepared(paths.checkpoint, paths.cdi_dir, DRIVER, "boot-1")
    from ascend_agent.kubelet.dra.claims import PreparedDevice

    monitor = PreparedDevice(("all",), "node-1", "npu-1", (), admin_access=True)
    train = PreparedDevice(("npus",), "node-1", "npu-1", ())
    prepared.add([(PreparedClaim("u-1", "ops", "monitor", (monitor,)), {})])
    failing = Inventory(
        (CHIPS[0], Chip.make(1, "310P3", health=Health.UNHEALTHY, reason="npu-smi: Critical"))
    )

    async def check() -> tuple[bool | None, str]:
        (found,) = [c for c in await kubelet_checks(settings, failing) if c.check == "prepared claims"]
        return found.ok, found.detail

    assert await check() == (True, "1 prepared: ops/monitor (npu-1)")
    prepared.add([(PreparedClaim("u-2", "team", "train", (train,)), {})])
    ok, detail = await check()
    assert ok is False and "on Unhealthy chips: team/train on npu-1 (npu-smi: Critical)" in detail
    assert "ops/monitor on" not in detail


# status.devices ---------------------------------------------------------------------------------------------
def _statuses(api: KubeApi | None, clock: list[int]) -> ClaimStatuses:
    return ClaimStatuses(
        DRIVER,
        lambda: api,
        backoff=Backoff(0.01, 0.05, jitter=False),
        now=lambda: f"2026-12-04T10:00:{clock[0]:02d}Z",
    )


async def _wait(apiserver: ApiServer, name: str, ready: Callable[[list[dict[str, Any]]], bool]) -> Any:
    def devices() -> list[dict[str, Any]]:
        found = apiserver.get("resourceclaims", name, "default") or {}
        listed: list[dict[str, Any]] = (found.get("status") or {}).get("devices") or []
        return listed

    return await anyio.to_thread.run_sync(lambda: apiserver.wait_for(devices, ready))


def _conditions(entry: dict[str, Any]) -> dict[str, tuple[str, str, str, str]]:
    return {
        c["type"]: (c["status"], c["reason"], c["message"], c["lastTransitionTime"])
        for c in entry["conditions"]
    }


@pytest.fixture
async def running(apiserver: ApiServer) -> AsyncIterator[tuple[KubeApi, list[int]]]:
    api = _api(apiserver)
    yield api, [0]
    await api.close()


async def test_a_prepared_claim_gets_its_devices_status_and_health_changes_update_it(
    short_dir: Path, apiserver: ApiServer, running: tuple[KubeApi, list[int]]
) -> None:
    api, clock = running
    statuses = _statuses(api, clock)
    service = _service(short_dir, api, statuses)
    train = _claim(apiserver, "train", ["npu-1", "npu-3-vnpu-130"])
    monitor = _claim(apiserver, "monitor", ["npu-1"], admin=True)
    async with anyio.create_task_group() as tasks:
        tasks.start_soon(statuses.run)
        answers = await service.prepare([train, monitor])
        assert all(isinstance(a, PreparedClaim) for a in answers.values()), answers
        entries = await _wait(apiserver, "train", lambda found: len(found) == 2)
        claim = apiserver.get("resourceclaims", "train", "default")
        kubernetes_validate.validate(claim, "1.36", strict=True)
        chip, vnpu = entries
        assert (chip["driver"], chip["pool"], chip["device"]) == (DRIVER, "node-1", "npu-1")
        assert chip["data"] == {"model": "310P3", "physicId": 1}
        assert vnpu["data"] == {"model": "310P3", "physicId": 3, "vnpuId": 130, "template": "vir02"}
        assert _conditions(chip) == {
            "Ready": ("True", "Prepared", "the claim's CDI spec is written", "2026-12-04T10:00:00Z"),
            "Healthy": ("True", "Healthy", "", "2026-12-04T10:00:00Z"),
        }
        (watched,) = await _wait(apiserver, "monitor", lambda found: len(found) == 1)
        assert watched["data"] == {"model": "310P3", "physicId": 1, "adminAccess": True}
        with anyio.fail_after(10):
            while statuses.pending:
                await anyio.sleep(0.01)
        writes = statuses.writes
        assert writes == 2

        # The same chips again: nothing to write. Then npu-1 fails: both claims' npu-1 say so, and since when.
        service.publish([*CHIPS, VNPU], lambda chips: ContainerSpec())
        clock[0] = 30
        failing = Chip.make(1, "310P3", health=Health.UNHEALTHY, reason="npu-smi: Critical (80E3A203)")
        service.publish([CHIPS[0], failing, CHIPS[2], VNPU], lambda chips: ContainerSpec())
        entries = await _wait(
            apiserver, "train", lambda found: found[0]["conditions"][1]["status"] == "False"
        )
        assert _conditions(entries[0]) == {
            "Ready": ("True", "Prepared", "the claim's CDI spec is written", "2026-12-04T10:00:00Z"),
            "Healthy": ("False", "Unhealthy", "npu-smi: Critical (80E3A203)", "2026-12-04T10:00:30Z"),
        }
        assert _conditions(entries[1])["Healthy"][0] == "True", "the vNPU's chip is not the one that failed"
        (watched,) = await _wait(
            apiserver, "monitor", lambda found: found[0]["conditions"][1]["status"] == "False"
        )
        with anyio.fail_after(10):
            while statuses.pending:
                await anyio.sleep(0.01)
        assert statuses.writes == writes + 2, "one write per claim whose devices changed"

        # Unprepared: forgotten (the API server drops the entries with the allocation); npu-1 recovers and
        # only the claim still prepared is written.
        assert await service.unprepare([train]) == {train.uid: ""}
        patched = sum(s.verb == "patch" and s.name == "train" for s in apiserver.seen())
        service.publish([*CHIPS, VNPU], lambda chips: ContainerSpec())
        await _wait(apiserver, "monitor", lambda found: found[0]["conditions"][1]["status"] == "True")
        assert sum(s.verb == "patch" and s.name == "train" for s in apiserver.seen()) == patched
        tasks.cancel_scope.cancel()


async def test_status_writes_outlast_api_faults_and_a_deleted_claim_is_dropped(
    short_dir: Path, apiserver: ApiServer, running: tuple[KubeApi, list[int]]
) -> None:
    api, clock = running
    statuses = _statuses(api, clock)
    service = _service(short_dir, api, statuses)

    def patches(name: str) -> int:
        return sum(s.verb == "patch" and s.name == name for s in apiserver.seen())

    async def until(ready: Callable[[], bool]) -> None:
        with anyio.fail_after(10):
            while not ready():
                await anyio.sleep(0.01)

    async with anyio.create_task_group() as tasks:
        tasks.start_soon(statuses.run)
        # Deleted before its status is written (404): dropped, not retried.
        apiserver.fail(404, verb="patch", resource="resourceclaims")
        gone = _claim(apiserver, "gone", ["npu-2"])
        await service.prepare([gone])
        await until(lambda: not statuses.pending)
        assert statuses.writes == 0 and patches("gone") == 1
        apiserver.behave()

        # 500, then 403 (RBAC): kept and retried with back-off until the API server takes it.
        for fault in (500, 403):
            apiserver.fail(fault, verb="patch", resource="resourceclaims")
            claim = _claim(apiserver, f"got-{fault}", ["npu-0"])
            await service.prepare([claim])
            await until(lambda name=claim.name: patches(name) >= 2)
            assert claim.uid in statuses.pending, "a failed write stays pending"
            apiserver.behave()
            await _wait(apiserver, claim.name, lambda found: len(found) == 1)
            assert await service.unprepare([claim]) == {claim.uid: ""}
        assert patches("gone") == 1
        tasks.cancel_scope.cancel()


async def test_statuses_wait_for_the_client_and_an_invalid_status_is_logged_once(
    short_dir: Path, apiserver: ApiServer, caplog: pytest.LogCaptureFixture
) -> None:
    client = _api(apiserver)
    loaded: list[KubeApi] = []
    asked = [0]

    def api_of() -> KubeApi | None:
        asked[0] += 1
        return loaded[0] if loaded else None

    statuses = ClaimStatuses(DRIVER, api_of, backoff=Backoff(0.01, 0.02, jitter=False))
    service = _service(short_dir, client, statuses)
    train = _claim(apiserver, "train", ["npu-0"])
    async with anyio.create_task_group() as tasks:
        tasks.start_soon(statuses.run)
        await service.prepare([train])
        with anyio.fail_after(10):
            while asked[0] < 3:
                await anyio.sleep(0.01)
        assert statuses.pending == [train.uid], "no client yet: kept, and asked for again"
        apiserver.fail(422, verb="patch", resource="resourceclaims")
        loaded.append(client)
        with anyio.fail_after(10):
            while statuses.pending:
                await anyio.sleep(0.01)
        apiserver.behave()
        service.publish([*CHIPS, VNPU], lambda chips: ContainerSpec())  # nothing changed: not written again
        other = _claim(apiserver, "other", ["npu-1"])
        await service.prepare([other])
        await _wait(apiserver, "other", lambda found: len(found) == 1)
        assert sum(s.verb == "patch" and s.name == "train" for s in apiserver.seen()) == 1
        refused = [r.getMessage() for r in caplog.records if "refused" in r.getMessage()]
        assert len(refused) == 1 and refused[0].startswith(
            "Status of ResourceClaim default/train refused: 422"
        )
        tasks.cancel_scope.cancel()
    await client.close()

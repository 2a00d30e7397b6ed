"""The DRA driver's prepared claims against a real file tree and the Kubernetes API emulator: CDI specs
written again after a reboot, an unusable checkpoint kept aside, claim UIDs that would steer a path, and one
checkpoint write per call."""

from __future__ import annotations

import json
import logging
import os
import uuid
from dataclasses import replace
from pathlib import Path
from typing import Any

import anyio
import pytest
from hypothesis import given
from hypothesis import strategies as st

from ascend_agent.cluster.client import KubeApi
from ascend_agent.cluster.credentials import ClusterTarget
from ascend_agent.cluster.events import NodeEvents
from ascend_agent.cluster.side import ClusterSide
from ascend_agent.config import Settings
from ascend_agent.doctor.dra import kubelet_checks
from ascend_agent.kubelet.dra import CHECKPOINT_UNUSABLE, DraDriver
from ascend_agent.kubelet.dra import claims as claims_module
from ascend_agent.kubelet.dra.claimread import ClaimReader, ClaimRef
from ascend_agent.kubelet.dra.claims import (
    BOOT_ID,
    Prepared,
    PreparedClaim,
    PreparedDevice,
    UnusableCheckpoint,
    parse_checkpoint,
    read_boot_id,
    valid_uid,
)
from ascend_agent.kubelet.dra.paths import DraPaths
from ascend_agent.kubelet.dra.service import DraService
from ascend_agent.model import Chip, ContainerSpec
from tests.support.apiserver import ApiServer

DRIVER = "npu.huawei.com"
CHIPS = [Chip.make(i, "910B4") for i in range(4)]


def _put_claim(apiserver: ApiServer, name: str, devices: list[str]) -> ClaimRef:
    return ClaimRef("default", name, apiserver.put_claim(name, devices, driver=DRIVER, pool="node-1"))


def _service(prepared: Prepared, api: KubeApi | None) -> DraService:
    reader = ClaimReader(lambda: api, DRIVER, "node-1") if api is not None else None
    service = DraService(DRIVER, "node-1", prepared, reader)
    service.publish(CHIPS, lambda chips: ContainerSpec(envs={"ASCEND_VISIBLE_DEVICES": "x"}))
    return service


def _api(apiserver: ApiServer) -> KubeApi:
    return KubeApi.connect(ClusterTarget("kubeconfig", apiserver.kubeconfig), "node-1", timeout=2.0)


# a reboot: the CDI specs are on a tmpfs, the checkpoint is not ----------------------------------------------
async def test_a_claim_prepared_in_another_boot_is_written_again_before_it_is_answered(
    short_dir: Path, apiserver: ApiServer
) -> None:
    boot_id = short_dir / "boot_id"
    boot_id.write_text("boot-1\n")
    checkpoint, cdi = short_dir / "plugin" / "checkpoint.json", short_dir / "cdi"
    api = _api(apiserver)
    claim = _put_claim(apiserver, "train", ["npu-1", "npu-2"])
    prepared, _ = Prepared.open(checkpoint, cdi, DRIVER, read_boot_id(boot_id))
    first = (await _service(prepared, api).prepare([claim]))[claim.uid]
    assert isinstance(first, PreparedClaim) and first.boot_id == "boot-1"
    spec = cdi / f"{DRIVER}-claim-{claim.uid}.json"
    written = spec.read_text()

    # The node rebooted: a new boot id; a CDI directory that is not a tmpfs still holds the old spec, which
    # may no longer be right (here: emptied). The claim is not read again: the API server refuses.
    boot_id.write_text("boot-2\n")
    spec.write_text("{}")
    apiserver.fail(403, verb="get", resource="resourceclaims")
    prepared, _ = Prepared.open(checkpoint, cdi, DRIVER, read_boot_id(boot_id))
    service = _service(prepared, api)
    again = (await service.prepare([claim]))[claim.uid]
    assert again == replace(first, boot_id="boot-2")
    assert spec.read_text() == written
    assert Prepared.open(checkpoint, cdi, DRIVER, "boot-2")[0].get(claim.uid) == again

    # The same boot, the spec gone (the tmpfs emptied under a running agent): written again too.
    spec.unlink()
    assert (await service.prepare([claim]))[claim.uid] == again
    assert spec.read_text() == written

    # Before the chips are discovered, a claim whose spec is gone is an error the kubelet retries.
    spec.unlink()
    waiting = DraService(DRIVER, "node-1", prepared, None)
    assert (await waiting.prepare([claim]))[
        claim.uid
    ] == "the chips are not discovered yet; the kubelet retries"
    assert not spec.exists()
    await api.close()


def test_the_boot_id_is_the_kernels_and_its_path_can_be_given(short_dir: Path) -> None:
    settings = Settings(kubelet_dir=short_dir / "device-plugins", kubelet_api="dra", cdi_spec_dir=short_dir)
    assert DraPaths.of(settings).boot_id == BOOT_ID == Path("/proc/sys/kernel/random/boot_id")
    boot_id = short_dir / "boot_id"
    boot_id.write_text("6f1e0d5c-0000-4000-8000-000000000001\n")
    driver = DraDriver.open(settings, None, replace(DraPaths.of(settings), boot_id=boot_id))
    assert driver.service.prepared.boot_id == "6f1e0d5c-0000-4000-8000-000000000001"
    assert read_boot_id(short_dir / "missing") == ""


# a checkpoint that is not one -------------------------------------------------------------------------------
def _unusable(kind: str, checkpoint: Path) -> None:
    if kind == "truncated":
        checkpoint.write_text('{"version": 2, "claims": [{"uid": "u1", "namesp')
    elif kind == "foreign":
        checkpoint.write_text('{"apiVersion": "v1", "kind": "ConfigMap"}')
    elif kind == "not utf-8":
        checkpoint.write_bytes(b'{"version": 2, "claims": ["\xff\xfe"]}')
    elif kind == "link to /dev/zero":
        checkpoint.symlink_to("/dev/zero")
    elif kind == "device":
        os.mknod(checkpoint, 0o600 | 0o020000, os.makedev(1, 5))  # a character device, as /dev/zero
    elif kind == "over 16 MiB":
        with checkpoint.open("wb") as stream:
            stream.truncate(16 * 1024 * 1024 + 1)
    else:
        raise AssertionError(kind)


@pytest.mark.parametrize(
    "kind", ["truncated", "foreign", "not utf-8", "link to /dev/zero", "device", "over 16 MiB"]
)
def test_an_unusable_checkpoint_is_kept_aside_and_the_driver_starts_empty(
    short_dir: Path, kind: str, caplog: pytest.LogCaptureFixture
) -> None:
    if kind == "device" and os.geteuid() != 0:
        pytest.skip("making a device node needs root")
    settings = Settings(kubelet_dir=short_dir / "device-plugins", kubelet_api="dra", cdi_spec_dir=short_dir)
    checkpoint = DraPaths.of(settings).checkpoint
    checkpoint.parent.mkdir(parents=True)
    _unusable(kind, checkpoint)
    with caplog.at_level(logging.INFO, logger="ascend_agent"):
        driver = DraDriver.open(settings, None)
    assert len(driver.service.prepared) == 0
    (kept,) = checkpoint.parent.glob("checkpoint.json.unusable-*")
    assert not os.path.lexists(checkpoint)
    if kind == "link to /dev/zero":
        assert os.readlink(kept) == "/dev/zero", "the link itself is kept, its target untouched"
    (line,) = [r.getMessage() for r in caplog.records if "checkpoint" in r.getMessage()]
    assert "\n" not in line
    assert line.startswith(f"DRA driver {DRIVER}: {checkpoint} ")
    assert f"kept as {kept.name}, starting with no prepared claims" in line


async def test_a_checkpoint_kept_aside_is_an_event_once_the_cluster_side_is_up(
    short_dir: Path, apiserver: ApiServer
) -> None:
    apiserver.put("nodes", {"metadata": {"name": "node-1"}})
    settings = Settings(kubelet_dir=short_dir / "device-plugins", kubelet_api="dra", cdi_spec_dir=short_dir)
    checkpoint = DraPaths.of(settings).checkpoint
    checkpoint.parent.mkdir(parents=True)
    checkpoint.write_text("[]")
    side = ClusterSide(ClusterTarget("kubeconfig", apiserver.kubeconfig), "node-1", lambda: [NodeEvents()])
    DraDriver.open(settings, side)  # before the side has loaded: the Event waits for it

    def events() -> list[dict[str, Any]]:
        return [e for e in apiserver.list("events", "default") if e["reason"] == CHECKPOINT_UNUSABLE]

    async with anyio.create_task_group() as tasks:
        tasks.start_soon(side.run)
        (event,) = await anyio.to_thread.run_sync(
            lambda: apiserver.wait_for(events, lambda found: len(found) == 1, timeout=10)
        )
        tasks.cancel_scope.cancel()
    assert event["type"] == "Warning"
    assert event["involvedObject"]["kind"] == "Node" and event["involvedObject"]["name"] == "node-1"
    assert event["message"].startswith(f"{checkpoint} is not a checkpoint of prepared claims")
    assert "starting with no prepared claims" in event["message"]


@given(st.binary(max_size=256))
def test_any_bytes_are_claims_or_an_unusable_checkpoint(data: bytes) -> None:
    try:
        claims = parse_checkpoint(Path("checkpoint.json"), data)
    except UnusableCheckpoint as exc:
        assert "\n" not in str(exc)
    else:
        assert all(isinstance(claim, PreparedClaim) for claim in claims)


_JSON = st.recursive(
    st.none() | st.booleans() | st.integers() | st.text(max_size=8),
    lambda inner: st.lists(inner, max_size=3) | st.dictionaries(st.text(max_size=8), inner, max_size=3),
    max_leaves=12,
)
_CLAIM = st.fixed_dictionaries(
    {"uid": st.sampled_from(["u1", "../x", "", 5]), "namespace": _JSON, "name": _JSON, "devices": _JSON},
    optional={"boot_id": _JSON, "spec_path": _JSON},
)


@given(
    st.fixed_dictionaries({"version": st.sampled_from([1, 2, "2", None]), "claims": st.lists(_CLAIM | _JSON)})
)
def test_any_json_is_claims_or_an_unusable_checkpoint(document: dict[str, Any]) -> None:
    try:
        claims = parse_checkpoint(Path("checkpoint.json"), json.dumps(document).encode())
    except UnusableCheckpoint:
        return
    assert all(valid_uid(claim.uid) for claim in claims)


# a claim UID that would steer a path ------------------------------------------------------------------------
async def test_a_uid_that_is_no_uid_fails_its_claim_and_writes_nothing_outside(
    short_dir: Path, apiserver: ApiServer
) -> None:
    cdi = short_dir / "run" / "cdi"
    api = _api(apiserver)
    good = _put_claim(apiserver, "good", ["npu-0"])
    service = _service(Prepared(short_dir / "plugin" / "checkpoint.json", cdi, DRIVER), api)
    bad = [
        ClaimRef("default", "escape", "../../../x"),
        ClaimRef("default", "nul", "ab\x00cd"),
        ClaimRef("default\x00", "good", good.uid),
        ClaimRef("default", "good\x00", good.uid),
        ClaimRef("default", "long", "a" * 64),
        ClaimRef("default", "upper", "ABC"),
    ]
    answers = await service.prepare([*bad[:2], good, *bad[4:]])
    assert isinstance(answers[good.uid], PreparedClaim)
    for claim in (*bad[:2], *bad[4:]):
        assert "is not a Kubernetes UID" in str(answers[claim.uid]), answers[claim.uid]
    assert sorted(p.name for p in cdi.iterdir()) == [f"{DRIVER}-claim-{good.uid}.json"]
    assert not (short_dir / "x.json").exists()
    for claim in bad[2:4]:
        (answer,) = (await service.prepare([claim])).values()
        assert "is not a Kubernetes" in str(answer)
    # Nothing was ever written for a UID that is no UID: unpreparing it is success (a kubelet retries an
    # error for good), and it removes nothing.
    unknown = {claim.uid: "" for claim in (*bad[:2], *bad[4:])}
    assert (await service.unprepare([*bad[:2], *bad[4:]])) == unknown
    assert sorted(p.name for p in cdi.iterdir()) == [f"{DRIVER}-claim-{good.uid}.json"]
    assert (await service.unprepare([bad[1], good])) == {"ab\x00cd": "", good.uid: ""}
    assert list(cdi.iterdir()) == []
    await api.close()


def test_unprepare_never_removes_a_path_the_checkpoint_names(short_dir: Path) -> None:
    victim = short_dir / "victim"
    victim.write_text("keep me")
    checkpoint, cdi = short_dir / "plugin" / "checkpoint.json", short_dir / "cdi"
    checkpoint.parent.mkdir()
    uid = str(uuid.uuid4())
    checkpoint.write_text(
        json.dumps(
            {
                "version": 1,
                "claims": [
                    {"uid": uid, "namespace": "d", "name": "n", "devices": [], "spec_path": str(victim)}
                ],
            }
        )
    )
    prepared, aside = Prepared.open(checkpoint, cdi, DRIVER, "")
    assert aside is None
    assert prepared.remove([uid]) == {uid: None}
    assert victim.read_text() == "keep me"

    checkpoint.write_text(
        json.dumps(
            {"version": 2, "claims": [{"uid": "../victim", "namespace": "d", "name": "n", "devices": []}]}
        )
    )
    prepared, aside = Prepared.open(checkpoint, cdi, DRIVER, "")
    assert aside is not None and "is not a Kubernetes UID" in aside.reason
    assert len(prepared) == 0 and victim.exists()


# the checkpoint written once per call -----------------------------------------------------------------------
async def test_a_call_writes_the_checkpoint_once(
    short_dir: Path, apiserver: ApiServer, monkeypatch: pytest.MonkeyPatch
) -> None:
    checkpoint = short_dir / "plugin" / "checkpoint.json"
    writes: list[Path] = []
    real = claims_module.replace_file

    def counting(path: Path, text: str, *args: Any, **kwargs: Any) -> None:
        writes.append(path)
        real(path, text, *args, **kwargs)

    monkeypatch.setattr(claims_module, "replace_file", counting)
    api = _api(apiserver)
    service = _service(Prepared(checkpoint, short_dir / "cdi", DRIVER), api)
    claims = [_put_claim(apiserver, f"c{i}", [f"npu-{i}"]) for i in range(4)]
    answers = await service.prepare(claims)
    assert all(isinstance(answer, PreparedClaim) for answer in answers.values())
    assert writes.count(checkpoint) == 1
    assert len(writes) == 5, "a spec per claim, then the checkpoint"
    writes.clear()
    assert set((await service.unprepare(claims)).values()) == {""}
    assert writes.count(checkpoint) == 1
    await api.close()


# the doctor -------------------------------------------------------------------------------------------------
async def test_the_doctor_fails_a_prepared_claim_whose_spec_is_gone(short_dir: Path) -> None:
    settings = Settings(
        kubelet_dir=short_dir / "device-plugins", kubelet_api="dra", cdi_spec_dir=short_dir / "cdi"
    )
    paths = DraPaths.of(settings)
    prepared = Prepared(paths.checkpoint, paths.cdi_dir, DRIVER, "boot-1")
    claims = [
        PreparedClaim(str(uuid.uuid4()), "default", name, (PreparedDevice(("npus",), "node-1", device, ()),))
        for name, device in (("kept", "npu-0"), ("lost", "npu-1"))
    ]
    prepared.add([(claim, {}) for claim in claims])

    async def check() -> Any:
        (found,) = [c for c in await kubelet_checks(settings, None) if c.check == "prepared claims"]
        return found

    assert (await check()).ok is True
    lost = paths.cdi_dir / f"{DRIVER}-claim-{claims[1].uid}.json"
    lost.unlink()
    found = await check()
    assert found.ok is False
    assert found.detail.endswith(f"CDI spec missing: default/lost ({lost})")
    assert "writes a claim's spec again when the kubelet prepares it" in found.hint

    paths.checkpoint.unlink()
    paths.checkpoint.symlink_to("/dev/zero")
    with anyio.fail_after(10):
        found = await check()
    assert (found.ok, found.detail) == (
        False,
        f"{paths.checkpoint} is a symbolic link, not a checkpoint of prepared claims",
    )

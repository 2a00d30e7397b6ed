"""The agent as a DRA driver end to end: the agent as a process on the fake backend, the DRA kubelet stand-in
on its sockets, and the Kubernetes API emulator holding the Node, the ResourceClaims and the slices."""

from __future__ import annotations

import contextlib
import fcntl
import json
import os
import signal
import uuid
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import anyio
import kubernetes_validate
import pytest
import yaml

from ascend_agent._proto.dra.k8s.io.kubelet.pkg.apis.dra import v1 as dra_v1
from ascend_agent._proto.dra.k8s.io.kubelet.pkg.apis.dra import v1beta1 as dra_v1beta1
from tests.support.agent_process import AgentProcess
from tests.support.apiserver import ApiServer
from tests.support.cli import run_cli
from tests.support.dra_kubelet import DraKubelet

NODE = "node-1"
DRIVER = "npu.huawei.com"
KUBERNETES = "1.36"


class _Host:
    def __init__(self, directory: Path, apiserver: ApiServer) -> None:
        self.directory = directory
        self.kubelet_dir = directory / "kubelet" / "device-plugins"
        self.registry = directory / "kubelet" / "plugins_registry"
        for kubelets_own in (self.registry, directory / "kubelet" / "plugins"):  # as a kubelet makes them
            kubelets_own.mkdir(parents=True)
        self.cdi = directory / "cdi"
        self.state = directory / "state.json"
        self.state.write_text("{}")
        self.apiserver = apiserver
        self.agents: list[AgentProcess] = []

    def start(self, *extra: str, env: dict[str, str] | None = None) -> AgentProcess:
        agent = AgentProcess(
            [
                "run",
                "--backend=fake",
                "--fake-chips=4",
                "--fake-model=910B3",
                f"--fake-state={self.state}",
                f"--kubelet-dir={self.kubelet_dir}",
                f"--cdi-spec-dir={self.cdi}",
                "--metrics-address=",
                f"--kubeconfig={self.apiserver.kubeconfig}",
                f"--node-name={NODE}",
                "--kubelet-api=dra",
                *extra,
            ],
            env,
        )
        self.agents.append(agent)
        return agent

    def cli_config(self, **more: Any) -> Path:
        """A config file for ``list`` and the doctor: this host's fake chips and directories, and ``more``."""
        config = self.directory / "doctor.yaml"
        settings = {
            "backend": "fake", "fakeChips": 4, "fakeModel": "910B3", "fakeState": str(self.state),
            "kubeletDir": str(self.kubelet_dir), "cdiSpecDir": str(self.cdi), "metricsAddress": "", **more,
        }  # fmt: skip
        config.write_text(yaml.safe_dump(settings))
        return config

    def faults(self, unhealthy: list[int]) -> None:
        temporary = self.state.with_name(".state.tmp")
        temporary.write_text(json.dumps({"unhealthy": unhealthy}))
        os.replace(temporary, self.state)


def dra_host(short_dir: Path, apiserver: ApiServer) -> Iterator[_Host]:
    """The DRA tests' ``host``: the node in the API server; every agent started is closed at the end."""
    apiserver.put("nodes", {"metadata": {"name": NODE, "uid": "node-uid-1"}})
    made = _Host(short_dir, apiserver)
    yield made
    for agent in made.agents:
        agent.close()


host = pytest.fixture(dra_host, name="host")


def _claim(apiserver: ApiServer, name: str, devices: list[str], pool: str = NODE) -> str:
    return apiserver.put_claim(name, devices, driver=DRIVER, pool=pool)


async def _prepared(
    host: _Host, apiserver: ApiServer, devices: list[str]
) -> tuple[AgentProcess, DraKubelet, dra_v1.Claim, dra_v1.NodePrepareResourceResponse]:
    """The agent started and registered, and a claim ``train`` of ``devices`` prepared: the agent, the
    kubelet, the claim and its answer."""
    agent = host.start()
    kubelet = DraKubelet(host.registry)
    await kubelet.register(DRIVER)
    apiserver.wait_for(lambda: _slices(apiserver), lambda found: len(found) == 1)
    uid = _claim(apiserver, "train", devices)
    claim = dra_v1.Claim(namespace="default", uid=uid, name="train")
    return agent, kubelet, claim, (await kubelet.prepare([claim])).claims[uid]


def _stop(agent: AgentProcess) -> None:
    agent.proc.send_signal(signal.SIGTERM)
    assert agent.proc.wait(10) == 0, agent.output


def _slices(apiserver: ApiServer) -> list[dict[str, Any]]:
    return [s for s in apiserver.list("resourceslices") if s["spec"]["nodeName"] == NODE]


def _devices(apiserver: ApiServer) -> dict[str, dict[str, Any]]:
    return {d["name"]: d for s in _slices(apiserver) for d in s["spec"]["devices"]}


async def test_registers_publishes_prepares_and_reports_health(host: _Host, apiserver: ApiServer) -> None:
    host.start("--health-interval=3600")  # what health changes below, the state file's change did
    kubelet = DraKubelet(host.registry)
    info = await kubelet.register(DRIVER)
    assert (info.type, info.name) == ("DRAPlugin", DRIVER)
    assert list(info.supported_versions) == [
        "v1.DRAPlugin",
        "v1beta1.DRAPlugin",
        "v1.DRAResourceHealth",
        "v1alpha1.DRAResourceHealth",
    ]
    assert info.endpoint == str(host.directory / "kubelet" / "plugins" / DRIVER / "dra.sock")

    # The slice: one pool named after the node, a device per chip, valid for resource.k8s.io/v1.
    slices = apiserver.wait_for(lambda: _slices(apiserver), lambda found: len(found) == 1)
    kubernetes_validate.validate(slices[0], KUBERNETES, strict=True)
    spec = slices[0]["spec"]
    assert (
        spec["driver"] == DRIVER and spec["pool"]["name"] == NODE and spec["pool"]["resourceSliceCount"] == 1
    )
    assert [d["name"] for d in spec["devices"]] == ["npu-0", "npu-1", "npu-2", "npu-3"]
    npu1 = spec["devices"][1]
    assert npu1["attributes"]["deviceType"] == {"string": "Ascend910B3"}
    assert npu1["attributes"]["physicId"] == {"int": 1}
    assert npu1["attributes"]["numaNode"] == {"int": 0}
    assert npu1["capacity"] == {"memory": {"value": "64Gi"}}
    assert "taints" not in npu1

    # A claim with two chips, and one whose UID is not the one the kubelet asks for, in one call.
    uid = _claim(apiserver, "train", ["npu-0", "npu-1"])
    _claim(apiserver, "stale", ["npu-2"])
    claims = [
        dra_v1.Claim(namespace="default", uid=uid, name="train"),
        dra_v1.Claim(namespace="default", uid="not-its-uid", name="stale"),
    ]
    answer = await kubelet.prepare(claims)
    prepared = answer.claims[uid]
    assert prepared.error == ""
    assert [(d.pool_name, d.device_name, list(d.request_names)) for d in prepared.devices] == [
        (NODE, "npu-0", ["npus"]),
        (NODE, "npu-1", ["npus"]),
    ]
    cdi_ids = [id_ for d in prepared.devices for id_ in d.cdi_device_ids]
    assert cdi_ids == [f"{DRIVER}/claim={uid}-npu-0", f"{DRIVER}/claim={uid}-npu-1"]
    assert "UID" in answer.claims["not-its-uid"].error and not answer.claims["not-its-uid"].devices
    spec_file = host.cdi / f"{DRIVER}-claim-{uid}.json"
    cdi = json.loads(spec_file.read_text())
    assert cdi["kind"] == f"{DRIVER}/claim"
    assert [d["name"] for d in cdi["devices"]] == [f"{uid}-npu-0", f"{uid}-npu-1"]
    nodes = [n["path"] for d in cdi["devices"] for n in d["containerEdits"]["deviceNodes"]]
    assert nodes == ["/dev/davinci0", "/dev/davinci1"]
    assert "ASCEND_VISIBLE_DEVICES=0,1" in cdi["containerEdits"]["env"]
    assert "/dev/davinci_manager" in [n["path"] for n in cdi["containerEdits"]["deviceNodes"]]

    # Retried, in v1 and v1beta1: the same answer, the claim not read again.
    reads = len([s for s in apiserver.seen() if s.resource == "resourceclaims" and s.verb == "get"])
    assert (await kubelet.prepare(claims[:1])).claims[uid] == prepared
    beta = (
        await kubelet.prepare_v1beta1([dra_v1beta1.Claim(namespace="default", uid=uid, name="train")])
    ).claims
    assert [list(d.cdi_device_ids) for d in beta[uid].devices] == [
        list(d.cdi_device_ids) for d in prepared.devices
    ]
    assert len([s for s in apiserver.seen() if s.resource == "resourceclaims" and s.verb == "get"]) == reads

    # Health: a chip going Unhealthy is a taint in the slice and UNHEALTHY on the stream a released kubelet
    # opens (v1alpha1); both clear. Seen at once, not at the next health query an hour away.
    async with kubelet.watching() as updates:
        await updates.wait_for(lambda seen: seen.get("npu-1", ("",))[0] == "HEALTHY", "npu-1 HEALTHY")
        host.faults([1])
        await updates.wait_for(lambda seen: seen["npu-1"][0] == "UNHEALTHY", "npu-1 UNHEALTHY")
        tainted = apiserver.wait_for(lambda: _devices(apiserver)["npu-1"], lambda d: "taints" in d)
        assert tainted["taints"][0]["key"] == f"{DRIVER}/unhealthy"
        assert tainted["taints"][0]["effect"] == "NoSchedule"
        kubernetes_validate.validate(_slices(apiserver)[0], KUBERNETES, strict=True)
        host.faults([])
        await updates.wait_for(lambda seen: seen["npu-1"][0] == "HEALTHY", "npu-1 HEALTHY again")
        apiserver.wait_for(lambda: _devices(apiserver)["npu-1"], lambda d: "taints" not in d)
    generations = {s["spec"]["pool"]["generation"] for s in _slices(apiserver)}
    assert generations == {3}, "one generation per change: published, tainted, cleared"

    # Unprepared: the spec is gone; an unknown claim is success.
    done = await kubelet.unprepare([claims[0], dra_v1.Claim(namespace="default", uid="never", name="x")])
    assert {k: v.error for k, v in done.claims.items()} == {uid: "", "never": ""}
    assert not spec_file.exists()


async def test_vnpus_are_devices_of_their_own_and_their_chip_is_not(
    host: _Host, apiserver: ApiServer
) -> None:
    host.start("--fake-model=310P3", "--fake-vnpus=0:vir02,0:vir04", "--health-interval=3600")
    kubelet = DraKubelet(host.registry)
    await kubelet.register(DRIVER)
    slices = apiserver.wait_for(lambda: _slices(apiserver), lambda found: len(found) == 1)
    kubernetes_validate.validate(slices[0], KUBERNETES, strict=True)
    devices = {d["name"]: d for d in slices[0]["spec"]["devices"]}
    assert list(devices) == ["npu-0-vnpu-100", "npu-0-vnpu-101", "npu-1", "npu-2", "npu-3"]
    vnpu = devices["npu-0-vnpu-101"]
    assert vnpu["attributes"]["deviceType"] == {"string": "Ascend310P-4c"}
    assert vnpu["attributes"]["template"] == {"string": "vir04"}
    assert vnpu["attributes"]["parent"] == {"string": "npu-0"}
    assert (vnpu["attributes"]["physicId"], vnpu["attributes"]["vnpuId"]) == ({"int": 0}, {"int": 101})
    assert vnpu["capacity"]["aiCores"] == {"value": "4"}

    uid = _claim(apiserver, "infer", ["npu-0-vnpu-101"])
    claim = dra_v1.Claim(namespace="default", uid=uid, name="infer")
    prepared = (await kubelet.prepare([claim])).claims[uid]
    assert prepared.error == ""
    assert [list(d.cdi_device_ids) for d in prepared.devices] == [[f"{DRIVER}/claim={uid}-npu-0-vnpu-101"]]
    cdi = json.loads((host.cdi / f"{DRIVER}-claim-{uid}.json").read_text())
    (device,) = cdi["devices"]
    assert device["containerEdits"]["deviceNodes"] == [
        {"path": "/dev/davinci101", "permissions": "rw", "hostPath": "/dev/vdavinci101"}
    ]
    env = cdi["containerEdits"]["env"]
    assert "ASCEND_VISIBLE_DEVICES=101" in env and "ASCEND_RUNTIME_OPTIONS=VIRTUAL" in env

    # The vNPUs follow their chip's health, on the stream (v1, as a kubelet that knows it opens it) and as
    # taints.
    async with kubelet.watching("v1") as updates:
        await updates.wait_for(
            lambda seen: seen.get("npu-0-vnpu-101", ("",))[0] == "HEALTHY", "npu-0-vnpu-101 HEALTHY"
        )
        assert "npu-0" not in updates.seen[-1]
        host.faults([0])
        await updates.wait_for(
            lambda seen: seen["npu-0-vnpu-101"][0] == "UNHEALTHY", "npu-0-vnpu-101 UNHEALTHY"
        )
        apiserver.wait_for(lambda: _devices(apiserver)["npu-0-vnpu-100"], lambda d: "taints" in d)


async def test_a_restart_keeps_the_slices_and_unprepares_what_was_written(
    host: _Host, apiserver: ApiServer
) -> None:
    agent, kubelet, claim, first = await _prepared(host, apiserver, ["npu-2", "npu-3"])
    uid = claim.uid
    spec_file = host.cdi / f"{DRIVER}-claim-{uid}.json"
    assert spec_file.exists()

    _stop(agent)
    assert not (host.registry / f"{DRIVER}-reg.sock").exists()
    assert len(_slices(apiserver)) == 1, "an ordinary restart leaves the slices"
    host.start()
    await kubelet.register(DRIVER)
    assert (await kubelet.prepare([claim])).claims[uid] == first
    assert (await kubelet.unprepare([claim])).claims[uid].error == ""
    assert not spec_file.exists()
    assert not [s for s in apiserver.seen() if s.verb == "delete" and s.resource == "resourceslices"]


async def test_a_kubelet_that_starts_again_gets_the_slices_back_when_it_registers_the_driver(
    host: _Host, apiserver: ApiServer
) -> None:
    """A starting kubelet deletes every slice of its node, then registers the driver again: its registration
    alone (no watch of the slices delivers here) has them written again, long before the 300 s refresh."""
    apiserver.fail("hang", verb="watch", resource="resourceslices")
    try:
        host.start()
        kubelet = DraKubelet(host.registry)
        await kubelet.register(DRIVER)
        (first,) = apiserver.wait_for(lambda: _slices(apiserver), lambda found: len(found) == 1)
        apiserver.delete("resourceslices", first["metadata"]["name"])
        await kubelet.register(DRIVER)  # the kubelet started again
        (again,) = apiserver.wait_for(lambda: _slices(apiserver), lambda found: len(found) == 1, timeout=10.0)
    finally:
        apiserver.behave()
    assert again["spec"]["devices"] == first["spec"]["devices"]


async def test_dra_cleanup_removes_the_slices_on_exit(host: _Host, apiserver: ApiServer) -> None:
    agent = host.start("--dra-cleanup", "--dra-taint-effect=NoExecute")
    await DraKubelet(host.registry).register(DRIVER)
    apiserver.wait_for(lambda: _slices(apiserver), lambda found: len(found) == 1)
    _stop(agent)
    assert _slices(apiserver) == []


def test_dra_mode_without_the_kubernetes_api_stops_with_one_line(host: _Host) -> None:
    agent = host.start("--no-cluster")
    assert agent.proc.wait(10) == 2
    assert "--kubelet-api dra needs the Kubernetes API" in agent.output
    assert "Traceback" not in agent.output


async def test_a_claim_read_once_is_prepared_while_the_api_server_hangs(
    host: _Host, apiserver: ApiServer
) -> None:
    _, kubelet, claim, first = await _prepared(host, apiserver, ["npu-0", "npu-1"])
    uid = claim.uid
    assert (await kubelet.unprepare([claim])).claims[uid].error == ""

    apiserver.fail(403, verb="get", resource="resourceclaims")
    other = _claim(apiserver, "other", ["npu-2"])
    refused = await kubelet.prepare([dra_v1.Claim(namespace="default", uid=other, name="other")])
    assert "403" in refused.claims[other].error and "resourceclaims" in refused.claims[other].error

    apiserver.fail("hang")
    try:
        again = await kubelet.prepare([claim], timeout=5.0)
        assert again.claims[uid] == first
        assert (host.cdi / f"{DRIVER}-claim-{uid}.json").exists()
    finally:
        apiserver.behave()


async def test_the_doctor_checks_the_dra_driver_not_the_device_plugin(
    host: _Host, apiserver: ApiServer
) -> None:
    host.start()
    kubelet = DraKubelet(host.registry)
    await kubelet.register(DRIVER)
    apiserver.wait_for(lambda: _slices(apiserver), lambda found: len(found) == 1)
    uid = _claim(apiserver, "train", ["npu-2", "npu-3"])
    await kubelet.prepare([dra_v1.Claim(namespace="default", uid=uid, name="train")])
    host.faults([3])
    apiserver.wait_for(lambda: _devices(apiserver), lambda found: bool(found["npu-3"].get("taints")))
    config = host.cli_config()
    result = await anyio.to_thread.run_sync(
        lambda: run_cli(
            "doctor",
            "--json",
            "--config",
            str(config),
            "--kubelet-api=dra",
            f"--kubeconfig={apiserver.kubeconfig}",
            f"--node-name={NODE}",
            timeout=60,
        )
    )
    assert "Traceback" not in result.stderr, result.stderr
    checks = {check["check"]: check for check in json.loads(result.stdout)}
    for skipped in ("kubelet socket", "plugin socket", "node capacity"):
        assert checks[skipped]["ok"] is None and "DRA" in checks[skipped]["detail"], checks[skipped]
    registration = checks["DRA registration socket"]
    assert registration["ok"] is True, registration
    assert (
        f"DRAPlugin {DRIVER}, endpoint {host.directory}/kubelet/plugins/{DRIVER}/dra.sock"
        in registration["detail"]
    )
    assert checks["DRA plugin socket"]["ok"] is True, checks["DRA plugin socket"]
    claims = checks["prepared claims"]
    assert claims["ok"] is False
    assert claims["detail"].startswith(
        "1 prepared: default/train (npu-2, npu-3); on Unhealthy chips: default/train on npu-3"
    )
    slices = checks["resource slices"]
    assert slices["ok"] is True, slices
    assert slices["detail"].startswith("1 slice, 4 chip devices; tainted: npu-3 (")
    assert slices["detail"].endswith(", for 4 chips")
    assert checks["daemonset"]["detail"] == "no DaemonSet ascend-dra-driver in kube-system"
    assert checks["daemonset"]["hint"] == "kubectl apply -f examples/dra/daemonset.yaml"


async def test_a_reboot_that_emptied_the_cdi_directory_writes_the_specs_again(
    host: _Host, apiserver: ApiServer
) -> None:
    agent, kubelet, claim, first = await _prepared(host, apiserver, ["npu-2", "npu-3"])
    uid = claim.uid
    spec_file = host.cdi / f"{DRIVER}-claim-{uid}.json"
    written = spec_file.read_text()

    _stop(agent)
    spec_file.unlink()  # /var/run/cdi is a tmpfs: a reboot empties it, the checkpoint stays
    host.start()
    await kubelet.register(DRIVER)
    assert (await kubelet.prepare([claim])).claims[uid] == first
    assert spec_file.read_text() == written, "the CDI devices answered exist"


def _checkpoint(host: _Host) -> Path:
    return host.directory / "kubelet" / "plugins" / DRIVER / "checkpoint.json"


@pytest.mark.parametrize("kind", ["truncated", "link to /dev/zero"])
async def test_an_unusable_checkpoint_is_kept_aside_and_claims_are_prepared_again(
    host: _Host, apiserver: ApiServer, kind: str
) -> None:
    checkpoint = _checkpoint(host)
    checkpoint.parent.mkdir()
    if kind == "truncated":
        checkpoint.write_text('{"version": 1, "claims": [{"uid": "0b6c')
    else:
        checkpoint.symlink_to("/dev/zero")
    agent = host.start()
    kubelet = DraKubelet(host.registry)
    await kubelet.register(DRIVER)
    (line,) = agent.wait_log("kept as checkpoint.json.unusable-")
    assert "starting with no prepared claims" in line
    (kept,) = checkpoint.parent.glob("checkpoint.json.unusable-*")
    events = apiserver.wait_for(
        lambda: [e for e in apiserver.list("events", "default") if e["reason"] == "DRACheckpointUnusable"],
        lambda found: len(found) == 1,
    )
    assert kept.name in events[0]["message"]

    apiserver.wait_for(lambda: _slices(apiserver), lambda found: len(found) == 1)
    uid = _claim(apiserver, "train", ["npu-0"])
    prepared = (await kubelet.prepare([dra_v1.Claim(namespace="default", uid=uid, name="train")])).claims[uid]
    assert prepared.error == "" and [d.device_name for d in prepared.devices] == ["npu-0"]
    assert json.loads(checkpoint.read_text())["claims"][0]["uid"] == uid
    _stop(agent)
    assert "Traceback" not in agent.output


async def test_a_claim_uid_cannot_steer_a_path_and_a_nul_fails_only_its_claim(
    host: _Host, apiserver: ApiServer
) -> None:
    host.start()
    kubelet = DraKubelet(host.registry)
    await kubelet.register(DRIVER)
    apiserver.wait_for(lambda: _slices(apiserver), lambda found: len(found) == 1)
    good = _claim(apiserver, "good", ["npu-0"])
    steering = "../../../escaped"
    for name, uid in (("steer", steering), ("nul", "a\x00b")):  # as an API server would never give them
        apiserver.put_claim(name, ["npu-1"], driver=DRIVER, pool=NODE, uid=uid)
    answer = await kubelet.prepare(
        [
            dra_v1.Claim(namespace="default", uid=steering, name="steer"),
            dra_v1.Claim(namespace="default", uid="a\x00b", name="nul"),
            dra_v1.Claim(namespace="default", uid=good, name="good"),
        ]
    )
    assert answer.claims[good].error == ""
    for uid in (steering, "a\x00b"):
        assert "is not a Kubernetes UID" in answer.claims[uid].error
        assert not answer.claims[uid].devices
    assert [p.name for p in host.cdi.iterdir()] == [f"{DRIVER}-claim-{good}.json"]
    assert not list(host.directory.rglob("escaped*"))
    done = await kubelet.unprepare([dra_v1.Claim(namespace="default", uid=steering, name="steer")])
    assert done.claims[steering].error == "", "nothing was written for it: success, or the kubelet retries"
    assert [p.name for p in host.cdi.iterdir()] == [f"{DRIVER}-claim-{good}.json"]


async def test_a_rolling_update_keeps_every_claim_served_while_both_pods_run(
    host: _Host, apiserver: ApiServer
) -> None:
    old_pod, new_pod = str(uuid.uuid4()), str(uuid.uuid4())
    plugin_dir = host.directory / "kubelet" / "plugins" / DRIVER
    old = host.start(env={"POD_UID": old_pod})
    to_old = DraKubelet(host.registry)
    info = await to_old.register(DRIVER, old_pod)
    assert info.endpoint == str(plugin_dir / f"dra-{old_pod}.sock")
    assert not (host.registry / f"{DRIVER}-reg.sock").exists()
    apiserver.wait_for(lambda: _slices(apiserver), lambda found: len(found) == 1)  # the client loaded
    uid = _claim(apiserver, "train", ["npu-1"])
    claim = dra_v1.Claim(namespace="default", uid=uid, name="train")
    prepared = (await to_old.prepare([claim])).claims[uid]
    assert prepared.error == ""

    # The new pod starts while the old one runs (maxSurge): registered on sockets of its own at once.
    new = host.start(env={"POD_UID": new_pod})
    to_new = DraKubelet(host.registry)
    assert (await to_new.register(DRIVER, new_pod)).endpoint == str(plugin_dir / f"dra-{new_pod}.sock")
    # It answers the claim the old pod prepared, and refuses that claim's device to another claim.
    assert (await to_new.prepare([claim])).claims[uid] == prepared
    rival = _claim(apiserver, "rival", ["npu-1"])
    await anyio.to_thread.run_sync(new.wait_log, "Cluster side on")
    refused = (await to_new.prepare([dra_v1.Claim(namespace="default", uid=rival, name="rival")])).claims
    assert "npu-1 is in use" in refused[rival].error
    async with to_new.watching() as updates:
        await updates.wait_for(lambda seen: seen.get("npu-1", ("",))[0] == "HEALTHY", "npu-1 HEALTHY")

    # The old pod stops: its sockets go, the new pod's stay; the new pod unprepares what the old one wrote.
    _stop(old)
    assert not (host.registry / f"{DRIVER}-{old_pod}-reg.sock").exists()
    assert not (plugin_dir / f"dra-{old_pod}.sock").exists()
    assert (host.registry / f"{DRIVER}-{new_pod}-reg.sock").exists()
    assert (await to_new.unprepare([claim])).claims[uid].error == ""
    assert not (host.cdi / f"{DRIVER}-claim-{uid}.json").exists()
    assert new.proc.poll() is None


async def test_dra_cleanup_keeps_the_slices_while_the_other_pod_serves(
    host: _Host, apiserver: ApiServer
) -> None:
    old_pod, new_pod = str(uuid.uuid4()), str(uuid.uuid4())
    old = host.start("--dra-cleanup", env={"POD_UID": old_pod})
    await DraKubelet(host.registry).register(DRIVER, old_pod)
    apiserver.wait_for(lambda: _slices(apiserver), lambda found: len(found) == 1)
    new = host.start("--dra-cleanup", env={"POD_UID": new_pod})
    await DraKubelet(host.registry).register(DRIVER, new_pod)
    _stop(old)
    assert "ResourceSlices of node-1 kept (--dra-cleanup): another instance" in old.output
    assert len(_slices(apiserver)) == 1
    _stop(new)
    assert _slices(apiserver) == []


async def test_a_prepare_in_flight_at_sigterm_is_answered_before_the_agent_exits(
    host: _Host, apiserver: ApiServer
) -> None:
    pod = str(uuid.uuid4())
    agent = host.start(env={"POD_UID": pod})
    kubelet = DraKubelet(host.registry)
    await kubelet.register(DRIVER, pod)
    apiserver.wait_for(lambda: _slices(apiserver), lambda found: len(found) == 1)
    uid = _claim(apiserver, "train", ["npu-1"])
    claim = dra_v1.Claim(namespace="default", uid=uid, name="train")
    assert (await kubelet.prepare([claim])).claims[uid].error == ""  # its allocation read and kept
    assert (await kubelet.unprepare([claim])).claims[uid].error == ""

    lock = host.directory / "kubelet" / "plugins" / DRIVER / "serialize.lock"
    descriptor = os.open(lock, os.O_RDWR)
    fcntl.flock(descriptor, fcntl.LOCK_EX)  # the other pod, in the middle of a call
    answers: list[dra_v1.NodePrepareResourcesResponse] = []

    async def prepare() -> None:
        answers.append(await kubelet.prepare([claim], timeout=20.0))

    def waits_for_the_lock() -> bool:
        """Whether the agent has the lock file open: its call waits for the lock."""
        for fd in Path(f"/proc/{agent.proc.pid}/fd").iterdir():
            with contextlib.suppress(OSError):  # closed meanwhile
                if os.readlink(fd) == str(lock):
                    return True
        return False

    try:
        async with anyio.create_task_group() as tasks:
            tasks.start_soon(prepare)
            with anyio.fail_after(10):
                while not waits_for_the_lock():
                    await anyio.sleep(0.01)
            agent.proc.send_signal(signal.SIGTERM)
            await anyio.to_thread.run_sync(agent.wait_log, r"stopping: 1 call\(s\) in flight")
            fcntl.flock(descriptor, fcntl.LOCK_UN)
    finally:
        os.close(descriptor)
    (answer,) = answers
    assert answer.claims[uid].error == "" and [d.device_name for d in answer.claims[uid].devices] == ["npu-1"]
    assert agent.proc.wait(10) == 0, agent.output
    assert (host.cdi / f"{DRIVER}-claim-{uid}.json").exists()

"""examples/dra/: valid against the Kubernetes 1.36 schemas (offline, strict: extendedResourceName and device
taints are not in older ones), the DaemonSet runs the agent in DRA mode with a config Settings accepts, and
the CEL selectors and constraints name attributes the agent publishes (Kubernetes' standard ones too)."""

from __future__ import annotations

import re
from pathlib import Path
from typing import Any

import kubernetes_validate
import pytest

from ascend_agent.config import DRA_API, SettingsSource
from ascend_agent.kubelet.dra.devices import DeviceTaints, pool_slices
from ascend_agent.model import Chip, Inventory, VNpu
from tests.support import ROOT
from tests.support.manifests import documents
from tests.support.rbac import grants

KUBERNETES = "1.36"
DRA = ROOT / "examples" / "dra"


DOCUMENTS = documents(sorted(DRA.glob("*.yaml")))


@pytest.mark.parametrize("doc", [d for _, d in DOCUMENTS], ids=[n for n, _ in DOCUMENTS])
def test_manifest_is_valid_for_kubernetes_1_36(doc: dict[str, Any]) -> None:
    assert kubernetes_validate.validate(doc, KUBERNETES, strict=True) == KUBERNETES


def test_the_daemonset_runs_the_dra_driver(tmp_path: Path) -> None:
    (config,) = [d for _, d in DOCUMENTS if d["kind"] == "ConfigMap"]
    path = tmp_path / "config.yaml"
    path.write_text(config["data"]["config.yaml"], encoding="utf-8")
    loaded = SettingsSource({}, path).load()
    assert loaded.kubelet_api == DRA_API and loaded.dra_driver_name == "npu.huawei.com"
    kinds = [d["kind"] for _, d in DOCUMENTS]
    for kind in ("DaemonSet", "ClusterRole", "DeviceClass", "ResourceClaimTemplate"):
        assert kind in kinds
    (role,) = [d for _, d in DOCUMENTS if d["kind"] == "ClusterRole"]
    verbs = {r["resources"][0]: set(r["verbs"]) for r in role["rules"]}
    assert verbs["resourceslices"] == {"list", "watch", "create", "patch", "delete"}
    assert verbs["resourceclaims"] == {"get"}
    assert verbs["resourceclaims/status"] == {"patch"}, "status.devices, by server-side apply"
    (driver,) = [r for r in role["rules"] if r["resources"] == ["resourceclaims/driver"]]
    assert driver["resourceNames"] == ["npu.huawei.com"], "this driver's entries only"
    assert driver["verbs"] == ["associated-node:patch"], "for claims on the agent's own node only"
    # no feature runs whose RBAC the manifest does not grant (configmaps for device-info, pods for Volcano)
    assert "configmaps" not in verbs and "pods" not in verbs
    assert not loaded.device_info and not loaded.volcano


def test_a_rolling_update_starts_the_new_pod_before_the_old_one_stops() -> None:
    (daemonset,) = [d for _, d in DOCUMENTS if d["kind"] == "DaemonSet"]
    assert daemonset["spec"]["updateStrategy"] == {
        "type": "RollingUpdate",
        "rollingUpdate": {"maxSurge": 1, "maxUnavailable": 0},
    }
    (container,) = daemonset["spec"]["template"]["spec"]["containers"]
    (uid,) = [e for e in container["env"] if e["name"] == "POD_UID"]
    assert uid["valueFrom"] == {"fieldRef": {"fieldPath": "metadata.uid"}}


def test_selectors_name_published_attributes() -> None:
    a3 = tuple(
        Chip.make(i, "910_9392", npu_id=i // 2, hbm_mb=65536, numa_node=0, pcie_root="pci0000:00")
        for i in range(4)
    )
    rings = tuple(Chip.make(i, "910ProB") for i in range(8))
    cards = tuple(Chip.make(i, "310P3") for i in range(2))
    split = Inventory(cards, vnpus=(cards[0].slice(VNpu(100, "vir02", aicore=2, memory_gb=6)),))
    taints = DeviceTaints("npu.huawei.com", "NoSchedule")
    published = {
        name
        for inventory in (Inventory(a3, driver_version="25.0.rc1.1"), Inventory(rings), split)
        for spec in pool_slices(inventory, taints)
        for device in spec["devices"]
        for name in (*device["attributes"], *device.get("capacity", {}))
    }
    text = "\n".join(p.read_text(encoding="utf-8") for p in DRA.glob("*.yaml"))
    named = (
        set(re.findall(r'\["npu\.huawei\.com"\]\.(\w+)', text))
        | set(re.findall(r"matchAttribute: npu\.huawei\.com/(\w+)", text))
        | set(re.findall(r'"(\w+)" in device\.attributes\["npu\.huawei\.com"\]', text))
        | set(re.findall(r"matchAttribute: (resource\.kubernetes\.io/\w+)", text))
    )
    assert named and named <= published, named - published


def test_every_device_class_says_whether_it_takes_vnpus() -> None:
    """A chip split into vNPUs is published as its vNPUs, a dynamic chip also as its template devices; both
    carry ``template``: a class standing for a whole-chip resource (``huawei.com/Ascend910``) must not hand
    out either, one for a vNPU type (``huawei.com/Ascend310P-2c``) nothing else."""
    presence = '"template" in device.attributes["npu.huawei.com"]'
    classes = [doc for _, doc in DOCUMENTS if doc["kind"] == "DeviceClass"]
    for doc in classes:
        (selector,) = doc["spec"]["selectors"]
        expression = selector["cel"]["expression"]
        assert presence in expression, doc["metadata"]["name"]
        resource = doc["spec"].get("extendedResourceName")
        if resource is not None:
            whole = re.fullmatch(r"huawei\.com/Ascend\w+", resource) is not None
            assert (f"!({presence})" in expression) == whole, doc["metadata"]["name"]
    assert any("-" in d["spec"].get("extendedResourceName", "") for d in classes)


def _grants(namespace: str | None, group: str, resource: str, verb: str, name: str) -> bool:
    return grants((doc for _, doc in DOCUMENTS), namespace, group, resource, verb, name)


def test_rbac_covers_the_doctors_reads_in_dra_mode() -> None:
    from ascend_agent import naming

    (daemonset,) = [d for _, d in DOCUMENTS if d["kind"] == "DaemonSet"]
    assert daemonset["metadata"]["name"] == naming.DRA_DAEMONSET_NAME, "the doctor's default in DRA mode"
    namespace = daemonset["metadata"]["namespace"]
    assert namespace == naming.DAEMONSET_NAMESPACE
    assert _grants(namespace, "apps", "daemonsets", "get", naming.DRA_DAEMONSET_NAME)
    assert _grants(namespace, "", "pods", "list", "")
    assert _grants(None, "resource.k8s.io", "resourceslices", "list", "")
    assert _grants(None, "", "nodes", "get", "npu-node-1")
    assert not _grants(namespace, "apps", "daemonsets", "get", "someone-else")
    assert not _grants("default", "", "pods", "list", "")

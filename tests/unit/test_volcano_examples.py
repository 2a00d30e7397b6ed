"""examples/volcano/ offline: the Kubernetes objects against the 1.31 schemas, the Volcano Jobs' pod templates
too (Volcano's Job CRD is not in the schemas: its own fields are checked here), the config it sets, and RBAC
that is exactly what the Volcano features use."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import kubernetes_validate
import pytest

from ascend_agent.config import Settings, SettingsSource
from tests.support import ROOT
from tests.support.manifests import documents

VOLCANO = ROOT / "examples" / "volcano"
KUBERNETES = "1.31"
Doc = dict[str, Any]


DOCS = documents(sorted(VOLCANO.glob("*.yaml")))
KUBE = [(name, doc) for name, doc in DOCS if not doc["apiVersion"].startswith("batch.volcano.sh/")]
JOBS = {doc["metadata"]["name"]: doc for _, doc in DOCS if doc["apiVersion"].startswith("batch.volcano.sh/")}


@pytest.mark.parametrize(("name", "doc"), KUBE, ids=[name for name, _ in KUBE])
def test_objects_are_valid_for_kubernetes(name: str, doc: Doc) -> None:
    assert kubernetes_validate.validate(doc, KUBERNETES, strict=True) == KUBERNETES


@pytest.mark.parametrize("job", sorted(JOBS))
def test_volcano_jobs(job: str) -> None:
    doc = JOBS[job]
    assert (doc["apiVersion"], doc["kind"]) == ("batch.volcano.sh/v1alpha1", "Job")
    spec = doc["spec"]
    assert set(spec) <= {"schedulerName", "minAvailable", "maxRetry", "queue", "tasks", "plugins", "policies"}
    assert spec["schedulerName"] == "volcano"
    for task in spec["tasks"]:
        assert set(task) <= {"name", "replicas", "template", "policies", "minAvailable"}
        template = {
            "apiVersion": "v1",
            "kind": "PodTemplate",
            "metadata": {"name": task["name"]},
            "template": task["template"],
        }
        assert kubernetes_validate.validate(template, KUBERNETES, strict=True) == KUBERNETES
        assert task["template"]["metadata"]["labels"]["ring-controller.atlas"] == "ascend-910b"


def test_one_job_asks_for_8_chips_and_one_for_2() -> None:
    asked = sorted(
        container["resources"]["limits"]["huawei.com/Ascend910"] * task["replicas"]
        for doc in JOBS.values()
        for task in doc["spec"]["tasks"]
        for container in task["template"]["spec"]["containers"]
    )
    assert asked == [2, 8]


def _config(tmp_path: Path) -> Settings:
    (config_map,) = [doc for _, doc in KUBE if doc["kind"] == "ConfigMap"]
    path = tmp_path / "config.yaml"
    path.write_text(config_map["data"]["config.yaml"])
    return SettingsSource(overrides={}, config_file=path).load()


def test_the_config_turns_volcano_on(tmp_path: Path) -> None:
    settings = _config(tmp_path)
    assert settings.volcano and settings.device_info and settings.cluster


def _rules(kind: str) -> dict[str, set[str]]:
    (role,) = [doc for _, doc in KUBE if doc["kind"] == kind]
    return {
        "/".join([resource, *rule.get("resourceNames", [])]): set(rule["verbs"])
        for rule in role["rules"]
        for resource in rule["resources"]
    }


def test_rbac_is_exactly_what_the_volcano_features_use() -> None:
    assert _rules("Role") == {
        "configmaps": {"get", "list", "watch", "create", "update"},
        "configmaps/mindx-dl-fault-config": {"get", "list", "watch"},
    }
    assert _rules("ClusterRole") == {"pods": {"list", "watch", "patch"}, "nodes": {"get", "patch"}}
    for kind in ("RoleBinding", "ClusterRoleBinding"):
        (binding,) = [doc for _, doc in KUBE if doc["kind"] == kind]
        assert binding["subjects"] == [
            {"kind": "ServiceAccount", "name": "ascend-device-plugin", "namespace": "kube-system"}
        ]

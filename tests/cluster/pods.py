"""Pods for the cluster tests and what the recording runtime wrote for their containers."""

from __future__ import annotations

import base64
import json
import re
from pathlib import Path
from typing import Any

from tests.cluster.harness import Cluster

RESOURCE = "huawei.com/Ascend910"
IMAGE = "registry.invalid/ascend-smoke:1"  # the recording runtime "pulls" any image at once


def one_pod_spec(name: str, container: str, chips: int) -> dict[str, Any]:
    """A pod of one container asking for ``chips`` chips (the runtime fakes its image)."""
    limits = {RESOURCE: str(chips)}
    return {
        "apiVersion": "v1",
        "kind": "Pod",
        "metadata": {"name": name, "namespace": "default"},
        "spec": {
            "automountServiceAccountToken": False,
            "containers": [{"name": container, "image": IMAGE, "resources": {"limits": limits}}],
        },
    }


def claim_pod(cluster: Cluster, name: str, device_class: str = "ascend910b4", count: int = 1) -> None:
    """A ResourceClaimTemplate of ``count`` devices of ``device_class`` and a pod of one container using it
    through the pod claim ``npus``."""
    request = {"deviceClassName": device_class, "allocationMode": "ExactCount", "count": count}
    template = {
        "apiVersion": "resource.k8s.io/v1",
        "kind": "ResourceClaimTemplate",
        "metadata": {"name": name, "namespace": "default"},
        "spec": {"spec": {"devices": {"requests": [{"name": "npus", "exactly": request}]}}},
    }
    pod = one_pod_spec(name, name, 1)
    pod["spec"]["containers"][0]["resources"] = {"claims": [{"name": "npus"}]}
    pod["spec"]["resourceClaims"] = [{"name": "npus", "resourceClaimTemplateName": name}]
    cluster.kubectl("apply", "-f", "-", stdin=json.dumps(template))
    cluster.kubectl("apply", "-f", "-", stdin=json.dumps(pod))


def chip_devices(request: dict[str, Any]) -> set[str]:
    """The chips' device nodes (/dev/davinciN) in a recorded CreateContainer request."""
    devices = {d["hostPath"] for d in request["config"].get("devices", [])}
    return {d for d in devices if re.fullmatch(r"/dev/davinci\d+", d)}


def wait_running(cluster: Cluster, pod: str) -> None:
    waited = cluster.kubectl(
        "wait",
        f"pod/{pod}",
        "--for=jsonpath={.status.phase}=Running",
        "--timeout=90s",
        timeout=120,
        check=False,
    )
    if waited.returncode != 0:
        described = cluster.kubectl("describe", "pod", pod, check=False).stdout
        raise AssertionError(f"pod {pod} is not Running: {waited.stderr.strip()}\n{described}")


def recorded_envs(request: dict[str, Any]) -> dict[str, str]:
    """A recorded container's environment (CRI's KeyValue.value is bytes: base64 in protobuf's JSON)."""
    return {
        e["key"]: base64.b64decode(e.get("value", "")).decode() for e in request["config"].get("envs", [])
    }


def recorded_containers(cluster: Cluster, name: str) -> list[dict[str, Any]]:
    found = []
    for path in sorted(Path(cluster.records).glob("*.json")):
        request = json.loads(path.read_text())
        if request.get("config", {}).get("metadata", {}).get("name") == name:
            found.append(request)
    return found

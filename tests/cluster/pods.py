"""Pods for the cluster tests, and what their containers really got from containerd: the OCI spec it made
(device nodes, environment, after the CDI edits it applied) and what the container printed of its own /dev."""

from __future__ import annotations

import json
import re
import tomllib
from pathlib import Path
from typing import Any

from tests.cluster.harness import Cluster
from tests.cluster.polling import until

RESOURCE = "huawei.com/Ascend910"
# The agent's own image, imported into containerd by `make e2e` (it has a shell), as every workload's image:
# named by the version image/build.sh reads from pyproject.toml.
_VERSION = tomllib.loads((Path(__file__).parents[2] / "pyproject.toml").read_text())["project"]["version"]
IMAGE = f"docker.io/library/ascend-agent:{_VERSION}"
# What every workload container runs: it prints the device nodes it sees (name and numbers) and the Ascend
# variables, then waits, leaving at once on SIGTERM.
SHOW_DEVICES = (
    "for node in /dev/*; do [ -c $node ] && echo device $node $(stat -c %t:%T $node); done; "
    "env | grep ^ASCEND_ | sed 's/^/env /' | sort; echo shown; "
    "trap 'exit 0' TERM; while :; do sleep 3600 & wait $!; done"
)


def container(name: str, **fields: Any) -> dict[str, Any]:
    """A container of the agent's image that shows its devices and waits."""
    return {
        "name": name,
        "image": IMAGE,
        "imagePullPolicy": "Never",
        "command": ["sh", "-c", SHOW_DEVICES],
        **fields,
    }


def one_pod_spec(name: str, container_name: str, chips: int) -> dict[str, Any]:
    """A pod of one container asking for ``chips`` chips."""
    limits = {RESOURCE: str(chips)}
    return {
        "apiVersion": "v1",
        "kind": "Pod",
        "metadata": {"name": name, "namespace": "default"},
        "spec": {
            "automountServiceAccountToken": False,
            "terminationGracePeriodSeconds": 2,
            "containers": [container(container_name, resources={"limits": limits})],
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


def delete_pods(cluster: Cluster, *names: str, namespace: str = "default") -> None:
    """The pods deleted, waited for until they are gone (at most 90 s); absent ones are no error."""
    flags = ["-n", namespace, "--wait=true", "--timeout=90s", "--ignore-not-found"]
    cluster.kubectl("delete", "pod", *names, *flags, check=False, timeout=120)


def claim_uids(cluster: Cluster, pod: str, namespace: str = "default") -> list[str]:
    """The UIDs of the ResourceClaims made for a pod's claims."""
    status = json.loads(cluster.kubectl("get", "pod", pod, "-n", namespace, "-o", "json").stdout)["status"]
    uids = []
    for claim in status.get("resourceClaimStatuses", []):
        got = cluster.kubectl("get", "resourceclaim", claim["resourceClaimName"], "-n", namespace, "-o",
                              "jsonpath={.metadata.uid}")  # fmt: skip
        uids.append(got.stdout.strip())
    return uids


def wait_unschedulable(cluster: Cluster, pod: str, timeout: float = 60) -> None:
    """Until the scheduler has said the pod (in ``default``) cannot be placed: its PodScheduled condition's
    reason is Unschedulable. Read by this process: kubectl before 1.29 waits on no jsonpath filter."""

    def scheduled() -> str:
        status = json.loads(cluster.kubectl("get", "pod", pod, "-o", "json").stdout).get("status") or {}
        reasons = [
            c.get("reason", "") for c in status.get("conditions") or () if c.get("type") == "PodScheduled"
        ]
        return reasons[0] if reasons else ""

    until(scheduled, lambda reason: reason == "Unschedulable", f"pod {pod} Unschedulable", timeout)


def wait_running(cluster: Cluster, pod: str, namespace: str = "default", timeout: int = 90) -> None:
    waited = cluster.kubectl(
        "wait",
        f"pod/{pod}",
        "-n",
        namespace,
        "--for=jsonpath={.status.phase}=Running",
        f"--timeout={timeout}s",
        timeout=timeout + 30,
        check=False,
    )
    if waited.returncode != 0:
        described = cluster.kubectl("describe", "pod", pod, "-n", namespace, check=False).stdout
        raise AssertionError(f"pod {pod} is not Running: {waited.stderr.strip()}\n{described}")


def container_id(cluster: Cluster, pod: str, name: str, namespace: str = "default") -> str:
    """The runtime's ID of a pod's container (its status says ``containerd://<id>``)."""
    status = json.loads(cluster.kubectl("get", "pod", pod, "-n", namespace, "-o", "json").stdout)["status"]
    (found,) = (c["containerID"] for c in status.get("containerStatuses", []) if c["name"] == name)
    return str(found).removeprefix("containerd://")


def runtime_spec(cluster: Cluster, pod: str, name: str, namespace: str = "default") -> dict[str, Any]:
    """The OCI spec containerd made for the pod's container ``name``."""
    return cluster.runtime.container_spec(container_id(cluster, pod, name, namespace))


def spec_devices(spec: dict[str, Any]) -> set[str]:
    """The device nodes (container paths) of an OCI spec."""
    return {device["path"] for device in spec.get("linux", {}).get("devices") or []}


def spec_device_numbers(spec: dict[str, Any]) -> dict[str, tuple[int, int]]:
    """The device nodes of an OCI spec: container path -> (major, minor) of the host's node."""
    return {
        device["path"]: (device["major"], device["minor"])
        for device in spec.get("linux", {}).get("devices") or []
    }


def chip_devices(spec: dict[str, Any]) -> set[str]:
    """The chips' device nodes (/dev/davinciN) of an OCI spec."""
    return {path for path in spec_devices(spec) if re.fullmatch(r"/dev/davinci\d+", path)}


def spec_envs(spec: dict[str, Any]) -> dict[str, str]:
    """An OCI spec's environment."""
    return dict(entry.split("=", 1) for entry in spec.get("process", {}).get("env", []))


def shown(cluster: Cluster, pod: str, namespace: str = "default") -> tuple[dict[str, str], dict[str, str]]:
    """What the pod's container printed (`kubectl logs`): its character devices (path -> major:minor in
    hex, as stat prints them) and its ASCEND_ variables, once it has printed them all."""
    logs = until(
        lambda: cluster.kubectl("logs", pod, "-n", namespace, check=False).stdout,
        lambda text: "shown" in text.splitlines(),
        f"pod {pod}'s list of its devices",
    )
    devices: dict[str, str] = {}
    envs: dict[str, str] = {}
    for line in logs.splitlines():
        kind, _, rest = line.partition(" ")
        if kind == "device":
            path, numbers = rest.split(" ")
            devices[path] = numbers
        elif kind == "env":
            key, _, value = rest.partition("=")
            envs[key] = value
    return devices, envs

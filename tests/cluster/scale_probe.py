"""The cluster's admin for `make bench-scale`, run inside the cluster's network namespace (the API server's
address is only reachable there): one JSON request per line on stdin, one JSON answer per line on stdout.

    {"op": "create_nodes", "names": ["scale-0000"], "agents": ["scale-0000"]}   -> {"created": 1}
    {"op": "tokens", "account": "ascend-device-plugin", "namespace": "kube-system", "nodes": [...]}
    {"op": "metrics"}                        -> the API server's figures the bench reads (see ``metrics``)
    {"op": "count_nodes", "selector": "k"}  -> {"count": n}: Nodes with that label selector
    {"op": "ready_nodes"}                   -> {"count": n}: Nodes whose Ready condition is True
    {"op": "slice_nodes", "driver": "d"}    -> {"count": n}: nodes with a ResourceSlice of that driver
    {"op": "strip_labels", "nodes": [...], "prefixes": [...], "keys": [...]}   -> {"patched": n}
    {"op": "unhealthy_published", "driver": "d"}   -> {"count": n}: nodes whose device-info ConfigMap (or,
                                              with a driver, ResourceSlices) show an Unhealthy chip

Bulk requests go eight at a time; an answer is ``{"error": "..."}`` when a request failed.
"""

from __future__ import annotations

import json
import ssl
import sys
import urllib.error
import urllib.parse
import urllib.request
from collections import defaultdict
from concurrent.futures import ThreadPoolExecutor
from typing import Any

import yaml
from prometheus_client.parser import text_string_to_metric_families

PARALLEL = 8
# A Node as kwok keeps it: the annotation puts it under kwok's management, the capacity lets pods fit.
CAPACITY = {"cpu": "192", "memory": "1536Gi", "pods": "110"}


class Api:
    def __init__(self, kubeconfig: str) -> None:
        with open(kubeconfig) as file:
            config = yaml.safe_load(file)
        cluster = config["clusters"][0]["cluster"]
        self.server = cluster["server"]
        self.token = config["users"][0]["user"]["token"]
        self.context = ssl.create_default_context(cafile=cluster["certificate-authority"])

    def request(
        self, method: str, path: str, body: Any = None, content_type: str = "application/json"
    ) -> Any:
        data = None if body is None else json.dumps(body).encode()
        request = urllib.request.Request(self.server + path, data=data, method=method)
        request.add_header("Authorization", f"Bearer {self.token}")
        if data is not None:
            request.add_header("Content-Type", content_type)
        with urllib.request.urlopen(request, context=self.context, timeout=60) as answer:
            raw = answer.read()
        return raw if path == "/metrics" else json.loads(raw)

    def items(self, path: str) -> list[dict[str, Any]]:
        items: list[dict[str, Any]] = []
        token = ""
        while True:
            page = self.request("GET", f"{path}{'&' if '?' in path else '?'}limit=500&continue={token}")
            items += page.get("items") or []
            token = (page.get("metadata") or {}).get("continue") or ""
            if not token:
                return items


def _parallel(calls: list[Any]) -> int:
    with ThreadPoolExecutor(PARALLEL) as pool:
        return sum(1 for _ in pool.map(lambda call: call(), calls))


def create_nodes(api: Api, names: list[str], agents: list[str]) -> dict[str, Any]:
    with_agent = set(agents)

    def node(name: str) -> dict[str, Any]:
        labels = {"kubernetes.io/hostname": name, "type": "kwok"}
        if name in with_agent:
            labels.update({"accelerator": "huawei-Ascend910", "bench.ascend-agent/agent": "true"})
        return {
            "apiVersion": "v1",
            "kind": "Node",
            "metadata": {"name": name, "labels": labels, "annotations": {"kwok.x-k8s.io/node": "fake"}},
            "spec": {},
            "status": {"capacity": CAPACITY, "allocatable": CAPACITY},
        }

    created = _parallel([lambda n=name: api.request("POST", "/api/v1/nodes", node(n)) for name in names])
    return {"created": created}


def tokens(api: Api, account: str, namespace: str, nodes: list[str]) -> dict[str, Any]:
    def token(node: str) -> str:
        uid = api.request("GET", f"/api/v1/nodes/{node}")["metadata"]["uid"]
        body = {
            "apiVersion": "authentication.k8s.io/v1",
            "kind": "TokenRequest",
            "spec": {
                "expirationSeconds": 4 * 3600,
                # Bound to the Node, as a pod's token is to its node: the audit log names each agent's node.
                "boundObjectRef": {"kind": "Node", "apiVersion": "v1", "name": node, "uid": uid},
            },
        }
        path = f"/api/v1/namespaces/{namespace}/serviceaccounts/{account}/token"
        return str(api.request("POST", path, body)["status"]["token"])

    with ThreadPoolExecutor(PARALLEL) as pool:
        return {"tokens": list(pool.map(token, nodes))}


def metrics(api: Api) -> dict[str, Any]:
    """Sums of the API server's own series the bench reads, by the labels it reports them by."""
    text = api.request("GET", "/metrics").decode()
    wanted: dict[str, tuple[str, ...]] = {
        "process_cpu_seconds_total": (),
        "apiserver_current_inflight_requests": ("request_kind",),
        "apiserver_flowcontrol_current_executing_requests": ("priority_level",),
        "apiserver_flowcontrol_current_inqueue_requests": ("priority_level",),
        "apiserver_flowcontrol_rejected_requests_total": ("priority_level",),
        "apiserver_flowcontrol_dispatched_requests_total": ("priority_level",),
        "apiserver_request_total": ("code",),
        "apiserver_longrunning_requests": ("verb", "resource"),
        "apiserver_registered_watchers": ("kind",),
        "apiserver_watch_events_total": ("kind",),
        "apiserver_watch_events_sizes_sum": ("kind",),
        "apiserver_response_sizes_sum": ("resource", "subresource"),
        "etcd_request_duration_seconds_count": ("operation",),
        "etcd_requests_total": ("operation",),
    }
    found: dict[str, dict[str, float]] = defaultdict(lambda: defaultdict(float))
    for family in text_string_to_metric_families(text):
        for sample in family.samples:
            labels = wanted.get(sample.name)
            if labels is None:
                continue
            key = "/".join(sample.labels.get(label, "") for label in labels)
            found[sample.name][key] += sample.value
    return {name: dict(values) for name, values in found.items()}


def count_nodes(api: Api, selector: str) -> dict[str, Any]:
    found = api.items(f"/api/v1/nodes?labelSelector={urllib.parse.quote(selector)}")
    return {"count": len(found)}


def ready_nodes(api: Api) -> dict[str, Any]:
    ready = 0
    for node in api.items("/api/v1/nodes"):
        conditions = (node.get("status") or {}).get("conditions") or []
        ready += any(c.get("type") == "Ready" and c.get("status") == "True" for c in conditions)
    return {"count": ready}


def slice_nodes(api: Api, driver: str) -> dict[str, Any]:
    group = "/apis/resource.k8s.io/v1/resourceslices"
    found = api.items(f"{group}?fieldSelector={urllib.parse.quote(f'spec.driver={driver}')}")
    return {"count": len({s["spec"].get("nodeName") for s in found})}


def unhealthy_published(api: Api, driver: str = "") -> dict[str, Any]:
    nodes: set[str] = set()
    if driver:
        group = "/apis/resource.k8s.io/v1/resourceslices"
        for found in api.items(f"{group}?fieldSelector={urllib.parse.quote(f'spec.driver={driver}')}"):
            if any(device.get("taints") for device in found["spec"].get("devices") or ()):
                nodes.add(found["spec"].get("nodeName"))
        return {"count": len(nodes)}
    for found in api.items("/api/v1/namespaces/kube-system/configmaps"):
        name = found["metadata"]["name"]
        if not name.startswith("mindx-dl-deviceinfo-"):
            continue
        payload = json.loads((found.get("data") or {}).get("DeviceInfoCfg") or "{}")
        lists = (payload.get("DeviceInfo") or {}).get("DeviceList") or {}
        if any(key.endswith("-Unhealthy") and value for key, value in lists.items()):
            nodes.add(name.removeprefix("mindx-dl-deviceinfo-"))
    return {"count": len(nodes)}


def strip_labels(api: Api, nodes: list[str], prefixes: list[str], keys: list[str]) -> dict[str, Any]:
    def strip(name: str) -> None:
        labels = api.request("GET", f"/api/v1/nodes/{name}")["metadata"].get("labels") or {}
        gone = {k: None for k in labels if k in keys or any(k.startswith(p) for p in prefixes)}
        if gone:
            patch = {"metadata": {"labels": gone}}
            api.request("PATCH", f"/api/v1/nodes/{name}", patch, "application/merge-patch+json")

    return {"patched": _parallel([lambda n=name: strip(n) for name in nodes])}


def answer(api: Api, request: dict[str, Any]) -> dict[str, Any]:
    op = request.pop("op")
    handlers = {
        "create_nodes": create_nodes,
        "tokens": tokens,
        "metrics": metrics,
        "count_nodes": count_nodes,
        "ready_nodes": ready_nodes,
        "slice_nodes": slice_nodes,
        "strip_labels": strip_labels,
        "unhealthy_published": unhealthy_published,
    }
    try:
        result: dict[str, Any] = handlers[op](api, **request)
    except (urllib.error.URLError, OSError, KeyError, ValueError) as exc:
        return {"error": f"{op}: {type(exc).__name__}: {exc}"}
    return result


def main() -> None:
    api = Api(sys.argv[1])
    for line in sys.stdin:
        print(json.dumps(answer(api, json.loads(line))), flush=True)


if __name__ == "__main__":
    main()

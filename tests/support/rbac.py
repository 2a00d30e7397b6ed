"""What a manifest's DaemonSet may ask of the API server, read from its RBAC objects (no wildcards)."""

from __future__ import annotations

from collections.abc import Iterable
from typing import Any


def grants(
    documents: Iterable[dict[str, Any]],
    namespace: str | None,
    group: str,
    resource: str,
    verb: str,
    name: str,
) -> bool:
    """Whether the DaemonSet's ServiceAccount may make this request: the union of the rules of the roles
    bound to it, a RoleBinding only in its own namespace.::

        grants(documents, "kube-system", "apps", "daemonsets", "get", "ascend-device-plugin-daemonset")
    """
    documents = list(documents)
    (daemonset,) = [d for d in documents if d["kind"] == "DaemonSet"]
    account = {
        "kind": "ServiceAccount",
        "name": daemonset["spec"]["template"]["spec"]["serviceAccountName"],
        "namespace": daemonset["metadata"]["namespace"],
    }
    roles = {(d["kind"], d["metadata"]["name"]): d for d in documents if d["kind"].endswith("Role")}
    for binding in documents:
        if not binding["kind"].endswith("RoleBinding") or account not in binding["subjects"]:
            continue
        if binding["kind"] == "RoleBinding" and binding["metadata"]["namespace"] != namespace:
            continue
        for rule in roles[(binding["roleRef"]["kind"], binding["roleRef"]["name"])]["rules"]:
            if (
                group in rule["apiGroups"]
                and resource in rule["resources"]
                and verb in rule["verbs"]
                and name in rule.get("resourceNames", [name])
            ):
                return True
    return False

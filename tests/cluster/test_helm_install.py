"""The chart installed with Helm's own engine against the real API server, as an operator runs it. A typo in
``config:`` (``hotRest: idle``), which the agent refuses at start (exit 2, in every pod of the DaemonSet),
stops ``helm install`` with the schema's message before anything is created; the same install spelt right
succeeds; and a ``helm upgrade`` with the typo leaves the installed release as it was, so the config
checksum never rolls the DaemonSet onto a file the agent cannot load."""

from __future__ import annotations

import json
from collections.abc import Iterator
from typing import Any

import pytest
import yaml

from tests.cluster import helm
from tests.cluster.agent import NAMESPACE, RENDERS, served_objects
from tests.cluster.harness import Cluster
from tests.cluster.released import DAEMONSET, remove_applied_chart

pytestmark = pytest.mark.e2e_cluster

TYPO = "additional properties 'hotRest' not allowed"
CONFIGMAP = "ascend-device-plugin-config"


@pytest.fixture(scope="module")
def no_release(cluster: Cluster) -> Iterator[None]:
    """No object of the chart in the cluster before (Helm adopts none that kubectl applied), the release
    uninstalled after."""
    remove_applied_chart(cluster)
    yield
    helm.uninstall(cluster)


def _present(cluster: Cluster, objects: list[tuple[str, str, str]]) -> list[str]:
    """Which of ``objects`` (kind, namespace, name) the API server holds, and the releases Helm keeps."""
    found = []
    for kind, namespace, name in objects:
        scope = ["-n", namespace] if namespace else []
        answer = cluster.kubectl("get", kind, name, *scope, "--ignore-not-found", "-o", "name")
        found += answer.stdout.split()
    releases = cluster.kubectl("get", "secrets", "-n", NAMESPACE, "-l", "owner=helm", "-o", "name")
    return found + releases.stdout.split()


def _chart_objects(cluster: Cluster) -> list[tuple[str, str, str]]:
    docs = served_objects(cluster, RENDERS / "default.yaml")
    return [(doc["kind"], doc["metadata"].get("namespace", ""), doc["metadata"]["name"]) for doc in docs]


def _installed(cluster: Cluster) -> tuple[dict[str, Any], str]:
    """(the ConfigMap's settings, the DaemonSet's config checksum)."""
    configmap = json.loads(
        cluster.kubectl("get", "configmap", CONFIGMAP, "-n", NAMESPACE, "-o", "json").stdout
    )
    daemonset = json.loads(
        cluster.kubectl("get", "daemonset", DAEMONSET, "-n", NAMESPACE, "-o", "json").stdout
    )
    annotations = daemonset["spec"]["template"]["metadata"]["annotations"]
    return yaml.safe_load(configmap["data"]["config.yaml"]), annotations["checksum/config"]


def test_a_typo_in_config_stops_helm_install_and_creates_nothing(cluster: Cluster, no_release: None) -> None:
    result = helm.install(cluster, {"config": {"hotRest": "idle"}})
    assert result.error is not None and TYPO in result.error, result.error
    assert "at '/config'" in result.error, result.error
    assert _present(cluster, _chart_objects(cluster)) == []


def test_spelt_right_it_installs_and_an_upgrade_with_the_typo_changes_nothing(
    cluster: Cluster, no_release: None
) -> None:
    result = helm.install(cluster, {"config": {"hotReset": "idle"}})
    assert result.error is None, result.error
    objects = [
        (doc["kind"], doc["metadata"].get("namespace", ""), doc["metadata"]["name"])
        for doc in result.manifest
    ]
    assert sorted(objects) == sorted(_chart_objects(cluster))
    assert len(_present(cluster, objects)) == len(objects) + 1, "each object and the release's Secret"
    settings, checksum = _installed(cluster)
    assert settings["hotReset"] == "idle"

    refused = helm.upgrade(cluster, {"config": {"hotReset": "idle", "hotRest": "idle"}})
    assert refused.error is not None and TYPO in refused.error, refused.error
    assert _installed(cluster) == (settings, checksum), "the release as it was: no roll of the DaemonSet"
    releases = cluster.kubectl("get", "secrets", "-n", NAMESPACE, "-l", "owner=helm", "-o", "name").stdout
    assert releases.split() == [f"secret/sh.helm.release.v1.{helm.RELEASE}.v1"], "no failed revision kept"

    assert helm.uninstall(cluster).error is None
    assert _present(cluster, objects) == []

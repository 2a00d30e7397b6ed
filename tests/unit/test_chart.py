"""charts/ascend-agent against examples/daemonset.yaml: the chart's default render installs the same objects,
container args, environment, mounts and RBAC rules.

The render is Helm's own (charts/check.py on helm-sdkpy, which needs Python >= 3.12). Where `make helm-lint`
has made .venv-helm, the chart is rendered here and must equal tests/fixtures/helm/default.yaml; elsewhere
(a fresh clone's `make test`) that file is the render, and `make helm-lint`, which CI runs next, fails when
it is not the engine's.
"""

from __future__ import annotations

import os
import subprocess
import tomllib
from pathlib import Path
from typing import Any

import pytest
import yaml

from ascend_agent.config import Settings, SettingsSource
from tests.support import ROOT

CHART = ROOT / "charts" / "ascend-agent"
GOLDEN = ROOT / "tests" / "fixtures" / "helm" / "default.yaml"
HELM_PYTHON = ROOT / ".venv-helm" / "bin" / "python"
EXAMPLE = ROOT / "examples" / "daemonset.yaml"

Doc = dict[str, Any]
Key = tuple[str, str, str]


def _docs(text: str) -> list[Doc]:
    return [doc for doc in yaml.safe_load_all(text) if doc]


def _by_key(docs: list[Doc]) -> dict[Key, Doc]:
    return {(doc["kind"], doc["metadata"].get("namespace", ""), doc["metadata"]["name"]): doc for doc in docs}


@pytest.fixture(scope="module")
def chart() -> dict[Key, Doc]:
    golden = _docs(GOLDEN.read_text(encoding="utf-8"))
    if HELM_PYTHON.exists():
        result = subprocess.run(
            [HELM_PYTHON, ROOT / "charts" / "check.py", "render"],
            capture_output=True,
            text=True,
            timeout=120,
            stdin=subprocess.DEVNULL,
        )
        assert result.returncode == 0, result.stderr
        assert _docs(result.stdout) == golden, f"{GOLDEN.relative_to(ROOT)} is stale: run make helm-render"
    return _by_key(golden)


@pytest.fixture(scope="module")
def example() -> dict[Key, Doc]:
    return _by_key(_docs(EXAMPLE.read_text(encoding="utf-8")))


def _one(docs: dict[Key, Doc], kind: str) -> Doc:
    (doc,) = [doc for key, doc in docs.items() if key[0] == kind]
    return doc


def _pod(docs: dict[Key, Doc]) -> Doc:
    spec: Doc = _one(docs, "DaemonSet")["spec"]["template"]["spec"]
    return spec


def _container(docs: dict[Key, Doc]) -> Doc:
    (container,) = _pod(docs)["containers"]
    return container  # type: ignore[no-any-return]


def test_the_same_objects(chart: dict[Key, Doc], example: dict[Key, Doc]) -> None:
    assert set(chart) == set(example)


def test_the_same_container_args_and_environment(chart: dict[Key, Doc], example: dict[Key, Doc]) -> None:
    assert _container(chart)["args"] == _container(example)["args"]
    assert _container(chart)["env"] == _container(example)["env"]
    assert _container(chart)["image"] == _container(example)["image"]


def _mounts(docs: dict[Key, Doc]) -> dict[str, tuple[Doc, Doc]]:
    """mountPath -> (the mount without its volume's name, the volume's source)."""
    volumes = {volume.pop("name"): volume for volume in yaml.safe_load(yaml.safe_dump(_pod(docs)["volumes"]))}
    mounts = {}
    for mount in _container(docs)["volumeMounts"]:
        mount = dict(mount)
        mounts[mount.pop("mountPath")] = (mount, volumes[mount.pop("name")])
    return mounts


def test_the_same_mounts(chart: dict[Key, Doc], example: dict[Key, Doc]) -> None:
    chart_mounts, example_mounts = _mounts(chart), _mounts(example)
    assert sorted(chart_mounts) == sorted(example_mounts)
    for path, entry in example_mounts.items():
        assert chart_mounts[path] == entry, path
    assert "/var/lib/kubelet/pod-resources" in chart_mounts


def _rules(docs: dict[Key, Doc]) -> dict[Key, list[tuple[tuple[str, ...], ...]]]:
    """Each role's rules, order-free: (apiGroups, resources, resourceNames, verbs) as sorted tuples."""
    fields = ("apiGroups", "resources", "resourceNames", "verbs")
    return {
        key: sorted(tuple(tuple(sorted(rule.get(field, []))) for field in fields) for rule in doc["rules"])
        for key, doc in docs.items()
        if key[0] in ("ClusterRole", "Role")
    }


def test_the_same_rbac(chart: dict[Key, Doc], example: dict[Key, Doc]) -> None:
    assert _rules(chart) == _rules(example)
    for key, doc in example.items():
        if key[0].endswith("Binding"):
            assert chart[key]["roleRef"] == doc["roleRef"], key
            assert chart[key]["subjects"] == doc["subjects"], key
    account = ("ServiceAccount", "kube-system", "ascend-device-plugin")
    assert chart[account]["automountServiceAccountToken"] == example[account]["automountServiceAccountToken"]


@pytest.mark.parametrize(
    "field",
    [
        "nodeSelector",
        "tolerations",
        "priorityClassName",
        "serviceAccountName",
        "automountServiceAccountToken",
        "hostNetwork",
        "securityContext",
    ],
)
def test_the_same_pod_spec(chart: dict[Key, Doc], example: dict[Key, Doc], field: str) -> None:
    assert _pod(chart).get(field) == _pod(example).get(field)
    assert _pod(chart)["priorityClassName"] == "system-node-critical"


@pytest.mark.parametrize(
    "field", ["ports", "livenessProbe", "readinessProbe", "resources", "securityContext", "imagePullPolicy"]
)
def test_the_same_container(chart: dict[Key, Doc], example: dict[Key, Doc], field: str) -> None:
    assert _container(chart)[field] == _container(example)[field]


def _settings(docs: dict[Key, Doc], directory: Path) -> Settings:
    path = directory / "config.yaml"
    path.write_text(_one(docs, "ConfigMap")["data"]["config.yaml"], encoding="utf-8")
    return SettingsSource({}, path).load()


def test_the_same_settings(
    chart: dict[Key, Doc], example: dict[Key, Doc], tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """The chart writes every setting, the example only what differs from the defaults: the agent reads both
    as the same Settings (and the chart's file loads in today's agent: no key it does not know)."""
    for name in [name for name in os.environ if name.startswith("ASCEND_AGENT_")]:
        monkeypatch.delenv(name)
    (tmp_path / "chart").mkdir()
    (tmp_path / "example").mkdir()
    assert _settings(chart, tmp_path / "chart") == _settings(example, tmp_path / "example")


def test_the_chart_is_the_agents_version() -> None:
    version = tomllib.loads((ROOT / "pyproject.toml").read_text(encoding="utf-8"))["project"]["version"]
    assert yaml.safe_load((CHART / "Chart.yaml").read_text(encoding="utf-8"))["appVersion"] == version


def test_make_helm_lint_covers_each_mode() -> None:
    files = {path.name for path in (CHART / "ci").glob("*-values.yaml")}
    for mode in ("default", "volcano", "dra", "no-cluster"):
        assert f"{mode}-values.yaml" in files, mode

"""charts/ascend-agent against examples/daemonset.yaml: the chart's default render installs the same objects,
container args, environment, mounts and RBAC rules.

The renders are Helm's own (charts/check.py on helm-sdkpy, which needs Python >= 3.12), kept in
tests/fixtures/helm/ by `make helm-render`: default.yaml for the chart's defaults, <mode>.yaml for
charts/ascend-agent/ci/<mode>-values.yaml. Where `make helm-lint` has made .venv-helm, the default is
rendered here too and must equal the kept one; elsewhere (a fresh clone's `make test`) the kept renders are
read as they are, and `make helm-lint`, which CI runs next, fails when one is not the engine's.
"""

from __future__ import annotations

import ast
import json
import os
import re
import runpy
import subprocess
import tomllib
from pathlib import Path
from typing import Any

import jsonschema
import pytest
import yaml

from ascend_agent import naming
from ascend_agent.cluster.deviceinfo import NAME_PREFIX as deviceinfo_prefix
from ascend_agent.cluster.ranktable import CONFIGURATION, CONFIGURATION_NPU
from ascend_agent.cluster.volcano_marks import KUBELET_IDS, PREDICATE_TIME, REAL
from ascend_agent.config import Settings, SettingsSource
from ascend_agent.node_summary import NAME_PREFIX as summary_prefix
from tests.support import ROOT

CHART = ROOT / "charts" / "ascend-agent"
RENDERS = ROOT / "tests" / "fixtures" / "helm"
GOLDEN = RENDERS / "default.yaml"
HELM_PYTHON = ROOT / ".venv-helm" / "bin" / "python"
EXAMPLE = ROOT / "examples" / "daemonset.yaml"

Doc = dict[str, Any]
Key = tuple[str, str, str]


def _docs(text: str) -> list[Doc]:
    return [doc for doc in yaml.safe_load_all(text) if doc]


def _by_key(docs: list[Doc]) -> dict[Key, Doc]:
    return {(doc["kind"], doc["metadata"].get("namespace", ""), doc["metadata"]["name"]): doc for doc in docs}


def _helm_render(*args: str | Path) -> list[Doc]:
    """The chart rendered now by Helm's engine (charts/check.py render, .venv-helm's interpreter)."""
    result = subprocess.run(
        [HELM_PYTHON, ROOT / "charts" / "check.py", "render", *args],
        capture_output=True,
        text=True,
        timeout=120,
        stdin=subprocess.DEVNULL,
    )
    assert result.returncode == 0, result.stderr
    return _docs(result.stdout)


@pytest.fixture(scope="module")
def chart() -> dict[Key, Doc]:
    golden = _docs(GOLDEN.read_text(encoding="utf-8"))
    if HELM_PYTHON.exists():
        assert _helm_render() == golden, f"{GOLDEN.relative_to(ROOT)} is stale: run make helm-render"
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


# API Priority and Fairness' objects: the chart's alone (the example installs on releases without them).
FLOW_CONTROL_KINDS = {"FlowSchema", "PriorityLevelConfiguration"}


def test_the_same_objects(chart: dict[Key, Doc], example: dict[Key, Doc]) -> None:
    assert {key for key in chart if key[0] not in FLOW_CONTROL_KINDS} == set(example)


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
        if key[0].startswith("ValidatingAdmissionPolicy"):
            assert chart[key]["spec"] == doc["spec"], key
    for key, doc in example.items():
        if key[0].endswith("RoleBinding"):
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


# --- values.schema.json ---------------------------------------------------------------------------------


def _values_validator() -> jsonschema.Draft7Validator:
    return jsonschema.Draft7Validator(json.loads((CHART / "values.schema.json").read_text(encoding="utf-8")))


def test_the_schemas_config_is_made_from_the_settings() -> None:
    """values.schema.json's config is what charts/schema.py makes of the agent's settings: a setting added
    or changed without `make helm-schema` fails here."""
    made = runpy.run_path(str(ROOT / "charts" / "schema.py"))["generated"]()
    kept = json.loads((CHART / "values.schema.json").read_text(encoding="utf-8"))
    assert kept == made, "charts/ascend-agent/values.schema.json is stale: run make helm-schema"


def _merged(base: Doc, override: Doc) -> Doc:
    """Helm's coalescing of values: maps merge, anything else replaces."""
    merged = dict(base)
    for key, value in override.items():
        both_maps = isinstance(merged.get(key), dict) and isinstance(value, dict)
        merged[key] = _merged(merged[key], value) if both_maps else value
    return merged


def test_the_charts_own_values_pass_its_schema() -> None:
    validator = _values_validator()
    defaults = yaml.safe_load((CHART / "values.yaml").read_text(encoding="utf-8"))
    for path in [None, *sorted((CHART / "ci").glob("*-values.yaml"))]:
        override = yaml.safe_load(path.read_text(encoding="utf-8")) if path else {}
        values = json.loads(json.dumps(_merged(defaults, override or {})))
        assert [error.message for error in validator.iter_errors(values)] == [], path


@pytest.mark.parametrize(
    ("config", "says"),
    [
        ({"hotRest": "idle"}, "'hotRest' was unexpected"),
        ({"hotReset": "on"}, "'on' is not one of ['off', 'idle', 'dry-run']"),
        ({"kubeletDir": "var/lib/kubelet/device-plugins"}, "does not match '^/'"),
    ],
)
def test_a_config_typo_stops_the_install(config: Doc, says: str) -> None:
    """The agent exits 2 on an unknown key or a bad value: the chart refuses them first (`make helm-lint`
    shows Helm's own engine refusing them)."""
    defaults = yaml.safe_load((CHART / "values.yaml").read_text(encoding="utf-8"))
    errors = [
        error.message for error in _values_validator().iter_errors(_merged(defaults, {"config": config}))
    ]
    assert any(says in error for error in errors), errors


# --- the modes behind values, from their kept renders -------------------------------------------------


def _render(mode: str) -> dict[Key, Doc]:
    return _by_key(_docs((RENDERS / f"{mode}.yaml").read_text(encoding="utf-8")))


def _config(docs: dict[Key, Doc]) -> Doc:
    config: Doc = yaml.safe_load(_one(docs, "ConfigMap")["data"]["config.yaml"])
    return config


def _verbs(docs: dict[Key, Doc], group: str, resource: str) -> set[str]:
    """What the agent's roles allow on a resource, wherever they allow it."""
    return {
        verb
        for key, doc in docs.items()
        if key[0] in ("ClusterRole", "Role")
        for rule in doc["rules"]
        if group in rule["apiGroups"] and resource in rule["resources"]
        for verb in rule["verbs"]
    }


_MODE_KEYS = {
    "cluster",
    "deviceInfo",
    "volcano",
    "kubeletApi",
    "draDriverName",
    "draTaintEffect",
    "draCleanup",
}


def test_the_default_writes_no_mode_key(chart: dict[Key, Doc]) -> None:
    """Each mode key is written only when it differs from the agent's default: agents that predate a key
    load the default file."""
    assert not set(_config(chart)) & _MODE_KEYS


def test_volcano_mode() -> None:
    docs, default = _render("volcano"), _render("default")
    assert _config(docs) == _config(default) | {"volcano": True, "volcanoSchedulerName": "volcano"}
    assert _verbs(docs, "", "pods") == {"list", "watch", "patch"}
    assert _verbs(default, "", "pods") == {"list"}, "the doctor's list in its namespace only"
    assert _mounts(docs) == _mounts(default)


def _trusted_by_the_policy(policy: Doc) -> tuple[list[str], str]:
    """The keys the policy's ``trusted`` variable lists, and the prefix it trusts besides."""
    variables = {variable["name"]: variable["expression"] for variable in policy["spec"]["variables"]}
    prefixes = re.findall(r"k\.startsWith\('([^']+)'\)", variables["after"])
    assert len(set(prefixes)) == 1, variables["after"]
    return ast.literal_eval(variables["trusted"]), prefixes[0]


def test_volcano_mode_ships_the_annotation_policy() -> None:
    """The pods' annotations the agent trusts with --volcano (each resource's choice, predicate-time, its own
    marks) may be set or changed only by Volcano's scheduler and the agent: the policy names every key the
    agent's code reads (a key added there and not here fails), and exempts those two identities alone."""
    docs = _render("volcano")
    policy, binding = _named(docs, "volcano-annotations")
    assert binding["spec"] == {"policyName": policy["metadata"]["name"], "validationActions": ["Deny"]}
    assert policy["spec"]["failurePolicy"] == "Fail"
    (rule,) = policy["spec"]["matchConstraints"]["resourceRules"]
    assert set(rule["operations"]) == {"CREATE", "UPDATE"}
    assert {"pods", "pods/*", "bindings"} <= set(rule["resources"]), (
        "pods/status and Bindings change them too"
    )
    (condition,) = policy["spec"]["matchConditions"]
    exempt = re.findall(r"'([^']+)'", condition["expression"])
    account = _one(docs, "ServiceAccount")["metadata"]
    agent = f"system:serviceaccount:{account['namespace']}:{account['name']}"
    assert exempt == ["system:serviceaccount:volcano-system:volcano-scheduler", agent]

    keys, prefix = _trusted_by_the_policy(policy)
    families = {*naming.DEFAULT_FAMILIES.values(), naming.family_for("Ascend910", "910B4", "model")}
    families |= {naming.vnpu_type("Ascend310P", "vir02")}
    resources = {naming.resource_name(family) for family in families}
    resources |= {naming.advertised_resource(resource, 2, True) for resource in resources}
    trusted_by_the_agent = {PREDICATE_TIME, REAL, KUBELET_IDS, CONFIGURATION, CONFIGURATION_NPU, *resources}
    assert {key for key in trusted_by_the_agent if key not in keys and not key.startswith(prefix)} == set()
    for mode in ("default", "dra", "no-cluster", "plugin-watcher"):
        assert not [key for key in _render(mode) if key[2].endswith("-volcano-annotations")], mode


# Where the API server puts the node a pod-bound ServiceAccount token names (the user's extra).
NODE_NAME_EXTRA = "authentication.kubernetes.io/node-name"


def _named(docs: dict[Key, Doc], suffix: str) -> tuple[Doc, Doc]:
    """The ValidatingAdmissionPolicy whose name ends in ``suffix`` and its binding."""
    (policy,) = [
        doc for key, doc in docs.items() if key[0] == "ValidatingAdmissionPolicy" and key[2].endswith(suffix)
    ]
    (binding,) = [
        doc
        for key, doc in docs.items()
        if key[0] == "ValidatingAdmissionPolicyBinding" and key[2].endswith(suffix)
    ]
    return policy, binding


def test_each_agent_may_write_only_its_own_nodes_config_maps() -> None:
    """The Role grants configmaps writes in all of kube-system; the policy narrows them to the two maps the
    agent's code names after its node, by the node its pod-bound token carries."""
    for mode in ("default", "volcano", "dra", "plugin-watcher"):
        docs = _render(mode)
        policy, binding = _named(docs, "-own-configmaps")
        assert binding["spec"] == {"policyName": policy["metadata"]["name"], "validationActions": ["Deny"]}
        spec = policy["spec"]
        assert spec["failurePolicy"] == "Fail"
        (rule,) = spec["matchConstraints"]["resourceRules"]
        assert rule["resources"] == ["configmaps"] and set(rule["operations"]) == {
            "CREATE",
            "UPDATE",
            "DELETE",
        }
        account = _one(docs, "ServiceAccount")["metadata"]
        who, bound = (condition["expression"] for condition in spec["matchConditions"])
        assert f"'system:serviceaccount:{account['namespace']}:{account['name']}'" in who
        assert "request.namespace == 'kube-system'" in who and NODE_NAME_EXTRA in bound
        (check,) = spec["validations"]
        assert re.findall(r"'([^']+)' \+ variables.node", check["expression"]) == [
            summary_prefix,
            deviceinfo_prefix,
        ]
    assert not [key for key in _render("no-cluster") if key[0].startswith("ValidatingAdmissionPolicy")]


def test_the_example_annotation_policy_is_the_charts() -> None:
    """examples/volcano/annotation-policy.yaml, for a kubectl install, makes the chart's objects."""
    example = _by_key(
        _docs((ROOT / "examples" / "volcano" / "annotation-policy.yaml").read_text(encoding="utf-8"))
    )
    chart = {key: doc for key, doc in _render("volcano").items() if key[2].endswith("-volcano-annotations")}
    assert set(example) == set(chart)
    for key, doc in chart.items():
        assert example[key]["spec"] == doc["spec"], key


def test_dra_mode() -> None:
    docs, default = _render("dra"), _render("default")
    assert _config(docs) == _config(default) | {
        "kubeletApi": "dra",
        "draDriverName": "npu.huawei.com",
        "draTaintEffect": "NoExecute",
        "draCleanup": False,
        "deviceInfo": False,  # as examples/dra: the scheduler reads ResourceSlices
    }
    # No ConfigMap updates for Volcano; the node summary's create and patch only.
    assert not _verbs(docs, "", "configmaps") - {"get", "list", "watch", "create", "patch"}
    dra_example = _by_key(_docs((ROOT / "examples" / "dra" / "daemonset.yaml").read_text(encoding="utf-8")))
    for resource in ("resourceslices", "resourceclaims", "resourceclaims/status", "resourceclaims/driver"):
        assert _verbs(docs, "resource.k8s.io", resource) == _verbs(dra_example, "resource.k8s.io", resource)
    assert not _verbs(default, "resource.k8s.io", "resourceslices")
    mounts = _mounts(docs)
    assert "/var/lib/kubelet/device-plugins" not in mounts
    for path in ("/var/lib/kubelet/plugins", "/var/lib/kubelet/plugins_registry"):
        mount, volume = mounts[path]
        assert volume == {"hostPath": {"path": path, "type": "Directory"}}, "never create the kubelet's own"
        assert not mount.get("readOnly")
    # The agent's lock directory is inside the plugins mount.
    assert "/var/lib/kubelet/plugins/ascend-agent" not in mounts
    assert "/var/lib/kubelet/pod-resources" in mounts
    # The doctor in the pod reads this DaemonSet (its DRA-mode default is the example's name), as granted.
    daemonset = _one(docs, "DaemonSet")["metadata"]
    env = {e["name"]: e.get("value") for e in _container(docs)["env"]}
    assert (env["ASCEND_AGENT_DAEMONSET_NAME"], env["ASCEND_AGENT_DAEMONSET_NAMESPACE"]) == (
        daemonset["name"],
        daemonset["namespace"],
    )
    rules = [
        rule
        for key, doc in docs.items()
        if key[:2] == ("Role", daemonset["namespace"])
        for rule in doc["rules"]
    ]
    assert {"apiGroups": ["apps"], "resources": ["daemonsets"], "resourceNames": [daemonset["name"]],
            "verbs": ["get"]} in rules  # fmt: skip
    assert _verbs(docs, "", "pods") == {"list"} and "list" in _verbs(
        docs, "resource.k8s.io", "resourceslices"
    )
    # Rolling updates: each pod's sockets named after its UID, the new pod serving before the old one stops.
    (uid,) = [e for e in _container(docs)["env"] if e["name"] == "POD_UID"]
    assert uid["valueFrom"] == {"fieldRef": {"fieldPath": "metadata.uid"}}
    assert _one(docs, "DaemonSet")["spec"]["updateStrategy"] == {
        "type": "RollingUpdate",
        "rollingUpdate": {"maxSurge": 1, "maxUnavailable": 0},
    }
    assert "POD_UID" not in {e["name"] for e in _container(default)["env"]}, "device plugins: one instance"


def test_no_cluster_mode() -> None:
    docs, default = _render("no-cluster"), _render("default")
    assert _config(docs) == _config(default) | {"cluster": False}
    assert _verbs(docs, "", "nodes") == {"get"}, "the doctor's read only"
    assert not _verbs(docs, "", "events") and not _verbs(docs, "", "configmaps")
    assert "/var/lib/kubelet/pod-resources" not in _mounts(docs)
    assert set(_mounts(docs)) == set(_mounts(default)) - {"/var/lib/kubelet/pod-resources"}


def test_plugin_watcher_mode() -> None:
    docs = _render("plugin-watcher")
    assert _config(docs)["registration"] == "plugin-watcher"
    _, volume = _mounts(docs)["/var/lib/kubelet/plugins_registry"]
    assert volume == {"hostPath": {"path": "/var/lib/kubelet/plugins_registry", "type": "Directory"}}
    # metricsAddress "" turns the endpoint off: no port, no probes, no scrape annotations.
    container = _container(docs)
    assert not {"ports", "livenessProbe", "readinessProbe"} & set(container)
    annotations = _one(docs, "DaemonSet")["spec"]["template"]["metadata"]["annotations"]
    assert not any(key.startswith("prometheus.io/") for key in annotations)


def test_every_mode_has_its_render() -> None:
    modes = {path.name.removesuffix("-values.yaml") for path in (CHART / "ci").glob("*-values.yaml")}
    assert {path.stem for path in RENDERS.glob("*.yaml")} == modes


# --- API Priority and Fairness ----------------------------------------------------------------------------

# The built-in FlowSchemas the agents' must come between: kube-system-service-accounts (every ServiceAccount
# of kube-system to workload-high, with the scheduler and the controllers) and those of the control plane.
KUBE_SYSTEM_SERVICE_ACCOUNTS = 900
KUBE_SCHEDULER = 800


def test_flow_control_puts_the_agents_account_in_a_level_of_its_own(chart: dict[Key, Doc]) -> None:
    schema, level = _one(chart, "FlowSchema"), _one(chart, "PriorityLevelConfiguration")
    account = _one(chart, "ServiceAccount")["metadata"]
    (rule,) = schema["spec"]["rules"]
    assert rule["subjects"] == [
        {
            "kind": "ServiceAccount",
            "serviceAccount": {"name": account["name"], "namespace": account["namespace"]},
        }
    ]
    assert rule["resourceRules"] == [
        {"verbs": ["*"], "apiGroups": ["*"], "resources": ["*"], "clusterScope": True, "namespaces": ["*"]}
    ]
    assert rule["nonResourceRules"] == [{"verbs": ["*"], "nonResourceURLs": ["*"]}]
    assert schema["spec"]["priorityLevelConfiguration"] == {"name": level["metadata"]["name"]}
    assert KUBE_SCHEDULER < schema["spec"]["matchingPrecedence"] < KUBE_SYSTEM_SERVICE_ACCOUNTS

    flow = yaml.safe_load((CHART / "values.yaml").read_text(encoding="utf-8"))["flowControl"]
    assert schema["spec"]["distinguisherMethod"] == {"type": flow["distinguisherMethod"]}
    assert level["spec"] == {
        "type": "Limited",
        "limited": {
            "nominalConcurrencyShares": flow["nominalConcurrencyShares"],
            "lendablePercent": flow["lendablePercent"],
            "borrowingLimitPercent": flow["borrowingLimitPercent"],
            "limitResponse": {"type": "Queue", "queuing": flow["queuing"]},
        },
    }
    for mode in ("dra", "no-cluster", "plugin-watcher", "volcano"):
        assert {key[0] for key in _render(mode)} >= FLOW_CONTROL_KINDS, mode


@pytest.mark.parametrize(
    ("args", "values"),
    [
        pytest.param([], {"flowControl": {"enabled": False}}, id="flowControl.enabled=false"),
        pytest.param(["--unserved", "flowcontrol.apiserver.k8s.io/v1"], {}, id="no-flowcontrol-v1"),
    ],
)
def test_flow_control_left_out(tmp_path: Path, args: list[str], values: Doc) -> None:
    """Switched off, or on an API server without flowcontrol v1 (before 1.29), the chart renders the rest and
    none of the flow control objects, with no error."""
    if not HELM_PYTHON.exists():
        pytest.skip("needs Helm's engine in .venv-helm (make helm-lint, which checks the same)")
    path = tmp_path / "values.yaml"
    path.write_text(yaml.safe_dump(values), encoding="utf-8")
    kinds = {doc["kind"] for doc in _helm_render(*args, path)}
    assert "DaemonSet" in kinds and not kinds & FLOW_CONTROL_KINDS


@pytest.mark.parametrize(
    ("flow", "says"),
    [
        ({"enabled": "yes"}, "'yes' is not of type 'boolean'"),
        ({"nominalConcurrencyShares": "10"}, "'10' is not of type 'integer'"),
        ({"lendablePercent": 150}, "150 is greater than the maximum of 100"),
        ({"matchingPrecedence": 1}, "1 is less than the minimum of 2"),
        ({"distinguisherMethod": "ByPod"}, "'ByPod' is not one of ['ByUser', 'ByNamespace']"),
        (
            {"queuing": {"queues": 16, "handSize": 16, "queueLengthLimit": 200}},
            "16 is greater than the maximum of 8",
        ),
        ({"queueLengthLimit": 200}, "'queueLengthLimit' was unexpected"),
    ],
)
def test_flow_control_values_are_checked(flow: Doc, says: str) -> None:
    defaults = yaml.safe_load((CHART / "values.yaml").read_text(encoding="utf-8"))
    errors = [
        error.message for error in _values_validator().iter_errors(_merged(defaults, {"flowControl": flow}))
    ]
    assert any(says in error for error in errors), errors


# --- monitoring: the alert rules, a PodMonitor and the Grafana dashboard ---------------------------------

MONITORING_KINDS = {"PrometheusRule", "PodMonitor"}


def test_monitoring_objects_are_off_by_default(chart: dict[Key, Doc]) -> None:
    """The Prometheus Operator's CRDs may not exist: nothing of it unless the values ask."""
    assert not {key[0] for key in chart} & MONITORING_KINDS
    assert [key for key in chart if key[0] == "ConfigMap"] == [
        ("ConfigMap", "kube-system", "ascend-device-plugin-config")
    ]


def test_monitoring_mode() -> None:
    docs = _render("monitoring")
    rules = yaml.safe_load((CHART / "files" / "alert-rules.yaml").read_text(encoding="utf-8"))
    assert _one(docs, "PrometheusRule")["spec"] == rules

    monitor = _one(docs, "PodMonitor")
    pod = _one(docs, "DaemonSet")["spec"]["template"]
    (endpoint,) = monitor["spec"]["podMetricsEndpoints"]
    (port,) = _container(docs)["ports"]
    assert (endpoint["port"], endpoint["path"]) == (port["name"], "/metrics")
    assert endpoint["honorLabels"] is True, "the chip holders' namespace, pod and container kept"
    assert monitor["spec"]["selector"]["matchLabels"].items() <= pod["metadata"]["labels"].items()
    assert monitor["spec"]["namespaceSelector"] == {"matchNames": [monitor["metadata"]["namespace"]]}
    assert _one(docs, "PrometheusRule")["metadata"]["labels"]["release"] == "kube-prometheus-stack"

    (dashboard,) = [
        doc for key, doc in docs.items() if key[0] == "ConfigMap" and key[2].endswith("-dashboard")
    ]
    assert dashboard["metadata"]["labels"]["grafana_dashboard"] == "1"
    (text,) = dashboard["data"].values()
    assert json.loads(text) == json.loads((CHART / "files" / "dashboard.json").read_text(encoding="utf-8"))


@pytest.mark.parametrize(
    ("values", "says"),
    [
        ({"podMonitor": {"enabled": True, "interval": "30"}}, "'30' does not match"),
        # Unquoted, YAML's 1 is a number: Kubernetes takes only strings as label values.
        ({"grafanaDashboard": {"labels": {"grafana_dashboard": 1}}}, "1 is not of type 'string'"),
        ({"prometheusRule": {"enabled": True, "label": {"release": "x"}}}, "'label' was unexpected"),
    ],
)
def test_monitoring_values_are_checked(values: Doc, says: str) -> None:
    defaults = yaml.safe_load((CHART / "values.yaml").read_text(encoding="utf-8"))
    errors = [error.message for error in _values_validator().iter_errors(_merged(defaults, values))]
    assert any(says in error for error in errors), errors

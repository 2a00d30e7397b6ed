"""The chart through Helm's own engine: helm-sdkpy, Helm v4's Go library (Python >= 3.12, from .venv-helm).

    python charts/check.py lint              # what `make helm-lint` runs: every case below, one line each
    python charts/check.py render [VALUES]   # the rendered objects as YAML on stdout (default values if none)
    python charts/check.py render --unserved GROUP/VERSION [VALUES]   # the same on an API server without it
    python charts/check.py write-renders     # what `make helm-render` runs: each case's render into RENDERS,
                                             # and examples/volcano/annotation-policy.yaml

A case is the chart's defaults, or the defaults with one values file of charts/ascend-agent/ci/ over them.
For each: ``helm lint`` (warnings fail, as with --strict), an install with the values against an in-memory
Kubernetes API server (kmock's emulator) with the release kept in memory, each installed object checked
against the Kubernetes schemas (kubernetes-validate, strict), and the objects the server holds compared
with the release's manifest; then the values and API servers with which objects must be left out, and the
values the chart must refuse. Each case's objects must equal its render kept in tests/fixtures/helm/, which
tests/unit/test_chart.py reads in `make test` without Helm (the default one against examples/daemonset.yaml),
and the volcano case's admission policy examples/volcano/annotation-policy.yaml, the same objects for a
kubectl install, made from the release's manifest text (the template's comments kept).
"""

from __future__ import annotations

import asyncio
import json
import os
import re
import shutil
import sys
import tempfile
import time
from collections.abc import Mapping
from pathlib import Path
from typing import Any, NamedTuple

import yaml

ROOT = Path(__file__).resolve().parent.parent
CHART = ROOT / "charts" / "ascend-agent"
# The renders tests/unit/test_chart.py reads: default.yaml, and <name>.yaml for ci/<name>-values.yaml.
RENDERS = ROOT / "tests" / "fixtures" / "helm"
RELEASE = "ascend-agent"
NAMESPACE = "kube-system"
KUBERNETES = "1.31"
# examples/volcano/annotation-policy.yaml: the volcano case's admission policy, for a kubectl install, as the
# manifest text has it but for the labels only a Helm release has.
EXAMPLE_POLICY = ROOT / "examples" / "volcano" / "annotation-policy.yaml"
_EXAMPLE_POLICY_CASE = "ci/volcano-values.yaml"
_POLICY_SOURCE = "# Source: ascend-agent/templates/volcano-policy.yaml\n"
_RELEASE_LABELS = re.compile(
    r"^ +(app\.kubernetes\.io/(instance|version|managed-by)|helm\.sh/chart): .*\n", re.M
)
_EXAMPLE_POLICY_HEAD = """\
# Made by `make helm-render` from the chart's volcano.annotationPolicy (charts/ascend-agent/templates/
# volcano-policy.yaml, values ci/volcano-values.yaml): change the chart, not this file.
#
# The pod annotations ascend-agent trusts with --volcano (predicate-time, huawei.com/Ascend*, huawei.com/npu,
# huawei.com/kltDev, the ascend-*-configuration): only Volcano's scheduler (its ServiceAccount
# volcano-system/volcano-scheduler, as Volcano installs it) and the agent (kube-system/ascend-device-plugin)
# may set or change them, on a pod or through a Binding; anyone else's create or update that does is refused.
# Kubernetes 1.30 or later. Where your ServiceAccounts differ, install the chart with yours
# (volcano.annotationPolicy.schedulerServiceAccount) or edit them in a copy: matchConditions and the message.
#
#   kubectl apply -f examples/volcano/annotation-policy.yaml
"""
# Helm's lint severities (pkg/lint/support): 1 info, 2 warning, 3 error.
_WARNING = 2
_SEVERITIES = {1: "info", 2: "warning", 3: "error"}

# The release goes to Helm's in-memory storage driver: the emulator stores objects as JSON, and Helm writes
# its release Secret as protobuf. Helm's Go runtime sees the environment the process started with, not
# later changes to os.environ: hence a new process when it is not set.
if os.environ.get("HELM_DRIVER") != "memory":
    os.execve(sys.executable, [sys.executable, *sys.argv], {**os.environ, "HELM_DRIVER": "memory"})

import helm_sdkpy  # noqa: E402
import kmock  # noqa: E402
import kubernetes_validate  # noqa: E402


class CheckFailed(Exception):
    """One line saying which case failed and why."""


def merge(base: Any, override: Any) -> Any:
    """Helm's coalescing of a values file over the chart's values: maps merge, anything else replaces, and
    null deletes the key."""
    if not isinstance(base, dict) or not isinstance(override, dict):
        return override
    merged = dict(base)
    for key, value in override.items():
        if value is None:
            merged.pop(key, None)
        else:
            merged[key] = merge(base.get(key), value)
    return merged


def _load(path: Path) -> dict[str, Any]:
    loaded = yaml.safe_load(path.read_text(encoding="utf-8")) or {}
    if not isinstance(loaded, dict):
        raise CheckFailed(f"{path.relative_to(ROOT)}: a values file must be a mapping")
    return loaded


def _kubeconfig(directory: Path, server: str) -> Path:
    path = directory / "kubeconfig"
    config = {
        "apiVersion": "v1",
        "kind": "Config",
        "clusters": [{"name": "emulator", "cluster": {"server": server}}],
        "users": [{"name": "helm", "user": {"token": "unused"}}],
        "contexts": [{"name": "emulator", "context": {"cluster": "emulator", "user": "helm"}}],
        "current-context": "emulator",
    }
    path.write_text(yaml.safe_dump(config), encoding="utf-8")
    return path


# The Prometheus Operator's resources the chart's monitoring values install, as a cluster with its CRDs serves
# them; kubernetes-validate has no schema of custom resources, so their objects are checked by
# tests/unit/test_chart.py alone.
MONITORING = "monitoring.coreos.com/v1"
PROMETHEUS_OPERATOR = {
    "kind": "APIResourceList",
    "groupVersion": MONITORING,
    "resources": [
        {"name": name, "singularName": name.removesuffix("s"), "namespaced": True, "kind": kind,
         "verbs": ["create", "delete", "deletecollection", "get", "list", "patch", "update", "watch"]}
        for name, kind in (("podmonitors", "PodMonitor"), ("prometheusrules", "PrometheusRule"))
    ],
}  # fmt: skip


async def _emulator_fixes(
    k8s: kmock.KubernetesEmulator, server: kmock.Server, unserved: tuple[str, ...] = ()
) -> None:
    """Discovery as a real API server gives it: kmock names the core group version "/v1" (client-go's REST
    mapper then finds no ConfigMap), and its bundled server version is older than the schemas we check.
    The group versions in ``unserved`` are left out, as an older release's API server does."""
    k8s.resources.load_bundled()
    k8s.resources.load_data(json.dumps([PROMETHEUS_OPERATOR]))
    for resource in [r for r in k8s.resources if f"{r.group}/{r.version}" in unserved]:
        del k8s.resources[resource]
    async with server.client.get("/api/v1") as response:
        core = await response.json()
    core["groupVersion"] = "v1"
    k8s["get /api/v1"] << core
    major, minor = KUBERNETES.split(".")
    k8s["get /version"] << {"major": major, "minor": minor, "gitVersion": f"v{KUBERNETES}.0"}


def _key(doc: dict[str, Any]) -> tuple[str, str, str]:
    return doc["kind"], doc["metadata"].get("namespace", ""), doc["metadata"]["name"]


class Installed(NamedTuple):
    text: str  # the release's manifest as Helm rendered it, the templates' comments in it
    manifest: list[dict[str, Any]]  # its objects
    stored: list[Any]  # the objects the API server holds afterwards


async def install(values: dict[str, Any], unserved: tuple[str, ...] = ()) -> Installed:
    async with kmock.KubernetesEmulator() as k8s, kmock.Server(k8s) as server:
        await _emulator_fixes(k8s, server, unserved)
        with tempfile.TemporaryDirectory(prefix="helm-check-") as scratch:
            kubeconfig = _kubeconfig(Path(scratch), f"http://{server.host}:{server.port}")
            config = helm_sdkpy.Configuration(namespace=NAMESPACE, kubeconfig=str(kubeconfig))
            try:
                release = await helm_sdkpy.Install(config).run(RELEASE, str(CHART), values=values, wait=False)
            except helm_sdkpy.HelmError as error:
                message = " ".join(str(error).split())
                raise CheckFailed(message if len(message) < 400 else message[:400] + "...") from None
        stored = list(k8s.objects.values())
    manifest = [doc for doc in yaml.safe_load_all(release["manifest"]) if doc]
    return Installed(release["manifest"], manifest, stored)


def lint(values: dict[str, Any]) -> list[str]:
    """Helm's lint of the chart with these values: its findings of warning or worse as 'path: severity'.
    helm-sdkpy lints a chart directory with its own values.yaml, so a copy carries the merged values; it
    passes severities and paths but not the messages' text (``helm lint`` shows that)."""
    with tempfile.TemporaryDirectory(prefix="helm-lint-") as scratch:
        copy = Path(scratch) / CHART.name
        shutil.copytree(CHART, copy)
        (copy / "values.yaml").write_text(yaml.safe_dump(values, sort_keys=False), encoding="utf-8")
        config = helm_sdkpy.Configuration(namespace=NAMESPACE)
        result = asyncio.run(helm_sdkpy.Lint(config).run(str(copy)))
    if result.get("TotalChartsLinted") != 1:
        return [f"linted {result.get('TotalChartsLinted')} charts, expected 1"]
    return [
        f"{message['Path']}: {_SEVERITIES.get(message['Severity'], message['Severity'])}"
        for message in result.get("Messages") or []
        if message["Severity"] >= _WARNING
    ]


def validate(docs: list[dict[str, Any]]) -> None:
    for doc in docs:
        if doc["apiVersion"] == MONITORING:
            continue
        try:
            kubernetes_validate.validate(doc, KUBERNETES, strict=True)
        except kubernetes_validate.ValidationError as error:
            kind, namespace, name = _key(doc)
            path = ".".join(str(part) for part in error.path)
            raise CheckFailed(f"{kind} {namespace}/{name}: {path}: {error.message}") from None


def _plain(value: Any) -> Any:
    """kmock's views of stored objects as plain dicts and lists."""
    if isinstance(value, Mapping):
        return {key: _plain(item) for key, item in value.items()}
    if isinstance(value, list | tuple):
        return [_plain(item) for item in value]
    return value


# What Helm adds to each object it applies: its ownership annotations.
_HELM_ANNOTATIONS = ("meta.helm.sh/release-name", "meta.helm.sh/release-namespace")


def _as_written(stored: Any) -> dict[str, Any]:
    """A stored object without Helm's ownership annotations, as the chart wrote it."""
    doc: dict[str, Any] = _plain(stored)
    metadata = doc["metadata"]
    annotations = metadata.pop("annotations", {})
    if {annotations.get(key) for key in _HELM_ANNOTATIONS} != {RELEASE, NAMESPACE}:
        raise CheckFailed(f"{doc['kind']} {metadata['name']} was stored without Helm's ownership annotations")
    annotations = {key: value for key, value in annotations.items() if key not in _HELM_ANNOTATIONS}
    if annotations:
        metadata["annotations"] = annotations
    return doc


class Case:
    """The chart's values.yaml, or one values file of ci/ over it, and the render kept of it in RENDERS."""

    def __init__(self, name: str, values: dict[str, Any], render: Path) -> None:
        self.name, self.values, self.render = name, values, render


def cases() -> list[Case]:
    defaults = _load(CHART / "values.yaml")
    found = [Case("values.yaml", defaults, RENDERS / "default.yaml")]
    for path in sorted((CHART / "ci").glob("*-values.yaml")):
        render = RENDERS / f"{path.name.removesuffix('-values.yaml')}.yaml"
        found.append(Case(f"ci/{path.name}", merge(defaults, _load(path)), render))
    return found


def check(case: Case) -> str:
    # The install first: its errors carry Helm's message, lint's only where they are.
    text, manifest, stored = asyncio.run(install(case.values))
    findings = lint(case.values)
    if findings:
        raise CheckFailed(f"helm lint: {', '.join(findings)}")
    if not manifest:
        raise CheckFailed("the chart rendered no objects")
    validate(manifest)
    wanted = {_key(doc): doc for doc in manifest}
    held = {_key(doc): _as_written(doc) for doc in stored}
    if set(wanted) != set(held):
        raise CheckFailed(f"installed {sorted(held)}, the manifest has {sorted(wanted)}")
    for key, doc in wanted.items():
        if held[key] != doc:
            raise CheckFailed(f"{key[0]} {key[2]}: the API server holds {held[key]}, the manifest has {doc}")
    kept = case.render.relative_to(ROOT)
    if not case.render.exists() or _docs(case.render.read_text(encoding="utf-8")) != manifest:
        raise CheckFailed(f"{kept} is not this render: run make helm-render")
    if case.name == _EXAMPLE_POLICY_CASE and EXAMPLE_POLICY.read_text(encoding="utf-8") != example_policy(
        text
    ):
        raise CheckFailed(f"{EXAMPLE_POLICY.relative_to(ROOT)} is not this render: run make helm-render")
    kinds = sorted(doc["kind"] for doc in manifest)
    return f"{len(manifest)} objects ({', '.join(kinds)}), as {kept}"


# Values the chart must refuse, with (part of) the one line it says.
REFUSED: list[tuple[dict[str, Any], str]] = [
    ({"cluster": {"enabled": False}, "volcano": {"enabled": True}}, "volcano.enabled needs cluster.enabled"),
    ({"cluster": {"enabled": False}, "dra": {"enabled": True}}, "dra.enabled needs cluster.enabled"),
    ({"volcano": {"enable": True}}, "additional properties 'enable' not allowed"),
    ({"dra": {"taintEffect": "NoEvict"}}, "taintEffect"),
    ({"config": {"hotRest": "idle"}}, "additional properties 'hotRest' not allowed"),
    ({"config": {"hotReset": "on"}}, "at '/config/hotReset'"),
    ({"config": {"fakeChips": "8"}}, "at '/config/fakeChips'"),
    ({"flowControl": {"nominalConcurrencyShares": "10"}}, "at '/flowControl/nominalConcurrencyShares'"),
    ({"flowControl": {"queuing": {"queues": 4, "handSize": 8}}}, "handSize must not be greater than"),
    ({"podMonitor": {"enabled": True}, "config": {"metricsAddress": ""}}, "podMonitor.enabled needs"),
    (
        {"grafanaDashboard": {"labels": {"grafana_dashboard": 1}}},
        "at '/grafanaDashboard/labels/grafana_dashboard'",
    ),
]


FLOW_CONTROL = "flowcontrol.apiserver.k8s.io/v1"
_FLOW_CONTROL_KINDS = {"FlowSchema", "PriorityLevelConfiguration"}
_POLICY_KINDS = {"ValidatingAdmissionPolicy", "ValidatingAdmissionPolicyBinding"}
# Values over the defaults, and group versions the API server does not serve, with which the chart must render
# none of these kinds.
LEFT_OUT: list[tuple[dict[str, Any], tuple[str, ...], set[str]]] = [
    ({"flowControl": {"enabled": False}}, (), _FLOW_CONTROL_KINDS),
    ({}, (FLOW_CONTROL,), _FLOW_CONTROL_KINDS),
    ({}, (), {"PrometheusRule", "PodMonitor"}),
    ({"configMapPolicy": {"enabled": False}}, (), _POLICY_KINDS),
]


def check_left_out(override: dict[str, Any], unserved: tuple[str, ...], kinds: set[str]) -> None:
    values = merge(_load(CHART / "values.yaml"), override)
    rendered = {doc["kind"] for doc in asyncio.run(install(values, unserved)).manifest}
    if not rendered:
        raise CheckFailed(f"{override} without {list(unserved)} rendered no objects")
    if rendered & kinds:
        raise CheckFailed(f"{override} without {list(unserved)} rendered {sorted(rendered & kinds)}")


def check_refused(override: dict[str, Any], says: str) -> None:
    values = merge(_load(CHART / "values.yaml"), override)
    try:
        asyncio.run(install(values))
    except CheckFailed as error:
        if says not in str(error):
            raise CheckFailed(f"{override} was refused without saying {says!r}: {error}") from None
    else:
        raise CheckFailed(f"{override} was installed; the chart must refuse it ({says})")


def _docs(text: str) -> list[dict[str, Any]]:
    return [doc for doc in yaml.safe_load_all(text) if doc]


class _Dumper(yaml.SafeDumper):
    """Multi-line strings (the ConfigMap's config.yaml) as literal blocks, readable in a diff."""


def _represent_str(dumper: yaml.SafeDumper, text: str) -> yaml.ScalarNode:
    return dumper.represent_scalar("tag:yaml.org,2002:str", text, style="|" if "\n" in text else None)


_Dumper.add_representer(str, _represent_str)


def render(values: dict[str, Any], unserved: tuple[str, ...] = ()) -> str:
    return _dumped(asyncio.run(install(values, unserved)).manifest)


def _dumped(manifest: list[dict[str, Any]]) -> str:
    return yaml.dump_all(manifest, Dumper=_Dumper, sort_keys=False)


def example_policy(manifest: str) -> str:
    """examples/volcano/annotation-policy.yaml from a release's manifest text: the admission policy's
    documents as rendered, without Helm's source lines and release labels."""
    docs = [doc.lstrip("\n") for doc in manifest.split("---\n")]
    policy = [
        _RELEASE_LABELS.sub("", doc.removeprefix(_POLICY_SOURCE))
        for doc in docs
        if doc.startswith(_POLICY_SOURCE)
    ]
    if not policy:
        raise CheckFailed(f"{_EXAMPLE_POLICY_CASE} renders no admission policy")
    return _EXAMPLE_POLICY_HEAD + "".join(f"---\n{doc.rstrip()}\n" for doc in policy)


def write_renders() -> None:
    """Each case's render into RENDERS, and nothing else there; the volcano case's admission policy into
    EXAMPLE_POLICY."""
    RENDERS.mkdir(parents=True, exist_ok=True)
    wanted: dict[Path, str] = {}
    for case in cases():
        installed = asyncio.run(install(case.values))
        wanted[case.render] = _dumped(installed.manifest)
        if case.name == _EXAMPLE_POLICY_CASE:
            wanted[EXAMPLE_POLICY] = example_policy(installed.text)
    for stale in set(RENDERS.glob("*.yaml")) - set(wanted):
        stale.unlink()
    for path, text in wanted.items():
        path.write_text(text, encoding="utf-8")
        print(f"wrote {path.relative_to(ROOT)}")


def main(argv: list[str]) -> int:
    try:
        if argv[:1] == ["render"]:
            unserved: tuple[str, ...] = ()
            if argv[1:2] == ["--unserved"] and len(argv) >= 3:
                unserved, argv = (argv[2],), ["render", *argv[3:]]
            if len(argv) <= 2:
                values = _load(CHART / "values.yaml")
                if len(argv) == 2:
                    values = merge(values, _load(Path(argv[1])))
                sys.stdout.write(render(values, unserved))
                return 0
        if argv == ["write-renders"]:
            write_renders()
            return 0
        if argv != ["lint"]:
            print(
                "usage: check.py lint | check.py render [--unserved GROUP/VERSION] [VALUES]"
                " | check.py write-renders",
                file=sys.stderr,
            )
            return 2
        engine = f"helm-sdkpy {helm_sdkpy.__version__} ({helm_sdkpy.get_version()})"
        print(f"{engine}, Kubernetes {KUBERNETES} schemas")
        failed = 0
        for case in cases():
            started = time.monotonic()
            try:
                summary = check(case)
            except CheckFailed as error:
                failed += 1
                print(f"FAIL {case.name}: {error}")
            else:
                print(f"ok   {case.name}: {summary} in {time.monotonic() - started:.2f} s")
        started = time.monotonic()
        for override, unserved, kinds in LEFT_OUT:
            try:
                check_left_out(override, unserved, kinds)
            except CheckFailed as error:
                failed += 1
                print(f"FAIL left out: {error}")
        print(f"ok   {len(LEFT_OUT)} sets of objects left out in {time.monotonic() - started:.2f} s")
        started = time.monotonic()
        for override, says in REFUSED:
            try:
                check_refused(override, says)
            except CheckFailed as error:
                failed += 1
                print(f"FAIL refused values: {error}")
        print(f"ok   {len(REFUSED)} sets of refused values refused in {time.monotonic() - started:.2f} s")
        return 1 if failed else 0
    except CheckFailed as error:
        print(f"check.py: {error}", file=sys.stderr)
        return 1


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))

"""The deployment files: the Kubernetes manifests against the 1.31 schemas (offline, strict) and against the
CLI they drive, examples/config.yaml against Settings, and the Containerfile's pinning."""

from __future__ import annotations

import copy
import dataclasses
import json
import os
import re
import shlex
import subprocess
import tomllib
from pathlib import Path, PurePosixPath
from typing import Any

import kubernetes_validate
import pytest
import yaml
from typer.main import get_command

from ascend_agent.cli import app
from ascend_agent.config import Settings, SettingsSource, camel_case, read_config_file
from tests.support import ROOT
from tests.support.manifests import documents
from tests.support.rbac import grants

EXAMPLES = ROOT / "examples"
CONFIG = EXAMPLES / "config.yaml"
CONTAINERFILE = ROOT / "Containerfile"
KUBERNETES = "1.31"
PYPROJECT = tomllib.loads((ROOT / "pyproject.toml").read_text(encoding="utf-8"))
VERSION = PYPROJECT["project"]["version"]

Doc = dict[str, Any]


MANIFESTS = documents(path for path in sorted(EXAMPLES.glob("*.yaml")) if path != CONFIG)


def _one(kind: str, file: str | None = None) -> Doc:
    docs = [doc for name, doc in MANIFESTS if doc["kind"] == kind and (file is None or name.startswith(file))]
    assert len(docs) == 1, f"expected one {kind}, found {len(docs)}"
    return docs[0]


def _run_command() -> Any:
    """``ascend-agent run`` as the command-line library sees it (typer vendors its own click)."""
    return get_command(app).commands["run"]  # type: ignore[attr-defined]


RUN = _run_command()
RUN_OPTIONS = {opt: param for param in RUN.params if param.param_type_name == "option" for opt in param.opts}


# --- Kubernetes schemas -------------------------------------------------------------------------------


def test_the_examples_hold_the_expected_documents() -> None:
    kinds = sorted(doc["kind"] for _, doc in MANIFESTS)
    for kind in ("DaemonSet", "ConfigMap", "Pod", "ServiceAccount", "ClusterRole", "ClusterRoleBinding"):
        assert kind in kinds


@pytest.mark.parametrize("doc", [doc for _, doc in MANIFESTS], ids=[name for name, _ in MANIFESTS])
def test_manifest_is_valid_for_kubernetes_1_31(doc: Doc) -> None:
    assert kubernetes_validate.validate(doc, KUBERNETES, strict=True) == KUBERNETES


@pytest.mark.parametrize(
    "spoil",
    [
        pytest.param(lambda c: c["securityContext"].update(readOnlyRootFilesytem=True), id="unknown-field"),
        pytest.param(lambda c: c["ports"][0].update(containerPort="9410"), id="wrong-type"),
        pytest.param(lambda c: c.pop("name"), id="missing-required"),
    ],
)
def test_the_validator_rejects_a_spoiled_daemonset(spoil: Any) -> None:
    doc = copy.deepcopy(_one("DaemonSet"))
    spoil(doc["spec"]["template"]["spec"]["containers"][0])
    with pytest.raises(kubernetes_validate.ValidationError):
        kubernetes_validate.validate(doc, KUBERNETES, strict=True)


# --- the DaemonSet against the agent's CLI ----------------------------------------------------------


def _pod_spec() -> Doc:
    spec: Doc = _one("DaemonSet")["spec"]["template"]["spec"]
    return spec


def _container() -> Doc:
    containers = _pod_spec()["containers"]
    assert len(containers) == 1
    container: Doc = containers[0]
    return container


def _settings_from(command: Any, args: list[str]) -> Settings:
    """What a command builds from these arguments and the environment, parsed by the real command line."""
    overrides = dict(command.make_context(command.name, args).params)
    config = overrides.pop("config")
    settings = {field.name for field in dataclasses.fields(Settings)}
    overrides = {name: value for name, value in overrides.items() if name in settings}
    return SettingsSource(overrides, Path(config) if config else None).load()


def _env() -> dict[str, Any]:
    return {item["name"]: item for item in _container().get("env", [])}


@pytest.fixture
def clean_env(monkeypatch: pytest.MonkeyPatch) -> pytest.MonkeyPatch:
    for name in [name for name in os.environ if name.startswith("ASCEND_AGENT_")]:
        monkeypatch.delenv(name)
    return monkeypatch


def _mounted_config() -> tuple[str, str]:
    """(the path the DaemonSet passes to --config, the text its ConfigMap volume puts there)."""
    args = _container()["args"]
    assert "--config" in args, "the DaemonSet passes no --config"
    path = PurePosixPath(args[args.index("--config") + 1])
    _, volume = _mounts()[str(path.parent)]
    config_map = _one("ConfigMap")
    assert volume.get("configMap", {}).get("name") == config_map["metadata"]["name"], str(path.parent)
    assert path.name in config_map["data"], f"the ConfigMap has no key {path.name}"
    return str(path), config_map["data"][path.name]


@pytest.fixture
def pod_config(tmp_path: Path) -> tuple[str, Path]:
    """(the pod's --config path, a file here with what the ConfigMap puts there)."""
    container_path, text = _mounted_config()
    local = tmp_path / "config.yaml"
    local.write_text(text, encoding="utf-8")
    return container_path, local


@pytest.fixture
def pod_env(clean_env: pytest.MonkeyPatch, pod_config: tuple[str, Path]) -> pytest.MonkeyPatch:
    """The container's ASCEND_AGENT_* environment, with the ConfigMap's file where it points."""
    container_path, local = pod_config
    for name, item in _env().items():
        if name.startswith("ASCEND_AGENT_"):
            clean_env.setenv(name, str(local) if item["value"] == container_path else item["value"])
    return clean_env


@pytest.fixture
def run_settings(pod_env: pytest.MonkeyPatch, pod_config: tuple[str, Path]) -> Settings:
    """The Settings `ascend-agent run` builds in the pod: its args, its environment and the ConfigMap."""
    args = _container()["args"]
    assert args[0] == "run"
    container_path, local = pod_config
    return _settings_from(RUN, [str(local) if arg == container_path else arg for arg in args[1:]])


def test_daemonset_identity() -> None:
    daemonset = _one("DaemonSet")
    assert daemonset["metadata"]["name"] == "ascend-device-plugin-daemonset"
    assert daemonset["metadata"]["namespace"] == "kube-system"
    labels = {"app.kubernetes.io/name": "ascend-agent"}
    assert daemonset["spec"]["selector"]["matchLabels"] == labels
    assert labels.items() <= daemonset["spec"]["template"]["metadata"]["labels"].items()
    assert daemonset["spec"]["updateStrategy"] == {
        "type": "RollingUpdate",
        "rollingUpdate": {"maxUnavailable": 1},
    }


def test_daemonset_flags_are_real_run_options() -> None:
    flags = [arg for arg in _container()["args"] if arg.startswith("--")]
    assert flags, "the DaemonSet passes no flags"
    unknown = [flag for flag in flags if flag.split("=", 1)[0] not in RUN_OPTIONS]
    assert not unknown, f"not options of `ascend-agent run`: {unknown}"


def test_settings_are_the_config_maps_to_edit() -> None:
    """A flag or environment variable wins over the file, so neither may set what the ConfigMap sets."""
    assert _container()["args"][1:] == ["--config", _mounted_config()[0]]
    _, text = _mounted_config()
    in_file = set(yaml.safe_load(text))
    in_env = {
        camel_case(name.removeprefix("ASCEND_AGENT_").lower())
        for name in _env()
        if name.startswith("ASCEND_AGENT_") and name != "ASCEND_AGENT_CONFIG"
    }
    assert in_env == {"hostRoot", "npuSmi"}, "only what follows the pod's mounts"
    assert not in_file & in_env, in_file & in_env


def test_config_map_is_mounted_as_a_directory() -> None:
    """A subPath mount never sees an edited ConfigMap: only a directory mount gets the kubelet's updates."""
    container_path, _ = _mounted_config()
    mount, _ = _mounts()[str(PurePosixPath(container_path).parent)]
    assert "subPath" not in mount and "subPathExpr" not in mount
    assert mount.get("readOnly") is True
    config_map = _one("ConfigMap")["metadata"]
    assert config_map["namespace"] == _one("DaemonSet")["metadata"]["namespace"]


def test_daemonset_args_make_the_intended_settings(run_settings: Settings) -> None:
    assert run_settings.backend == "devfs"
    assert run_settings.host_root == Path("/host")
    assert run_settings.log_format == "json"
    assert run_settings.cdi_spec_dir == Path("/var/run/cdi")
    assert run_settings.mode == "plain"
    host, _, port = run_settings.metrics_address.rpartition(":")
    assert host == "0.0.0.0", "the kubelet probes the pod IP: the endpoint must not listen on loopback only"
    assert port == "9410"


def test_exec_commands_see_the_host_as_the_agent_does(
    pod_env: pytest.MonkeyPatch, run_settings: Settings
) -> None:
    """`kubectl exec <pod> -- ascend-agent doctor` takes its settings from the container's env alone."""
    doctor_command = get_command(app).commands["doctor"]  # type: ignore[attr-defined]
    doctor_vars = {param.envvar for param in doctor_command.params}
    ours = {name for name in _env() if name.startswith("ASCEND_AGENT_")}
    assert {"ASCEND_AGENT_CONFIG", "ASCEND_AGENT_HOST_ROOT", "ASCEND_AGENT_NPU_SMI"} <= ours
    assert ours <= doctor_vars, "the doctor ignores some of them"
    from_env = _settings_from(doctor_command, [])
    fields = {field.name for field in dataclasses.fields(Settings)}
    compared = [param.name for param in doctor_command.params if param.name in fields]
    assert "metrics_address" in compared and "host_root" in compared
    for name in compared:
        assert getattr(from_env, name) == getattr(run_settings, name), name


def test_the_doctor_knows_its_node() -> None:
    assert _env()["NODE_NAME"]["valueFrom"] == {"fieldRef": {"fieldPath": "spec.nodeName"}}


def _mounts() -> dict[str, tuple[Doc, Doc]]:
    """mountPath -> (volumeMount, volume)."""
    volumes = {volume["name"]: volume for volume in _pod_spec()["volumes"]}
    mounts = {}
    for mount in _container()["volumeMounts"]:
        assert mount["name"] in volumes, f"mount {mount['name']} has no volume"
        mounts[mount["mountPath"]] = (mount, volumes[mount["name"]])
    assert {mount["name"] for mount, _ in mounts.values()} == set(volumes), "a volume is never mounted"
    return mounts


def _host_path(mount_path: Path | str) -> tuple[Doc, Doc]:
    entry = _mounts().get(str(mount_path))
    assert entry is not None, f"nothing is mounted at {mount_path}"
    assert "hostPath" in entry[1], f"{mount_path} is not a hostPath volume"
    return entry


def test_kubelet_directory_is_the_hosts_own_and_writable(run_settings: Settings) -> None:
    mount, volume = _host_path(run_settings.kubelet_dir)
    assert volume["hostPath"] == {"path": str(run_settings.kubelet_dir), "type": "Directory"}
    assert not mount.get("readOnly", False)


def test_the_instance_lock_is_on_the_host(run_settings: Settings) -> None:
    # In the container's own filesystem every pod would hold a lock of its own: no lock at all.
    mount, volume = _mounts()[str(run_settings.effective_plugin_dir)]
    assert volume["hostPath"] == {"path": str(run_settings.effective_plugin_dir), "type": "DirectoryOrCreate"}
    assert not mount.get("readOnly")
    assert _container()["terminationMessagePolicy"] == "FallbackToLogsOnError"


def test_dev_and_sys_are_mounted_where_the_agent_looks(run_settings: Settings) -> None:
    for root, host in ((run_settings.effective_dev_root, "/dev"), (run_settings.effective_sys_root, "/sys")):
        _, volume = _host_path(root)
        assert volume["hostPath"] == {"path": host, "type": "Directory"}
    sys_mount, _ = _host_path(run_settings.effective_sys_root)
    assert sys_mount.get("readOnly") is True


@pytest.mark.parametrize(
    ("host_path", "kind"),
    [
        ("/usr/local/Ascend/driver", "Directory"),
        ("/usr/local/dcmi", "Directory"),
        ("/usr/local/bin/npu-smi", "File"),
        ("/etc/ascend_install.info", "File"),
    ],
)
def test_driver_paths_are_read_only_under_host_root(
    run_settings: Settings, host_path: str, kind: str
) -> None:
    mount, volume = _host_path(run_settings.host_root / host_path.lstrip("/"))
    # *OrCreate would plant an empty file or directory on a node without the driver.
    assert volume["hostPath"] == {"path": host_path, "type": kind}
    assert mount.get("readOnly") is True


def test_npu_smi_and_its_libraries_are_inside_mounts(run_settings: Settings) -> None:
    mounted = {PurePosixPath(path): mount for path, (mount, _) in _mounts().items()}

    def covering(path: str) -> Doc | None:
        target = PurePosixPath(path)
        return next((m for p, m in mounted.items() if target == p or p in target.parents), None)

    assert run_settings.npu_smi is not None
    assert covering(run_settings.npu_smi) is not None
    library_path = _env()["LD_LIBRARY_PATH"].get("value")
    assert library_path, "npu-smi needs LD_LIBRARY_PATH for the driver's libraries"
    for directory in library_path.split(":"):
        mount = covering(directory)
        assert mount is not None and mount.get("readOnly") is True, directory


def _host_path_of(container_path: str) -> str | None:
    """The host path a hostPath mount shows at ``container_path``, or None."""
    target = PurePosixPath(container_path)
    for path, (_, volume) in _mounts().items():
        mount_path = PurePosixPath(path)
        if "hostPath" in volume and (target == mount_path or mount_path in target.parents):
            return str(PurePosixPath(volume["hostPath"]["path"]) / target.relative_to(mount_path))
    return None


def test_npu_smi_runs_from_the_hosts_own_paths(run_settings: Settings) -> None:
    """npu-smi, its libraries and the files they read by absolute path are where they are on the host."""
    assert run_settings.npu_smi is not None
    paths = [str(run_settings.npu_smi), *_env()["LD_LIBRARY_PATH"]["value"].split(":")]
    paths += ["/etc/ascend_install.info", "/usr/local/Ascend/driver/version.info"]
    for path in paths:
        assert _host_path_of(path) == path, path
    for directory in ("/usr/local/Ascend/driver/lib64", "/usr/local/dcmi"):
        assert directory in paths


def test_cdi_directory_is_mounted_writable(run_settings: Settings) -> None:
    assert run_settings.cdi_spec_dir is not None
    mount, volume = _host_path(run_settings.cdi_spec_dir)
    assert volume["hostPath"]["path"] == str(run_settings.cdi_spec_dir)
    assert not mount.get("readOnly", False)


def test_probes_and_metrics_port(run_settings: Settings) -> None:
    port = int(run_settings.metrics_address.rpartition(":")[2])
    container = _container()
    assert {"name": "metrics", "containerPort": port, "protocol": "TCP"} in container["ports"]
    for probe, path in (("livenessProbe", "/healthz"), ("readinessProbe", "/readyz")):
        check = container[probe]["httpGet"]
        assert check["path"] == path
        assert check["port"] in (port, "metrics")
    annotations = _one("DaemonSet")["spec"]["template"]["metadata"]["annotations"]
    assert annotations["prometheus.io/scrape"] == "true"
    assert annotations["prometheus.io/port"] == str(port)
    assert annotations["prometheus.io/path"] == "/metrics"


def test_scheduling() -> None:
    spec = _pod_spec()
    assert spec["priorityClassName"] == "system-node-critical"
    assert spec["nodeSelector"] == {"accelerator": "huawei-Ascend910"}
    tolerations = spec["tolerations"]
    assert {"key": "huawei.com/Ascend910", "operator": "Exists", "effect": "NoSchedule"} in tolerations
    assert {"key": "CriticalAddonsOnly", "operator": "Exists"} in tolerations
    assert not spec.get("hostNetwork", False)


_QUANTITY = re.compile(r"^(\d+)(m|Mi|Gi)?$")
_SCALE = {"m": 1e-3, "Mi": 2**20, "Gi": 2**30, None: 1}


def _quantity(value: str | int) -> float:
    match = _QUANTITY.match(str(value))
    assert match, f"unexpected quantity {value!r}"
    return int(match.group(1)) * _SCALE[match.group(2)]


def test_resources_are_small_and_consistent() -> None:
    resources = _container()["resources"]
    for name in ("cpu", "memory"):
        request, limit = _quantity(resources["requests"][name]), _quantity(resources["limits"][name])
        assert 0 < request <= limit
    assert _quantity(resources["limits"]["memory"]) <= 256 * 2**20


def test_security_context() -> None:
    spec, context = _pod_spec(), _container()["securityContext"]
    assert spec["securityContext"]["seccompProfile"] == {"type": "RuntimeDefault"}
    assert context["runAsUser"] == 0
    assert context["readOnlyRootFilesystem"] is True
    if context.get("privileged"):
        # The API server rejects allowPrivilegeEscalation: false together with privileged: true.
        assert context.get("allowPrivilegeEscalation") is not False
    else:
        assert context["allowPrivilegeEscalation"] is False
        assert context["capabilities"]["drop"] == ["ALL"]


def test_rbac_is_wired_to_the_service_account() -> None:
    account = _one("ServiceAccount")["metadata"]
    assert _pod_spec()["serviceAccountName"] == account["name"]
    subject = {"kind": "ServiceAccount", "name": account["name"], "namespace": account["namespace"]}
    roles = {
        (doc["kind"], doc["metadata"]["name"]): doc for _, doc in MANIFESTS if doc["kind"].endswith("Role")
    }
    bindings = [doc for _, doc in MANIFESTS if doc["kind"].endswith("RoleBinding")]
    assert bindings
    for binding in bindings:
        assert binding["subjects"] == [subject]
        assert (binding["roleRef"]["kind"], binding["roleRef"]["name"]) in roles
    # Writes only where the cluster side writes: its Node, Events, the device-info ConfigMap.
    writes = {"create", "update", "patch", "delete"}
    for role in roles.values():
        for rule in role["rules"]:
            if set(rule["verbs"]) & writes:
                assert set(rule["resources"]) <= {"nodes", "events", "configmaps"}, rule


def _grants(namespace: str | None, group: str, resource: str, verb: str, name: str) -> bool:
    return grants((doc for _, doc in MANIFESTS), namespace, group, resource, verb, name)


def test_rbac_covers_the_doctors_reads() -> None:
    from ascend_agent.doctor import check as doctor

    assert _one("DaemonSet")["metadata"]["name"] == doctor.DAEMONSET
    assert _grants(None, "", "nodes", "get", "npu-node-1")
    assert _grants(doctor.NAMESPACE, "apps", "daemonsets", "get", doctor.DAEMONSET)
    assert _grants(doctor.NAMESPACE, "", "pods", "list", "")
    # ...and no more than that.
    assert not _grants(doctor.NAMESPACE, "apps", "daemonsets", "get", "someone-else")
    assert not _grants("default", "", "pods", "list", "")
    assert not _grants(None, "", "secrets", "get", "x")
    # The token is mounted through the pod spec only; the account alone mounts nothing.
    assert _one("ServiceAccount")["automountServiceAccountToken"] is False
    assert _pod_spec()["automountServiceAccountToken"] is True


def test_rbac_covers_the_cluster_side() -> None:
    """Node labels, Events about chip health, and Huawei's device-info ConfigMap in kube-system."""
    assert _grants(None, "", "nodes", "patch", "npu-node-1")
    assert _grants(None, "", "events", "create", "")
    assert _grants("default", "", "events", "patch", "npu-node-1.17a2")
    for verb in ("get", "list", "watch", "create", "update"):
        assert _grants("kube-system", "", "configmaps", verb, "mindx-dl-deviceinfo-npu-node-1")
    for verb in ("get", "list", "watch"):
        assert _grants("kube-system", "", "configmaps", verb, "mindx-dl-fault-config")
    # ...and no more: no other namespace's ConfigMaps, no deletes, no pod writes without Volcano.
    assert not _grants("default", "", "configmaps", "get", "x")
    assert not _grants("kube-system", "", "configmaps", "delete", "mindx-dl-deviceinfo-npu-node-1")
    assert not _grants(None, "", "nodes", "delete", "npu-node-1")
    assert not _grants("default", "", "pods", "patch", "x")


def test_the_pod_resources_socket_is_mounted_read_only() -> None:
    mount, volume = _host_path("/var/lib/kubelet/pod-resources")
    assert volume["hostPath"] == {"path": "/var/lib/kubelet/pod-resources", "type": "Directory"}
    assert mount.get("readOnly") is True


def _images() -> list[str]:
    images = []
    for _, doc in MANIFESTS:
        spec = doc["spec"]["template"]["spec"] if doc["kind"] == "DaemonSet" else doc.get("spec", {})
        images += [c["image"] for c in spec.get("containers", []) + spec.get("initContainers", [])]
    return images


def _pinned(image: str) -> bool:
    """A version tag (a digest may follow), never ``latest`` and never none."""
    last = image.split("@", 1)[0].rsplit("/", 1)[-1]
    name, colon, tag = last.partition(":")
    return bool(name and colon) and tag != "latest" and any(ch.isdigit() for ch in tag)


def test_images_are_pinned() -> None:
    images = _images()
    assert len(images) >= 2
    for image in images:
        assert _pinned(image), image
    assert _container()["image"] == f"ascend-agent:{VERSION}"
    assert not _pinned("ubuntu") and not _pinned("ubuntu:latest") and not _pinned("localhost:5000/ubuntu")


def _smoke_container() -> Doc:
    (container,) = _one("Pod", "pod.yaml")["spec"]["containers"]
    return container  # type: ignore[no-any-return]


def test_smoke_pod() -> None:
    pod = _one("Pod", "pod.yaml")
    assert pod["metadata"]["name"] == "ascend-smoke"  # the README's `kubectl logs ascend-smoke`
    assert pod["spec"]["restartPolicy"] == "Never"
    container = _smoke_container()
    assert int(container["resources"]["limits"]["huawei.com/Ascend910"]) == 1
    assert container["command"] == ["/bin/sh", "-c"]


def _smoke(dev: Path, visible: str | None) -> subprocess.CompletedProcess[str]:
    """The smoke pod's script under /bin/sh, with ``dev`` in place of /dev."""
    (script,) = _smoke_container()["args"]
    script = script.replace("/dev/", f"{dev}/").replace("/usr/local/bin/npu-smi", f"{dev}/no-npu-smi")
    env = {"PATH": os.environ["PATH"]} | ({} if visible is None else {"ASCEND_VISIBLE_DEVICES": visible})
    # A new session has no controlling terminal, so /dev/tty is a character device that does not open.
    return subprocess.run(
        ["/bin/sh", "-c", script], env=env, capture_output=True, text=True, timeout=30, start_new_session=True
    )


@pytest.fixture
def dev(tmp_path: Path) -> Path:
    """A /dev with chips 0 and 1 and the management device: links to /dev/null, a character device."""
    for name in ("davinci0", "davinci1", "davinci_manager"):
        (tmp_path / name).symlink_to("/dev/null")
    return tmp_path


def test_smoke_pod_opens_each_visible_chip(dev: Path) -> None:
    result = _smoke(dev, "0,1")
    assert result.returncode == 0, result.stderr
    assert f"ascend-smoke: opened {dev}/davinci0" in result.stdout.splitlines()
    assert f"ascend-smoke: opened {dev}/davinci1" in result.stdout.splitlines()
    assert result.stdout.splitlines()[-1] == "ascend-smoke: ok"


@pytest.mark.parametrize(
    ("visible", "prepare", "message"),
    [
        (None, None, "ASCEND_VISIBLE_DEVICES is empty: no chip was allocated to this container"),
        ("3", None, "davinci3 is missing: chip 3 was allocated but its device node is not here"),
        ("2", "file", "davinci2 is missing"),
        ("2", "tty", "cannot open "),
    ],
    ids=["nothing-allocated", "node-missing", "not-a-device", "does-not-open"],
)
def test_smoke_pod_fails_with_one_line(
    dev: Path, visible: str | None, prepare: str | None, message: str
) -> None:
    if prepare == "file":
        (dev / "davinci2").write_text("")  # a plain file where the device node should be
    elif prepare == "tty":
        (dev / "davinci2").symlink_to("/dev/tty")
    result = _smoke(dev, visible)
    assert result.returncode == 1
    (line,) = result.stderr.splitlines()
    assert line.startswith("ascend-smoke: FAILED: ") and message in line, line
    assert "ascend-smoke: ok" not in result.stdout


# --- examples/config.yaml -----------------------------------------------------------------------------

_KEY = re.compile(r"^(# )?([a-z][A-Za-z]*):")


def _config_blocks() -> dict[str, tuple[bool, list[str]]]:
    """Setting key -> (active, the comment lines right above it)."""
    keys = {camel_case(field.name) for field in dataclasses.fields(Settings)}
    lines = CONFIG.read_text(encoding="utf-8").splitlines()
    blocks: dict[str, tuple[bool, list[str]]] = {}
    for index, line in enumerate(lines):
        match = _KEY.match(line)
        if not match or match.group(2) not in keys:
            continue
        key = match.group(2)
        assert key not in blocks, f"{key} appears twice"
        above = index
        while above > 0 and lines[above - 1].startswith("#"):
            above -= 1
        blocks[key] = (match.group(1) is None, lines[above:index])
    return blocks


def test_config_example_loads_as_the_defaults() -> None:
    assert read_config_file(CONFIG), "the example sets nothing"
    assert SettingsSource({}, CONFIG).load() == Settings()


def test_config_example_lists_every_setting() -> None:
    blocks = _config_blocks()
    defaults = Settings()
    for field in dataclasses.fields(Settings):
        key = camel_case(field.name)
        assert key in blocks, f"{key} is missing from examples/config.yaml"
        active, _ = blocks[key]
        assert active == (getattr(defaults, field.name) is not None), f"{key}: commented out iff default None"


def test_config_example_optional_settings_load_when_uncommented(tmp_path: Path) -> None:
    optional = [key for key, (active, _) in _config_blocks().items() if not active]
    assert optional
    text = CONFIG.read_text(encoding="utf-8")
    for key in optional:
        text = re.sub(rf"^# ({key}:)", r"\1", text, flags=re.MULTILINE)
    path = tmp_path / "config.yaml"
    path.write_text(text, encoding="utf-8")
    values = read_config_file(path)
    for key in optional:
        name = next(f.name for f in dataclasses.fields(Settings) if camel_case(f.name) == key)
        assert values.get(name) is not None, key
    SettingsSource({}, path).load()


def test_config_example_names_each_flag_and_variable() -> None:
    for key, (_, comments) in _config_blocks().items():
        name = next(f.name for f in dataclasses.fields(Settings) if camel_case(f.name) == key)
        flag, variable = f"--{name.replace('_', '-')}", f"ASCEND_AGENT_{name.upper()}"
        text = " ".join(comments)
        assert len(comments) >= 2, f"{key}: say what it does, then the flag"
        if flag in RUN_OPTIONS:
            assert RUN_OPTIONS[flag].envvar == variable
            assert f"Flag {flag}, environment {variable}." in text, key
        else:
            assert "Config file only: no flag or environment variable." in text, key
            assert "ASCEND_AGENT_" not in text and "Flag --" not in text, key


# --- Containerfile ----------------------------------------------------------------------------------


def _instructions(path: Path) -> list[tuple[str, str]]:
    logical = re.sub(r"\\\n", " ", path.read_text(encoding="utf-8"))
    out = []
    for line in logical.splitlines():
        line = line.strip()
        if line and not line.startswith("#"):
            keyword, _, rest = line.partition(" ")
            out.append((keyword.upper(), rest.strip()))
    return out


def _global_args() -> dict[str, str]:
    """The ARGs declared before the first FROM, with their defaults: what FROM lines may use."""
    args: dict[str, str] = {}
    for keyword, rest in _instructions(CONTAINERFILE):
        if keyword == "FROM":
            break
        assert keyword == "ARG", f"{keyword} before the first FROM"
        name, _, default = rest.partition("=")
        args[name] = default
    return args


def _from_images() -> list[str]:
    """Each FROM's image, as written."""
    return [
        next(word for word in rest.split() if not word.startswith("--"))
        for keyword, rest in _instructions(CONTAINERFILE)
        if keyword == "FROM"
    ]


def _expand(text: str, args: dict[str, str]) -> str:
    return re.sub(r"\$\{(\w+)\}|\$(\w+)", lambda m: args[m.group(1) or m.group(2)], text)


def _stages() -> list[tuple[str, list[tuple[str, str]]]]:
    """(base image with the ARG defaults filled in, instructions) per stage."""
    args = _global_args()
    stages: list[tuple[str, list[tuple[str, str]]]] = []
    for keyword, rest in _instructions(CONTAINERFILE):
        if keyword == "FROM":
            words = [word for word in rest.split() if not word.startswith("--")]
            stages.append((_expand(words[0], args), []))
        elif stages:
            stages[-1][1].append((keyword, rest))
    return stages


_DIGEST = re.compile(r"@sha256:[0-9a-f]{64}$")


def test_containerfile_bases_are_pinned() -> None:
    stages = _stages()
    assert len(stages) >= 2, "multi-stage: build the wheel, then install it"
    bases = {base for base, _ in stages}
    assert len(bases) == 1, f"builder and runtime should share one base: {bases}"
    (base,) = bases
    assert _pinned(base) and "slim" in base, base
    assert _DIGEST.search(base), f"pin the default base by digest: {base}"
    assert "$" not in base


def test_containerfile_base_is_one_build_argument() -> None:
    """`--build-arg BASE_IMAGE=...` swaps both stages' base (make image-test builds on a local one)."""
    assert set(_from_images()) == {"${BASE_IMAGE}"}
    assert _DIGEST.search(_global_args()["BASE_IMAGE"])
    # tests/image/image-test.sh reads the default with sed from the one `ARG BASE_IMAGE=` line.
    text = CONTAINERFILE.read_text(encoding="utf-8")
    assert len(re.findall(r"^ARG BASE_IMAGE=\S+$", text, re.MULTILINE)) == 1


def test_containerfile_stages_declare_the_arguments_they_use() -> None:
    """A global ARG is empty inside a stage unless the stage declares it again."""
    for _, instructions in _stages():
        declared: set[str] = set()
        for keyword, rest in instructions:
            if keyword == "ARG":
                declared.add(rest.partition("=")[0])
                continue
            used = {a or b for a, b in re.findall(r"\$\{(\w+)\}|\$(\w+)", rest)} & set(_global_args())
            assert used <= declared, f"{keyword} uses {used - declared} without ARG in its stage"
    final = dict(_stages()[-1][1])
    assert 'org.opencontainers.image.base.name="${BASE_IMAGE}"' in final["LABEL"]


def test_containerfile_builds_and_installs_the_wheel() -> None:
    stages = _stages()
    build_runs = " ".join(rest for keyword, rest in stages[0][1] if keyword == "RUN")
    assert "pip wheel --no-deps -w /dist ." in build_runs
    final = stages[-1][1]
    runs = [rest for keyword, rest in final if keyword == "RUN"]
    installs = [run for run in runs if "pip install" in run and "/dist/*.whl" in run]
    assert installs, runs
    assert not any(re.search(r"\b(apt-get|apk|dnf|yum)\b", run) for run in runs), "no packages in the runtime"
    assert any(keyword == "COPY" and "--from=" in rest for keyword, rest in final)
    # The sources stay behind: only pyproject.toml comes in, to name the dependencies, which are installed in
    # a layer before the wheel's (its cache outlives a change of the code) and without the wheel's help.
    own = [rest for keyword, rest in final if keyword == "COPY" and "--from=" not in rest]
    assert own == ["pyproject.toml /tmp/pyproject.toml"], own
    order = [
        keyword if keyword != "RUN" else ("DEPS" if "requirements" in rest else "RUN")
        for keyword, rest in final
    ]
    assert order.index("DEPS") < next(i for i, (k, r) in enumerate(final) if k == "COPY" and "--from=" in r)
    assert all("--no-deps" in run for run in installs), installs
    # Every source directory setuptools packages is in the build context the builder copies.
    copied = " ".join(rest for keyword, rest in stages[0][1] if keyword == "COPY")
    for directory in set(PYPROJECT["tool"]["setuptools"]["package-dir"].values()):
        assert directory in shlex.split(copied), directory


def test_containerfile_runs_the_agent() -> None:
    final = dict(_stages()[-1][1])
    assert final["USER"] == "0"
    assert set(PYPROJECT["project"]["scripts"]) == {"ascend-agent", "kubectl-ascend"}
    assert json.loads(final["ENTRYPOINT"]) == ["ascend-agent"]
    assert json.loads(final["CMD"]) == ["run"]
    assert f'org.opencontainers.image.version="{VERSION}"' in final["LABEL"]


def test_build_context_ignores() -> None:
    container_ignore = (ROOT / ".containerignore").read_text(encoding="utf-8")
    assert (ROOT / ".dockerignore").read_text(encoding="utf-8") == container_ignore
    patterns = {line.strip() for line in container_ignore.splitlines() if line and not line.startswith("#")}
    assert {".venv", "bench/results", ".pytest_cache", ".hypothesis"} <= patterns
    copied = {
        word for keyword, rest in _stages()[0][1] if keyword == "COPY" for word in shlex.split(rest)[:-1]
    }
    assert not copied & patterns, "the builder copies something the context leaves out"

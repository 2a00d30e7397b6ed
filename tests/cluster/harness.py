"""A single-node Kubernetes cluster from the binary tests/cluster/build.sh makes: etcd, kube-apiserver,
kube-controller-manager, kube-scheduler and the kubelet, each a process of its own, with a container runtime:
containerd, runc and the CNI plugins (tests/cluster/runtime/).

Everything that speaks TCP runs inside a network namespace made here (``lo`` and a veth pair, one end carrying
the node IP), so nothing the cluster sends leaves it; kubectl joins it. Pods get addresses on a bridge inside
it, and reach the API server at the ``kubernetes`` Service's address, which ``lo`` carries (there is no
kube-proxy: the API server listens on every address of the namespace, on the Service's port). Unix sockets
(CRI, device plugin, DRA, PodResources) live in the filesystem. The kubelet's device-plugin socket is fixed at
/var/lib/kubelet/device-plugins/kubelet.sock: the cluster does not start where a kubelet answers there.
The kernel settings the kubelet writes at start are put back as soon as it is up, and again at the end.
"""

from __future__ import annotations

import contextlib
import fcntl
import json
import os
import re
import secrets
import shutil
import signal
import socket
import subprocess
import tempfile
import time
from collections.abc import Iterator, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import IO

from tests.cluster.devices import CHIPS, MANAGEMENT, DevicesPresent, StandInDevices
from tests.cluster.runtime import Containerd, RuntimeProblem, pause_archive
from tests.support.processes import OWNER

KUBELET_DIR = Path("/var/lib/kubelet")
# What the kubelet makes on the host besides its root directory: removed at the end unless they were there.
KUBELET_HOST_DIRS = (KUBELET_DIR, Path("/var/log/pods"), Path("/var/log/containers"))
KUBELET_SOCKET = KUBELET_DIR / "device-plugins" / "kubelet.sock"
# Held from a cluster's start to its stop: one at a time on the machine.
MACHINE_LOCK = Path("/tmp/ascend-e2e-cluster.lock")
# What the node's parts make on the host whatever they are told, removed at the end when the cluster made
# them: every containerd shim's socket directory, libcni's cache (containerd's CRI sets no other) and
# /var/run/cdi (the chart's DirectoryOrCreate hostPath). (`ip netns add` leaves /run/netns, a mount of its own
# the system keeps.)
NODE_HOST_DIRS = (Path("/run/containerd"), Path("/var/lib/cni"), Path("/var/run/cdi"))
# The driver's paths on a real node: a bind mount of one the host lacks (an agent told of a driver this host
# has not) makes it, a directory, on the host. Never expected: a problem at the end, and removed.
DRIVER_HOST_PATHS = (
    Path("/usr/local/Ascend"),
    Path("/usr/local/dcmi"),
    Path("/usr/local/bin/npu-smi"),
    Path("/etc/ascend_install.info"),
)
NODE_NAME = "ascend-e2e"
NODE_IP = "10.123.0.2"
# The kubernetes Service's port and ClusterIP (the first of --service-cluster-ip-range), which pods are told.
API_PORT = 443
SERVICE_IP = "10.96.0.1"
API_SERVER = f"https://{NODE_IP}:{API_PORT}"
# The kubelet's setupKernelTunables (pkg/kubelet/cm/container_manager_linux.go) writes these.
KUBELET_SYSCTLS = (
    "vm/overcommit_memory",
    "vm/panic_on_oom",
    "kernel/panic",
    "kernel/panic_on_oops",
    "kernel/keys/root_maxkeys",
    "kernel/keys/root_maxbytes",
)
START_TIMEOUT = 120.0
STOP_TIMEOUT = 30.0
# What the scenarios measured on the way (name -> value with its unit), printed at the end of the run.
FIGURES: dict[str, str] = {}


class ClusterError(Exception):
    """The cluster could not start: the message names the component and where its log is."""


class KubeletPresent(ClusterError):
    """A kubelet already answers at /var/lib/kubelet/device-plugins/kubelet.sock, or the host has Ascend
    devices of its own."""


def kubelet_answers(path: Path = KUBELET_SOCKET) -> bool:
    """Whether something accepts connections on the kubelet's device-plugin socket."""
    with socket.socket(socket.AF_UNIX, socket.SOCK_STREAM) as probe:
        probe.settimeout(2.0)
        try:
            probe.connect(str(path))
        except OSError:
            return False
    return True


def read_sysctls() -> dict[str, str]:
    return {name: (Path("/proc/sys") / name).read_text().strip() for name in KUBELET_SYSCTLS}


def write_sysctls(values: dict[str, str]) -> None:
    for name, value in values.items():
        path = Path("/proc/sys") / name
        if path.read_text().strip() != value:
            path.write_text(value)


def _mounts_under(*roots: Path) -> list[str]:
    """Mount points under any of roots, deepest first (the order they can be unmounted in)."""
    points: list[str] = []
    for line in Path("/proc/self/mountinfo").read_text().splitlines():
        point = line.split()[4].replace("\\040", " ")
        if any(point == str(root) or point.startswith(f"{root}/") for root in roots):
            points.append(point)
    return sorted(points, key=lambda p: p.count("/"), reverse=True)


def _remove_unless_mounted(path: Path, problems: list[str]) -> None:
    """``path`` removed, but never through a mount that would not go (a pod's hostPath volume: the host's
    own files under it)."""
    if _mounts_under(path):
        problems.append(f"{path} kept: still mounted under it")
    else:
        shutil.rmtree(path, ignore_errors=True)


@dataclass
class Component:
    name: str
    process: subprocess.Popen[bytes]
    log: Path

    def tail(self, lines: int = 40) -> str:
        try:
            text = self.log.read_text(errors="replace").splitlines()
        except OSError:
            return ""
        return "\n".join(text[-lines:])


@dataclass
class Cluster:
    """One cluster: call start(), then stop() (always, also after a failed start)."""

    binary: Path
    # containerd's executables (tests/cluster/runtime/build.sh): the kubelet's runtime, which gets the pause
    # image and ``images`` (OCI archives) before the kubelet starts.
    runtime_tools: dict[str, Path]
    work: Path = field(default_factory=lambda: Path(tempfile.mkdtemp(prefix="ae2e-", dir="/tmp")))
    netns: str = field(default_factory=lambda: f"ascend-e2e-{os.getpid()}")
    components: dict[str, Component] = field(default_factory=dict)
    sysctls: dict[str, str] = field(default_factory=dict)
    tokens: dict[str, str] = field(default_factory=dict)
    host_dirs_made: tuple[Path, ...] = ()
    driver_paths_absent: tuple[Path, ...] = ()
    # The users whose requests the API server writes to audit.log (one JSON line per stage, Metadata level).
    audited_users: tuple[str, ...] = ()
    images: tuple[Path, ...] = ()
    # False: the control plane alone (etcd, the API server, the controller manager, the scheduler), no
    # runtime, no kubelet, no device nodes: nodes are another program's (kwok, in make bench-scale).
    with_node: bool = True
    # Whether start() got past its refusals: the machine was this cluster's to change.
    began: bool = False
    _machine: IO[str] | None = None
    # The chips' and management devices' nodes in /dev (tests add vNPUs' with make()).
    devices: StandInDevices = field(default_factory=StandInDevices)
    _logs: list[IO[bytes]] = field(default_factory=list)

    def __post_init__(self) -> None:
        self.runtime = Containerd(self.runtime_tools, self.work / "containerd", cdi_dirs=[self.cdi_dir])
        # Every component runs with the environment of the cluster's maker, also one a test starts again (the
        # kubelet, a reboot): it belongs to the cluster, not to that test, whose leftovers the suite ends.
        self._environment = dict(os.environ)

    @property
    def owner(self) -> str | None:
        """The mark of whoever made the cluster (tests/support/processes.py), which its processes carry."""
        return self._environment.get(OWNER)

    @property
    def audit_log(self) -> Path:
        return self.work / "audit.log"

    @property
    def admin_kubeconfig(self) -> Path:
        return self.work / "admin.kubeconfig"

    def in_netns(self, argv: Sequence[str]) -> list[str]:
        return ["nsenter", f"--net=/run/netns/{self.netns}", "--", *argv]

    def kubectl(
        self, *args: str, timeout: float = 60.0, check: bool = True, stdin: str | None = None
    ) -> subprocess.CompletedProcess[str]:
        """kubectl as the cluster's admin, inside the network namespace."""
        argv = self.in_netns([str(self.binary), "kubectl", f"--kubeconfig={self.admin_kubeconfig}", *args])
        answer = subprocess.run(
            argv, capture_output=True, text=True, timeout=timeout, input=stdin, check=False
        )
        if check and answer.returncode != 0:
            raise AssertionError(
                f"kubectl {' '.join(args)} exited {answer.returncode}: {answer.stderr.strip()}"
            )
        return answer

    # -- start ----------------------------------------------------------------------------------------------

    def start(self) -> None:
        if self.with_node and kubelet_answers():
            raise KubeletPresent(
                f"a kubelet already answers at {KUBELET_SOCKET}: this cluster's kubelet needs that socket; "
                "stop that kubelet (another make e2e or make cluster?) or use a machine without one"
            )
        # One cluster of these at a time: two starting at once would meet on /var/lib/kubelet and /dev.
        self._machine = MACHINE_LOCK.open("w")
        try:
            fcntl.flock(self._machine, fcntl.LOCK_EX | fcntl.LOCK_NB)
        except BlockingIOError:
            raise KubeletPresent(
                f"another cluster of these tests is starting on this machine ({MACHINE_LOCK}); wait for it"
            ) from None
        if self.with_node:
            try:
                self.devices.make((*CHIPS, *MANAGEMENT))
            except DevicesPresent as present:
                raise KubeletPresent(str(present)) from None
        self.began = True
        if self.with_node:
            host_dirs = (*KUBELET_HOST_DIRS, *NODE_HOST_DIRS)
            self.host_dirs_made = tuple(path for path in host_dirs if not path.exists())
            self.driver_paths_absent = tuple(path for path in DRIVER_HOST_PATHS if not path.exists())
            self.sysctls = read_sysctls()
        self._network()
        self._credentials()
        self.start_etcd()
        self.start_apiserver()
        for name, user in (
            ("controller-manager", "system:kube-controller-manager"),
            ("scheduler", "system:kube-scheduler"),
            ("kubelet", f"system:node:{NODE_NAME}"),
        ):
            self.write_kubeconfig(self.work / f"{name}.kubeconfig", self.tokens[user])
        self._spawn(
            "kube-controller-manager",
            [
                "kube-controller-manager",
                f"--kubeconfig={self.work / 'controller-manager.kubeconfig'}",
                "--leader-elect=false",
                f"--service-account-private-key-file={self.work / 'sa.key'}",
                f"--root-ca-file={self.work / 'apiserver-certs' / 'apiserver.crt'}",
                "--use-service-account-credentials=true",
                f"--cert-dir={self.work / 'controller-manager-certs'}",
                "--bind-address=127.0.0.1",
            ],
        )
        self._spawn(
            "kube-scheduler",
            [
                "kube-scheduler",
                f"--kubeconfig={self.work / 'scheduler.kubeconfig'}",
                "--leader-elect=false",
                f"--cert-dir={self.work / 'scheduler-certs'}",
                "--bind-address=127.0.0.1",
            ],
        )
        if not self.with_node:
            self._wait_default_service_account()
            return
        self.runtime.write_config()
        self._spawn_containerd(self.runtime)
        for archive in (pause_archive(), *self.images):
            self.runtime.import_image(archive)
        self._spawn("kubelet", self._kubelet_args())
        self.wait_node_ready()
        self._wait_default_service_account()
        # The kubelet wrote its kernel settings at start; they are the machine's, not the cluster's.
        write_sysctls(self.sysctls)

    def start_etcd(self) -> None:
        """etcd (again, after ``stop_component("etcd")``, on the same data), waited for until it serves."""
        self._spawn("etcd", ["etcd", f"--data-dir={self.work / 'etcd'}"])
        self._wait_log("etcd", "etcd: ready at")

    def start_apiserver(self) -> None:
        """The API server (again, after ``stop_component("kube-apiserver")``), waited for until it serves."""
        self._spawn("kube-apiserver", self._apiserver_args())
        self._wait_api()

    @property
    def cdi_dir(self) -> Path:
        """Where the agent writes its CDI specs and containerd reads them."""
        return self.work / "cdi"

    def _spawn_containerd(self, runtime: Containerd) -> None:
        self._spawn("containerd", runtime.args(), runtime.tools["containerd"], runtime.env(self._environment))
        process = self.components["containerd"].process
        try:
            runtime.wait_serving(lambda: process.poll() is None)
        except RuntimeProblem as problem:
            raise self._failed("containerd", str(problem)) from None

    def _network(self) -> None:
        steps = [
            ["ip", "netns", "add", self.netns],
            ["ip", "-n", self.netns, "link", "set", "lo", "up"],
            ["ip", "-n", self.netns, "addr", "add", f"{SERVICE_IP}/32", "dev", "lo"],
            # A veth pair with both ends inside: this kernel has no dummy device type.
            ["ip", "-n", self.netns, "link", "add", "e2e0", "type", "veth", "peer", "name", "e2e1"],
            ["ip", "-n", self.netns, "addr", "add", f"{NODE_IP}/24", "dev", "e2e0"],
            ["ip", "-n", self.netns, "link", "set", "e2e1", "up"],
            ["ip", "-n", self.netns, "link", "set", "e2e0", "up"],
            ["ip", "-n", self.netns, "route", "add", "default", "dev", "e2e0"],
        ]
        for step in steps:
            answer = subprocess.run(step, capture_output=True, text=True, timeout=20, check=False)
            if answer.returncode != 0:
                raise ClusterError(f"{' '.join(step)}: {answer.stderr.strip()}")

    def _openssl(self, *args: str) -> None:
        answer = subprocess.run(["openssl", *args], capture_output=True, text=True, timeout=60, check=False)
        if answer.returncode != 0:
            raise ClusterError(f"openssl {args[0]}: {answer.stderr.strip()}")

    def _credentials(self) -> None:
        self._openssl("genrsa", "-out", str(self.work / "sa.key"), "2048")
        # The API server's client certificate for the kubelet's API (logs, exec), of a CA the kubelet trusts.
        pki = self.work / "kubelet-client"
        pki.mkdir()
        ec = ["-newkey", "ec", "-pkeyopt", "ec_paramgen_curve:prime256v1", "-nodes"]
        self._openssl(
            "req", "-x509", *ec, "-days", "2", "-subj", "/CN=ascend-e2e-kubelet-client-ca",
            "-keyout", str(pki / "ca.key"), "-out", str(pki / "ca.crt"),
        )  # fmt: skip
        self._openssl(
            "req", *ec, "-subj", "/O=system:masters/CN=kube-apiserver-kubelet-client",
            "-keyout", str(pki / "apiserver.key"), "-out", str(pki / "apiserver.csr"),
        )  # fmt: skip
        self._openssl(
            "x509", "-req", "-days", "2", "-in", str(pki / "apiserver.csr"), "-CA", str(pki / "ca.crt"),
            "-CAkey", str(pki / "ca.key"), "-CAcreateserial", "-out", str(pki / "apiserver.crt"),
        )  # fmt: skip
        groups = {
            "admin": "system:masters",
            "system:kube-controller-manager": "",
            "system:kube-scheduler": "",
            f"system:node:{NODE_NAME}": "system:nodes",
        }
        lines = []
        for user, group in groups.items():
            self.tokens[user] = secrets.token_hex(16)
            line = f"{self.tokens[user]},{user},{user}"
            lines.append(f'{line},"{group}"' if group else line)
        (self.work / "tokens.csv").write_text("\n".join(lines) + "\n")

    def _apiserver_args(self) -> list[str]:
        key = self.work / "sa.key"
        return [
            "kube-apiserver",
            "--etcd-servers=http://127.0.0.1:2379",
            f"--cert-dir={self.work / 'apiserver-certs'}",
            # Every address of the namespace: the node IP and the Service's, which pods dial.
            "--bind-address=0.0.0.0",
            f"--advertise-address={NODE_IP}",
            f"--secure-port={API_PORT}",
            "--authorization-mode=Node,RBAC",
            "--enable-admission-plugins=NodeRestriction",
            f"--token-auth-file={self.work / 'tokens.csv'}",
            "--anonymous-auth=false",
            f"--service-account-key-file={key}",
            f"--service-account-signing-key-file={key}",
            "--service-account-issuer=https://kubernetes.default.svc.cluster.local",
            "--service-cluster-ip-range=10.96.0.0/24",
            "--allow-privileged=true",
            # The node's name resolves nowhere here: logs, exec and port-forward dial the kubelet by its IP.
            "--kubelet-preferred-address-types=InternalIP",
            f"--kubelet-client-certificate={self.work / 'kubelet-client' / 'apiserver.crt'}",
            f"--kubelet-client-key={self.work / 'kubelet-client' / 'apiserver.key'}",
            *self._audit_args(),
        ]

    def _audit_args(self) -> list[str]:
        if not self.audited_users:
            return []
        policy = self.work / "audit-policy.yaml"
        users = "".join(f"  - {json.dumps(user)}\n" for user in self.audited_users)
        policy.write_text(
            "apiVersion: audit.k8s.io/v1\nkind: Policy\nomitStages: [RequestReceived]\nrules:\n"
            f"- level: Metadata\n  users:\n{users}- level: None\n"
        )
        return [f"--audit-policy-file={policy}", f"--audit-log-path={self.audit_log}"]

    def write_kubeconfig(self, path: Path, token: str) -> None:
        ca = self.work / "apiserver-certs" / "apiserver.crt"
        path.write_text(
            "apiVersion: v1\nkind: Config\n"
            f"clusters:\n- name: e2e\n  cluster:\n    server: {API_SERVER}\n    certificate-authority: {ca}\n"
            f"users:\n- name: user\n  user:\n    token: {token}\n"
            "contexts:\n- name: e2e\n  context:\n    cluster: e2e\n    user: user\n"
            "current-context: e2e\n"
        )

    def _kubelet_args(self) -> list[str]:
        config = self.work / "kubelet.yaml"
        config.write_text(
            "apiVersion: kubelet.config.k8s.io/v1beta1\n"
            "kind: KubeletConfiguration\n"
            # This machine mounts cgroup v1 hierarchies; 1.35+ refuses them unless told not to.
            "failCgroupV1: false\n"
            "cgroupDriver: cgroupfs\n"
            # No pod cgroups: nothing made under /sys/fs/cgroup that would outlive the cluster.
            "cgroupsPerQOS: false\n"
            "enforceNodeAllocatable: []\n"
            f"containerRuntimeEndpoint: {self._runtime_endpoint()}\n"
            "authentication:\n  anonymous:\n    enabled: false\n  webhook:\n    enabled: false\n"
            f"  x509:\n    clientCAFile: {self.work / 'kubelet-client' / 'ca.crt'}\n"
            "authorization:\n  mode: AlwaysAllow\n"
            f"address: {NODE_IP}\n"
            "readOnlyPort: 0\n"
            "healthzBindAddress: 127.0.0.1\n"
            "failSwapOn: false\n"
            "registerNode: true\n"
            # A shared test machine's disk and memory say nothing about the node under test.
            "evictionHard:\n  memory.available: 1Mi\n  nodefs.available: 1%\n  imagefs.available: 1%\n"
            "  nodefs.inodesFree: 1%\n"
            "imageGCHighThresholdPercent: 100\n"
            "imageGCLowThresholdPercent: 99\n"
            "nodeStatusUpdateFrequency: 2s\n"
            "syncFrequency: 5s\n"
        )
        return [
            "kubelet",
            f"--config={config}",
            f"--kubeconfig={self.work / 'kubelet.kubeconfig'}",
            # The default root: the agent finds the kubelet's plugins/, pod-resources/ and plugins_registry/
            # where a node has them.
            f"--root-dir={KUBELET_DIR}",
            f"--cert-dir={self.work / 'kubelet-certs'}",
            f"--hostname-override={NODE_NAME}",
            f"--node-ip={NODE_IP}",
        ]

    def _runtime_endpoint(self) -> str:
        return self.runtime.endpoint

    def _spawn(
        self, name: str, args: list[str], program: Path | None = None, env: dict[str, str] | None = None
    ) -> None:
        """``program`` (the k8s binary, whose first argument names the component) run with ``args`` in the
        network namespace, its output in ``logs/<name>.log``."""
        log = self.work / "logs" / f"{name}.log"
        starts = 1
        while log.exists():  # a component started again logs to a file of its own
            starts += 1
            log = self.work / "logs" / f"{name}-{starts}.log"
        log.parent.mkdir(parents=True, exist_ok=True)
        out = log.open("wb")
        self._logs.append(out)
        argv = [str(program or self.binary), *args]
        process = subprocess.Popen(
            self.in_netns(argv),
            env=env or self._environment,
            stdin=subprocess.DEVNULL,
            stdout=out,
            stderr=subprocess.STDOUT,
            start_new_session=True,
        )
        self.components[name] = Component(name, process, log)

    def _failed(self, name: str, what: str) -> ClusterError:
        component = self.components[name]
        return ClusterError(f"{name} {what} (log {component.log}):\n{component.tail()}")

    def _wait(self, name: str, what: str, ready: Iterator[bool], timeout: float = START_TIMEOUT) -> None:
        deadline = time.monotonic() + timeout
        component = self.components[name]
        for ok in ready:
            if ok:
                return
            if component.process.poll() is not None:
                raise self._failed(name, f"exited {component.process.returncode}")
            if time.monotonic() > deadline:
                raise self._failed(name, f"did not {what} within {timeout:.0f} s")
            time.sleep(0.2)

    def _wait_log(self, name: str, text: str) -> None:
        log = self.components[name].log
        self._wait(name, f"log {text!r}", (text in log.read_text(errors="replace") for _ in iter(int, 1)))

    def _wait_api(self) -> None:
        self.write_kubeconfig(self.admin_kubeconfig, self.tokens["admin"])

        def ready() -> Iterator[bool]:
            while True:
                answer = self.kubectl("get", "--raw=/readyz", timeout=20, check=False)
                yield answer.returncode == 0 and answer.stdout.strip() == "ok"

        self._wait("kube-apiserver", "answer /readyz", ready())

    def _wait_default_service_account(self) -> None:
        """Until the controller-manager made the default ServiceAccount: pods are refused before it."""

        def made() -> Iterator[bool]:
            while True:
                answer = self.kubectl(
                    "get", "serviceaccount", "default", "-n", "default", check=False, timeout=20
                )
                yield answer.returncode == 0

        self._wait("kube-controller-manager", "make the default ServiceAccount", made())

    def wait_node_ready(self, timeout: float = START_TIMEOUT) -> None:
        """Until the Node exists and is Ready (kubectl wait watches it)."""

        def ready() -> Iterator[bool]:
            while True:
                exists = self.kubectl("get", "node", NODE_NAME, "-o", "name", check=False, timeout=20)
                if exists.returncode != 0:
                    yield False
                    continue
                answer = self.kubectl(
                    "wait",
                    f"node/{NODE_NAME}",
                    "--for=condition=Ready",
                    "--timeout=10s",
                    check=False,
                    timeout=30,
                )
                yield answer.returncode == 0

        self._wait("kubelet", "register a Ready node", ready(), timeout)

    def restart_kubelet(self) -> None:
        """The kubelet stopped (SIGTERM) and started again as before, until its socket answers."""
        self.stop_component("kubelet")
        self._start_kubelet_again()

    def _start_kubelet_again(self) -> None:
        self._spawn("kubelet", self._kubelet_args())

        def answers() -> Iterator[bool]:
            while True:
                yield kubelet_answers()

        self._wait("kubelet", f"answer at {KUBELET_SOCKET}", answers())
        self.wait_node_ready()
        write_sysctls(self.sysctls)

    def reboot_node(self, volatile: Sequence[Path] = ()) -> None:
        """The node as after a reboot, the control plane left running: the kubelet and containerd stopped,
        every container's process killed (containerd's records of them stay, as its root is on disk),
        containerd's state and ``volatile`` emptied (tmpfs on a node: /run, /var/run/cdi), then containerd
        and the kubelet started again, until the node is Ready."""
        runtime = self.runtime
        self.stop_component("kubelet")
        runtime.kill_tasks()
        self.stop_component("containerd")
        runtime.kill_shims()
        for point in _mounts_under(runtime.work / "state"):
            subprocess.run(["umount", point], capture_output=True, timeout=20, check=False)
        for directory in (runtime.work / "state", runtime.work / "runc", *volatile):
            shutil.rmtree(directory, ignore_errors=True)
            directory.mkdir(parents=True)
        self._spawn_containerd(runtime)
        self._start_kubelet_again()

    def kubelet_log(self) -> str:
        """What every kubelet started so far logged."""
        return "".join(
            log.read_text(errors="replace") for log in sorted((self.work / "logs").glob("kubelet*.log"))
        )

    def device_plugin_gaps(self) -> list[float]:
        """Seconds from each end of a device plugin's ListAndWatch stream to the next registration, from the
        kubelet's own log (every kubelet started so far): while one lasts, the kubelet counts every device of
        the resource Unhealthy (its PluginDisconnected)."""
        stamp = re.compile(r"^[IEW]\d{4} (\d\d):(\d\d):(\d\d\.\d+)")
        ended: float | None = None
        gaps = []
        for log in sorted((self.work / "logs").glob("kubelet*.log")):
            for line in log.read_text(errors="replace").splitlines():
                found = stamp.match(line)
                if not found:
                    continue
                hours, minutes, seconds = found.groups()
                at = int(hours) * 3600 + int(minutes) * 60 + float(seconds)
                if "ListAndWatch ended unexpectedly" in line:
                    ended = at
                elif "Got registration request from device plugin" in line and ended is not None:
                    gaps.append(at - ended)
                    ended = None
        return gaps

    # -- stop -----------------------------------------------------------------------------------------------

    def stop_component(self, name: str) -> None:
        component = self.components.pop(name, None)
        if component is None or component.process.poll() is not None:
            return
        with contextlib.suppress(ProcessLookupError):
            os.killpg(component.process.pid, signal.SIGTERM)
        try:
            component.process.wait(STOP_TIMEOUT)
        except subprocess.TimeoutExpired:
            with contextlib.suppress(ProcessLookupError):
                os.killpg(component.process.pid, signal.SIGKILL)
            with contextlib.suppress(subprocess.TimeoutExpired):  # leftovers() names it
                component.process.wait(STOP_TIMEOUT)

    def _drain(self, runtime: Containerd) -> list[str]:
        """The pods deleted through the API while the kubelet runs, so that it stops their containers and
        their addresses are released as on a real node (no controller left to make them again); what remains
        removed through containerd; then containerd and every shim stopped."""
        if not self.with_node:
            return []
        if "kubelet" in self.components and "kube-apiserver" in self.components:
            self.stop_component("kube-controller-manager")
            self.kubectl(
                "delete", "pods", "--all", "--all-namespaces", "--grace-period=1", "--timeout=60s",
                check=False, timeout=90,
            )  # fmt: skip
        self.stop_component("kubelet")
        problems = runtime.remove_everything() if "containerd" in self.components else []
        self.stop_component("containerd")
        runtime.kill_shims()
        return problems + runtime.remove_cgroups()

    def stop(self) -> list[str]:
        """Stops everything and removes what the cluster made; returns what could not be put back."""
        try:
            return self._stop()
        finally:
            if self._machine is not None:
                self._machine.close()  # the lock goes with it
                self._machine = None

    def _stop(self) -> list[str]:
        if not self.began:  # refused at its start: the kubelet's mounts, the shims and cgroups are another's
            problems = self.devices.remove()
            shutil.rmtree(self.work, ignore_errors=True)
            return problems
        problems = self._drain(self.runtime) + self.devices.remove()
        for name in ("kube-scheduler", "kube-controller-manager", "kube-apiserver", "etcd"):
            self.stop_component(name)
        for name in list(self.components):
            self.stop_component(name)
        for out in self._logs:
            out.close()
        for point in _mounts_under(self.work, KUBELET_DIR):
            answer = subprocess.run(
                ["umount", point], capture_output=True, text=True, timeout=20, check=False
            )
            if answer.returncode != 0:
                problems.append(f"umount {point}: {answer.stderr.strip()}")
        if Path(f"/run/netns/{self.netns}").exists():
            answer = subprocess.run(
                ["ip", "netns", "delete", self.netns], capture_output=True, text=True, timeout=20, check=False
            )
            if answer.returncode != 0:
                problems.append(f"ip netns delete {self.netns}: {answer.stderr.strip()}")
        if self.sysctls:
            write_sysctls(self.sysctls)
            changed = {k: v for k, v in read_sysctls().items() if v != self.sysctls[k]}
            if changed:
                problems.append(f"kernel settings not put back: {changed} (were {self.sysctls})")
        for path in self.host_dirs_made:
            _remove_unless_mounted(path, problems)
        for path in self.driver_paths_absent:
            if path.exists():
                problems.append(f"{path} was made on the host (a bind mount of a driver path it lacks)")
                shutil.rmtree(path, ignore_errors=True)
        if os.environ.get("E2E_KEEP_WORK"):
            print(f"work directory kept: {self.work}")
        else:
            _remove_unless_mounted(self.work, problems)
        return problems

    def leftovers(self) -> list[str]:
        """What the cluster left on the machine after stop(): processes, mounts, files, the namespace."""
        if not self.began:
            return [f"work directory {self.work}"] if self.work.exists() else []
        found: list[str] = []
        binary = str(self.binary)
        for proc in Path("/proc").iterdir():
            if not proc.name.isdigit():
                continue
            with contextlib.suppress(OSError):
                if (proc / "cmdline").read_bytes().split(b"\0")[0].decode(errors="replace") == binary:
                    argv = (proc / "cmdline").read_bytes().replace(b"\0", b" ").decode(errors="replace")
                    found.append(f"process {proc.name}: {argv}")
        found += [f"containerd shim {pid}" for pid in self.runtime.shim_pids()]
        found += [f"cgroup {path}" for path in self.runtime.cgroups()]
        found += [f"device node {path}" for path in self.devices.made]
        found += [f"mount {point}" for point in _mounts_under(self.work, KUBELET_DIR)]
        found += [f"{path} (it did not exist before)" for path in self.host_dirs_made if path.exists()]
        if Path(f"/run/netns/{self.netns}").exists():
            found.append(f"network namespace {self.netns}")
        if self.work.exists() and not os.environ.get("E2E_KEEP_WORK"):
            found.append(f"work directory {self.work}")
        return found

"""The real node's container runtime: containerd with runc and the CNI plugins, built by ``build.sh`` from the
Go module proxy, configured to keep everything it makes under the cluster's work directory, and the images
it runs imported from OCI archives (no registry)::

    runtime = Containerd(binaries(), cluster.work / "containerd", cdi_dirs=[cluster.work / "cdi"])
    runtime.write_config()  # then runtime.tools["containerd"] with runtime.args(), runtime.env(os.environ)
    runtime.import_image(pause_archive(cache))
    runtime.ctr("-n", "k8s.io", "images", "ls")
"""

from __future__ import annotations

import contextlib
import hashlib
import json
import os
import signal
import subprocess
import time
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path

from tests.cluster.runtime.oci import write_archive

HERE = Path(__file__).resolve().parent
NAMESPACE = "k8s.io"  # the CRI plugin's containerd namespace
CGROUPS = Path("/sys/fs/cgroup")
# Where build.sh keeps the runtime's executables, and the pause image is kept.
CACHE = Path(
    os.environ.get("ASCEND_AGENT_NODE_CACHE")
    or Path(os.environ.get("XDG_CACHE_HOME") or Path.home() / ".cache") / "ascend-agent" / "node"
)
PAUSE_IMAGE = "localhost/ascend-e2e/pause:1"
POD_SUBNET = "10.88.0.0/24"
BRIDGE = "cni0"
# The images the kubelet must never garbage-collect (what kind does with the images it preloads).
PINNED = "io.cri-containerd.pinned=pinned"
_BINARIES = ("containerd", "ctr", "containerd-shim-runc-v2", "runc", "bridge", "loopback", "host-local")


class RuntimeProblem(Exception):
    """The runtime could not be built, started or given its images: one line that says which and why."""


def binaries(script: Path = HERE / "build.sh") -> dict[str, Path]:
    """The runtime's executables by name, built (or found in the cache) by ``build.sh``."""
    answer = subprocess.run([str(script)], capture_output=True, text=True, timeout=3600, check=False)
    if answer.returncode != 0:
        raise RuntimeProblem(f"{script} exited {answer.returncode}: {answer.stderr.strip()[-2000:]}")
    found = dict(line.split(" ", 1) for line in answer.stdout.splitlines() if " " in line)
    missing = [name for name in _BINARIES if name not in found]
    if missing:
        raise RuntimeProblem(f"{script} printed no {', '.join(missing)}")
    return {name: Path(path) for name, path in found.items()}


def pause_archive(cache: Path = CACHE) -> Path:
    """The pause image (``pause.c``, static) as an OCI archive in ``cache``, made once per source."""
    source = HERE / "pause.c"
    key = hashlib.sha256(source.read_bytes() + (HERE / "oci.py").read_bytes()).hexdigest()[:12]
    archive = cache / f"pause-{key}.tar"
    if archive.is_file():
        return archive
    cache.mkdir(parents=True, exist_ok=True)
    binary = cache / f"pause-{key}"
    answer = subprocess.run(
        ["gcc", "-Os", "-static", "-s", "-o", str(binary), str(source)],
        capture_output=True,
        text=True,
        timeout=120,
        check=False,
    )
    if answer.returncode != 0:
        raise RuntimeProblem(f"gcc {source}: {answer.stderr.strip()}")
    write_archive(archive, PAUSE_IMAGE, {"pause": binary.read_bytes()}, ["/pause"], user="65535:65535")
    binary.unlink()
    return archive


@dataclass
class Containerd:
    """One containerd whose state, sockets, snapshots, runc state, CNI configuration and IP leases all live
    under ``work``. ``cdi_dirs`` are where it reads CDI specs."""

    tools: Mapping[str, Path]
    work: Path
    cdi_dirs: Sequence[Path] = ()

    @property
    def socket(self) -> Path:
        return self.work / "containerd.sock"

    @property
    def endpoint(self) -> str:
        return f"unix://{self.socket}"

    @property
    def config(self) -> Path:
        return self.work / "config.toml"

    @property
    def bin_dir(self) -> Path:
        """Every runtime executable, linked: containerd finds its shim on PATH, the shim finds runc there."""
        return self.work / "bin"

    def write_config(self) -> None:
        for directory in ("bin", "net.d", "cni-ipam", "root", "state", "runc", "opt"):
            (self.work / directory).mkdir(parents=True, exist_ok=True)
        for name, path in self.tools.items():
            link = self.bin_dir / name
            link.unlink(missing_ok=True)
            link.symlink_to(path)
        conflist = {
            "cniVersion": "1.0.0",
            "name": "ascend-e2e",
            "plugins": [
                {
                    "type": "bridge",
                    "bridge": BRIDGE,
                    "isGateway": True,
                    "ipMasq": False,
                    "hairpinMode": True,
                    "ipam": {
                        "type": "host-local",
                        "ranges": [[{"subnet": POD_SUBNET}]],
                        "routes": [{"dst": "0.0.0.0/0"}],
                        "dataDir": str(self.work / "cni-ipam"),
                    },
                }
            ],
        }
        (self.work / "net.d" / "10-ascend-e2e.conflist").write_text(json.dumps(conflist, indent=2))
        cdi = ", ".join(f"'{path}'" for path in self.cdi_dirs)
        self.config.write_text(
            f"""version = 3
root = '{self.work / "root"}'
state = '{self.work / "state"}'

[grpc]
  address = '{self.socket}'

[ttrpc]
  address = '{self.socket}.ttrpc'

[plugins]
  [plugins.'io.containerd.internal.v1.opt']
    path = '{self.work / "opt"}'
  [plugins.'io.containerd.nri.v1.nri']
    disable = true
  [plugins.'io.containerd.cri.v1.images']
    snapshotter = 'overlayfs'
    [plugins.'io.containerd.cri.v1.images'.pinned_images]
      sandbox = '{PAUSE_IMAGE}'
  [plugins.'io.containerd.cri.v1.runtime']
    # This machine's root lacks CAP_SYS_RESOURCE: runc init could not lower oom_score_adj.
    restrict_oom_score_adj = true
    netns_mounts_under_state_dir = true
    cdi_spec_dirs = [{cdi}]
    [plugins.'io.containerd.cri.v1.runtime'.containerd]
      default_runtime_name = 'runc'
      [plugins.'io.containerd.cri.v1.runtime'.containerd.runtimes.runc]
        runtime_type = 'io.containerd.runc.v2'
        [plugins.'io.containerd.cri.v1.runtime'.containerd.runtimes.runc.options]
          SystemdCgroup = false
          BinaryName = '{self.tools["runc"]}'
          Root = '{self.work / "runc"}'
    [plugins.'io.containerd.cri.v1.runtime'.cni]
      bin_dirs = ['{self.bin_dir}']
      conf_dir = '{self.work / "net.d"}'
      use_internal_loopback = true
  [plugins.'io.containerd.grpc.v1.cri']
    stream_server_address = '127.0.0.1'
"""
        )

    def args(self) -> list[str]:
        return ["--config", str(self.config)]

    def env(self, base: Mapping[str, str]) -> dict[str, str]:
        """``base`` with the runtime's executables first on PATH."""
        return {**base, "PATH": f"{self.bin_dir}:{base.get('PATH', '/usr/bin:/bin')}"}

    def ctr(self, *args: str, timeout: float = 120.0, check: bool = True) -> subprocess.CompletedProcess[str]:
        """``ctr`` against this containerd (its API is a unix socket: no network namespace needed)."""
        argv = [str(self.tools["ctr"]), "--address", str(self.socket), *args]
        answer = subprocess.run(argv, capture_output=True, text=True, timeout=timeout, check=False)
        if check and answer.returncode != 0:
            raise RuntimeProblem(f"ctr {' '.join(args)} exited {answer.returncode}: {answer.stderr.strip()}")
        return answer

    def wait_serving(self, alive: Callable[[], bool], timeout: float = 60.0) -> None:
        """Until ``ctr version`` answers; ``alive()`` False (the process ended) stops the wait at once."""
        deadline = time.monotonic() + timeout
        while time.monotonic() < deadline:
            if self.socket.exists() and self.ctr("version", timeout=10, check=False).returncode == 0:
                return
            if not alive():
                raise RuntimeProblem("containerd exited while starting")
            time.sleep(0.2)
        raise RuntimeProblem(f"containerd did not answer on {self.socket} within {timeout:.0f} s")

    def import_image(self, archive: Path) -> None:
        """The images of an OCI archive (this machine's platform) in the CRI namespace, pinned."""
        self.ctr("-n", NAMESPACE, "images", "import", "--label", PINNED, str(archive), timeout=600)

    def container_ids(self) -> list[str]:
        answer = self.ctr("-n", NAMESPACE, "containers", "ls", "-q", check=False, timeout=30)
        return answer.stdout.split() if answer.returncode == 0 else []

    def container_spec(self, container_id: str) -> dict[str, object]:
        """The OCI runtime spec containerd made for a container (CDI edits applied)."""
        info = json.loads(self.ctr("-n", NAMESPACE, "containers", "info", container_id).stdout)
        spec: dict[str, object] = info["Spec"]
        return spec

    def kill_tasks(self) -> None:
        """Every container's process killed and its task deleted (runc removes its cgroup); containerd's
        records of the containers stay."""
        for container_id in self.container_ids():
            self.ctr("-n", NAMESPACE, "tasks", "kill", "-s", "SIGKILL", container_id, check=False, timeout=30)
            self.ctr("-n", NAMESPACE, "tasks", "delete", "--force", container_id, check=False, timeout=30)

    def remove_everything(self) -> list[str]:
        """Every task killed and deleted, every container deleted; returns what would not go."""
        self.kill_tasks()
        problems = []
        for container_id in self.container_ids():
            answer = self.ctr("-n", NAMESPACE, "containers", "delete", container_id, check=False, timeout=30)
            if answer.returncode != 0 and "not found" not in answer.stderr:
                problems.append(f"container {container_id}: {answer.stderr.strip()}")
        return problems

    def kill_shims(self) -> None:
        """This containerd's shims ended (SIGKILL): they outlive containerd by design."""
        for pid in self.shim_pids():
            with contextlib.suppress(ProcessLookupError):
                os.kill(pid, signal.SIGKILL)

    def shim_pids(self) -> list[int]:
        """This containerd's shims still running (they outlive containerd by design): the shim's executable
        started with this containerd's address."""
        shim = self.tools["containerd-shim-runc-v2"].name
        found = []
        for proc in Path("/proc").iterdir():
            if proc.name.isdigit():
                with contextlib.suppress(OSError):
                    # By name: the executable's path reads "... (deleted)" once its cache entry is replaced.
                    if not os.readlink(proc / "exe").removesuffix(" (deleted)").endswith(f"/{shim}"):
                        continue
                    argv = (proc / "cmdline").read_bytes().split(b"\0")
                    if str(self.socket).encode() in argv:
                        found.append(int(proc.name))
        return found

    def cgroups(self) -> list[Path]:
        """The cgroups runc made for the CRI namespace's containers (a relative path under each hierarchy:
        the kubelet runs without cgroups per QoS class, so the pods get no parent of their own)."""
        return sorted(CGROUPS.glob(f"*/{NAMESPACE}"))

    def remove_cgroups(self) -> list[str]:
        """Those cgroups removed, deepest first (runc removes each container's own; their parent stays)."""
        problems = []
        for top in self.cgroups():
            for directory in sorted(top.glob("**/"), key=lambda path: len(path.parts), reverse=True):
                try:
                    directory.rmdir()
                except OSError as problem:
                    problems.append(f"cgroup {directory}: {problem.strerror}")
        return problems

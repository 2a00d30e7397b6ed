"""The Grafana dashboard (charts/ascend-agent/files/dashboard.json) and the agent's scrape against a real
Prometheus server: three agents as processes, scraped every second with honor_labels as the chart's
PodMonitor does, then every target of every panel asked through /api/v1/query must return data.

- node-1, the fake backend as a device plugin with a fault code scripted on chip 5 (RestartNPU), the hot
  reset in dry-run (reset steps), the cluster side (the API emulator) and a chip held by a pod (PodResources);
- node-2, the devfs backend over a fake npu-smi printing a captured 910B4 table with chip 5 in Alarm and its
  error codes: the telemetry (temperature, power, utilisation, HBM), chip_info and npu-smi's own series;
- node-3, the fake backend as a DRA driver, a chip given to a claim (PodResources' dynamic_resources).

The alert rules are loaded too: AscendChipFaultCode (no `for`) must fire for node-1 and node-2. Each agent's
scrape also goes through `promtool check metrics`."""

from __future__ import annotations

import asyncio
import json
import re
import subprocess
import time
import urllib.error
import urllib.parse
import urllib.request
from collections.abc import Callable
from contextlib import ExitStack
from pathlib import Path
from types import ModuleType
from typing import Any

from tests.prometheus.test_alert_rules import RULES
from tests.prometheus.tools import tool
from tests.support import FIXTURES, ROOT
from tests.support.agent_process import AgentProcess
from tests.support.apiserver import ApiServer
from tests.support.dra_kubelet import DraKubelet
from tests.support.host_tree import HostTree
from tests.support.http_probe import free_port, wait_answer
from tests.support.kubelet_standin import KubeletStandin
from tests.support.npusmi_fake import FakeNpuSmi, with_health
from tests.support.podresources import PodResourcesStandin
from tests.support.training_fixtures import read

DASHBOARD = ROOT / "charts" / "ascend-agent" / "files" / "dashboard.json"
JOB = "ascend-agent"
RESOURCE = "huawei.com/Ascend910"
DRIVER = "npu.huawei.com"
# Where the one-node panels look: the node with npu-smi's telemetry and an error code.
NODE = "node-2"
# Grafana's variables as the test's Prometheus has them: the time range and rate window cover the scrapes
# made so far (a second apart), so a rate or an increase has at least two samples.
VARIABLES = {"$node": NODE, "$job": JOB, "$__rate_interval": "1m", "$__range": "1h"}
B4_OK = (FIXTURES / "910B4x8-25.0.rc1.1-info.txt").read_text()
ALARM = read("npu-smi-info-t-health_fixture-alarm.txt").split("\n", 1)[1]  # the capture's command line off
# What a PodMonitor's scrape adds to each agent's series: the agent pod's own namespace, pod and container.
AGENT_POD = {"namespace": "kube-system", "container": "ascend-agent"}
WAIT = 20.0


def _queries() -> list[tuple[str, str]]:
    """(panel title, expression) of every target of every panel, the dashboard's variables substituted."""
    found = []
    for panel in json.loads(DASHBOARD.read_text(encoding="utf-8"))["panels"]:
        for target in panel.get("targets", []):
            expr = target["expr"]
            for name in sorted(VARIABLES, key=len, reverse=True):
                expr = expr.replace(name, VARIABLES[name])
            assert "$" not in expr, f"{panel['title']}: a variable the test does not know in {expr}"
            found.append((panel["title"], expr))
    return found


class Prometheus:
    """A Prometheus server on a free loopback port, its config and data in ``directory``."""

    def __init__(self, directory: Path, targets: dict[str, int]) -> None:
        self.port = free_port()
        config = {
            "global": {"scrape_interval": "1s", "scrape_timeout": "1s", "evaluation_interval": "1s"},
            "rule_files": [str(RULES)],
            "scrape_configs": [
                {
                    "job_name": JOB,
                    "honor_labels": True,
                    "static_configs": [
                        {"targets": [f"127.0.0.1:{port}"], "labels": {**AGENT_POD, "pod": f"agent-{name}"}}
                        for name, port in targets.items()
                    ],
                }
            ],
        }
        (directory / "prometheus.yml").write_text(json.dumps(config), encoding="utf-8")
        self.process = subprocess.Popen(
            [tool("prometheus"), f"--config.file={directory / 'prometheus.yml'}",
             f"--storage.tsdb.path={directory / 'data'}", f"--web.listen-address=127.0.0.1:{self.port}",
             "--log.level=warn"],
            stdout=subprocess.DEVNULL, stderr=subprocess.PIPE, stdin=subprocess.DEVNULL, text=True,
        )  # fmt: skip

    def api(self, path: str, **params: str) -> Any:
        url = f"http://127.0.0.1:{self.port}/api/v1/{path}?{urllib.parse.urlencode(params)}"
        with urllib.request.urlopen(url, timeout=5) as answer:
            body: dict[str, Any] = json.loads(answer.read())
        assert body["status"] == "success", body
        return body["data"]

    def wait(self, what: str, read: Callable[[], Any], holds: Callable[[Any], bool]) -> Any:
        """Ask ``read`` until ``holds`` of its answer, within WAIT seconds; fail naming ``what``."""
        deadline = time.monotonic() + WAIT
        while True:
            assert self.process.poll() is None, f"prometheus exited: {self.process.communicate()[1]}"
            try:
                answer = read()
            except urllib.error.URLError as refused:  # not listening yet
                answer = refused
            else:
                if holds(answer):
                    return answer
            if time.monotonic() > deadline:
                raise AssertionError(f"{what}: not within {WAIT} s; the last answer {answer}")
            time.sleep(0.1)

    def query(self, expr: str) -> list[dict[str, Any]]:
        result: list[dict[str, Any]] = self.api("query", query=expr)["result"]
        return result

    def close(self) -> None:
        self.process.terminate()
        self.process.communicate(timeout=10)


def _devfs_node(short_dir: Path, kubelet: KubeletStandin, port: int, podresources: Path) -> AgentProcess:
    host = HostTree(short_dir / "host").add_driver().add_management().add_chips(range(8))
    npu_smi = FakeNpuSmi(short_dir / "npu-smi")
    npu_smi.set_output("info", with_health(B4_OK, 5, "Alarm"))
    npu_smi.set_output("info -t health -i 5 -c 0", ALARM)
    return AgentProcess(
        ["run", "--backend", "devfs", "--host-root", str(host.root), "--npu-smi", str(npu_smi.path),
         "--kubelet-dir", str(kubelet.directory), "--metrics-address", f"127.0.0.1:{port}",
         "--health-interval", "1", "--pod-resources-socket", str(podresources), "--node-name", "node-2"]
    )  # fmt: skip


def _fake_node(
    short_dir: Path, kubelet: KubeletStandin, port: int, podresources: Path, apiserver: ApiServer
) -> AgentProcess:
    state = short_dir / "state.json"
    state.write_text(json.dumps({"faults": {"5": ["0x8c03a000"]}}))
    return AgentProcess(
        ["run", "--backend", "fake", "--fake-state", str(state), "--kubelet-dir", str(kubelet.directory),
         "--metrics-address", f"127.0.0.1:{port}", "--health-interval", "1",
         "--pod-resources-socket", str(podresources), "--kubeconfig", str(apiserver.kubeconfig),
         "--node-name", "node-1", "--hot-reset", "dry-run", "--hot-reset-idle", "1"]
    )  # fmt: skip


def _dra_node(short_dir: Path, port: int, podresources: Path, apiserver: ApiServer) -> AgentProcess:
    kubelet = short_dir / "dra" / "kubelet"
    for kubelets_own in (kubelet / "plugins_registry", kubelet / "plugins"):
        kubelets_own.mkdir(parents=True)
    return AgentProcess(
        ["run", "--backend=fake", "--fake-chips=4", f"--kubelet-dir={kubelet / 'device-plugins'}",
         f"--cdi-spec-dir={short_dir / 'dra' / 'cdi'}", f"--metrics-address=127.0.0.1:{port}",
         f"--pod-resources-socket={podresources}", f"--kubeconfig={apiserver.kubeconfig}",
         "--node-name=node-3", "--kubelet-api=dra", "--health-interval=1"]
    )  # fmt: skip


def _showing(pattern: str) -> Callable[[int | None, str], bool]:
    return lambda _, body: re.search(pattern, body) is not None


def test_every_dashboard_query_returns_data_from_a_real_prometheus(
    short_dir: Path,
    kubelet: KubeletStandin,
    kubelet_api: tuple[ModuleType, ModuleType],
    apiserver: ApiServer,
    podresources: PodResourcesStandin,
    podresources_api: ModuleType,
) -> None:
    queries = _queries()
    for node in ("node-1", "node-3"):
        apiserver.put("nodes", {"metadata": {"name": node, "uid": f"{node}-uid"}})
    # node-2's chip 2 in a pod, node-3's npu-1 in a claim. node-1's chips are in no pod (a kubelet of its
    # own): a pod on any chip of the reset group would cancel the hot reset's dry run.
    podresources.hold(RESOURCE, ["Ascend910-2"], "team-a", "train-0", "main")
    podresources.claim(DRIVER, "node-3", "npu-1", "team-b", "infer-0", "main", "infer")
    idle = PodResourcesStandin(short_dir / "idle.sock", podresources_api)
    idle.start()
    # Apart from the first's: an agent's own directory (its instance lock) is beside its kubelet directory.
    second_kubelet = KubeletStandin(short_dir / "node-2" / "kubelet", *kubelet_api)
    second_kubelet.start()
    ports = {"node-1": free_port(), "node-2": free_port(), "node-3": free_port()}
    with ExitStack() as stack:
        stack.callback(idle.stop)
        stack.callback(second_kubelet.stop)
        agents = {
            "node-1": _fake_node(short_dir, kubelet, ports["node-1"], idle.path, apiserver),
            "node-2": _devfs_node(short_dir, second_kubelet, ports["node-2"], podresources.path),
            "node-3": _dra_node(short_dir, ports["node-3"], podresources.path, apiserver),
        }
        for agent in agents.values():
            stack.callback(agent.close)
        # A DRA driver's holders are read once the kubelet has registered it.
        asyncio.run(DraKubelet(short_dir / "dra" / "kubelet" / "plugins_registry").register(DRIVER))
        # Each agent has what its panels show before Prometheus looks.
        for node, shows in (
            ("node-1", r'ascend_agent_resets_total\{[^}]*result="dry_run"'),
            ("node-2", r'ascend_agent_device_health\{[^}]*pod="train-0"'),
            ("node-2", r'ascend_agent_chip_fault\{[^}]*fault_class="RestartNPU"'),
            ("node-2", r"ascend_agent_chip_temperature_celsius\{"),
            ("node-3", r'ascend_agent_chip_info\{[^}]*claim="infer"'),
        ):
            try:
                wait_answer(ports[node], "/metrics", _showing(shows), timeout=WAIT)
            except AssertionError:
                log = "\n".join(agents[node].lines[-20:])
                raise AssertionError(f"{node}: no {shows} in /metrics within {WAIT} s; log:\n{log}") from None

        for node, port in ports.items():
            _, scraped = wait_answer(port, "/metrics", lambda status, _: status == 200)
            checked = subprocess.run(
                [tool("promtool"), "check", "metrics"],
                input=scraped,
                capture_output=True,
                text=True,
                timeout=30,
            )
            assert checked.returncode == 0 and not checked.stdout + checked.stderr, (
                f"{node}: {checked.stdout}{checked.stderr}"
            )

        prometheus = Prometheus(short_dir, ports)
        stack.callback(prometheus.close)
        prometheus.wait(
            "every agent scraped",
            lambda: prometheus.api("targets")["activeTargets"],
            lambda targets: len(targets) == 3 and all(t["health"] == "up" for t in targets),
        )
        prometheus.wait(
            "every panel's data",
            lambda: [f"{title}: {expr}" for title, expr in queries if not prometheus.query(expr)],
            lambda without_data: not without_data,
        )

        firing = prometheus.wait(
            "AscendChipFaultCode firing",
            lambda: prometheus.query('ALERTS{alertname="AscendChipFaultCode", alertstate="firing"}'),
            lambda found: len({alert["metric"]["node"] for alert in found}) == 2,
        )
        # node-2's sample has three codes of three classes; 8C03A000 is RestartNPU on both nodes.
        assert {(a["metric"]["node"], a["metric"]["code"], a["metric"]["fault_class"]) for a in firing} >= {
            ("node-1", "8C03A000", "RestartNPU"),
            ("node-2", "8C03A000", "RestartNPU"),
        }
        # honor_labels: a held chip's series name the pod holding it, a free chip's none, not the agent's pod.
        held = prometheus.query('ascend_agent_device_health{node="node-2", device="Ascend910-2"}')
        assert [series["metric"]["pod"] for series in held] == ["train-0"]
        free = prometheus.query('ascend_agent_device_health{node="node-2", device="Ascend910-3"}')
        assert [series["metric"].get("pod", "") for series in free] == [""]

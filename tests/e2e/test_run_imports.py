"""What ``ascend-agent run`` loads as a device plugin: the modules of the other commands, of the DRA driver,
of a cluster side that is off, of real hardware's tools under the fake backend, PyYAML without a file to read,
rich (typer's help renderer; ``--help`` is click's plain text now) and, once the command line has handed over
to the runner, the command line itself stay out of the process. Each module costs resident memory on every
node (bench/cluster.py measures it).

The agent runs as a real process with ``PYTHONPROFILEIMPORTTIME`` set: each interpreter writes a header, then
one line per module it imports, at whatever time it does, to stderr. The command line's interpreter comes
first; the runner it execs writes the second header."""

from __future__ import annotations

import re
import signal

from tests.support.agent_process import AgentProcess, fake_agent
from tests.support.apiserver import ApiServer
from tests.support.kubelet_standin import KubeletStandin

NODE = "imports-node"
_IMPORT = re.compile(r"^import time:\s+\d+ \|\s+\d+ \|\s*(\S+)$")
_HEADER = re.compile(r"^import time: self \[us\] \| cumulative \| imported package$")
# Loaded by no device plugin: the DRA driver and its generated APIs, the other commands' modules, the test
# suite's gRPC library.
NEVER = (
    "ascend_agent.kubelet.dra",
    "ascend_agent._proto.dra",
    "ascend_agent.doctor",
    "ascend_agent.kubelet.sim",
    "rich",
    "grpc",
)
# Loaded by the command line only, never by the runner it hands over to.
COMMAND_LINE = ("click", "typer", "shellingham", "ascend_agent.cli")
# The tools of real hardware (npu-smi, hccn_tool) and their parsers: never loaded by the fake backend.
HARDWARE_TOOLS = (
    "ascend_agent.backends.devfs",
    "ascend_agent.backends.network",
    "ascend_agent.backends.npusmi",
    "ascend_agent.backends.npusmi_processes",
    "ascend_agent.backends.npusmi_reset",
    "ascend_agent.backends.npusmi_vnpu",
    "ascend_agent.backends.hccn",
    "ascend_agent.backends.tool",
    "ascend_agent.backends.training",
    "ascend_agent.backends.vnpu",
)
# The plugin watcher's registration API, while registering over kubelet.sock (the default).
PLUGIN_WATCHER = ("ascend_agent.kubelet.plugin_watcher", "ascend_agent._proto.pluginregistration")
# The hot reset's task and its steps, while hotReset is off (the default).
HOT_RESET = ("ascend_agent.health.hotreset.manager",)
# Loaded only by the cluster side.
CLUSTER_SIDE = ("lightkube", "httpx2", "httpcore2", "msgspec", "ascend_agent.cluster.client")


def _imported(agent: AgentProcess) -> set[str]:
    """The modules the runner imported: those after the second interpreter's header."""
    headers = [index for index, line in enumerate(agent.lines) if _HEADER.match(line)]
    assert len(headers) == 2, f"not one command line and one runner: {len(headers)} interpreters"
    return {match[1] for line in agent.lines[headers[1] :] if (match := _IMPORT.match(line))}


def _under(modules: set[str], packages: tuple[str, ...]) -> list[str]:
    return sorted(m for m in modules if any(m == p or m.startswith(f"{p}.") for p in packages))


def _registered_then_stopped(
    kubelet: KubeletStandin, agent: AgentProcess, log: str | None = None
) -> set[str]:
    try:
        kubelet.wait_registrations(1)
        kubelet.wait_update(lambda u: len(u.devices) == 8, what="the first device list")
        if log is not None:
            agent.wait_log(log)
        code, _ = agent.terminate(signal.SIGTERM)
        assert code == 0, agent.output()
    finally:
        agent.close()
    return _imported(agent)


def test_a_device_plugin_without_the_cluster_side_loads_none_of_it(kubelet: KubeletStandin) -> None:
    agent = fake_agent(kubelet.directory, "--no-cluster", env={"PYTHONPROFILEIMPORTTIME": "1"})
    modules = _registered_then_stopped(kubelet, agent)
    seen = "no import lines read: the test sees nothing"
    assert "ascend_agent.kubelet.deviceplugin.service" in modules, seen
    assert "ascend_agent._proto.v1beta1" in modules
    assert _under(modules, NEVER) == []
    assert _under(modules, COMMAND_LINE) == []
    assert _under(modules, CLUSTER_SIDE) == []
    assert _under(modules, HARDWARE_TOOLS) == [], "the fake backend loaded the hardware tools' modules"
    assert "difflib" not in modules, "difflib loaded with no config key to suggest"
    assert _under(modules, HOT_RESET) == [], "the hot reset loaded with hotReset off"
    assert _under(modules, PLUGIN_WATCHER) == [], "the plugin watcher's API loaded with registration: kubelet"
    assert _under(modules, ("yaml",)) == [], "PyYAML loaded with no config file and no CDI spec to write"


def test_a_device_plugin_with_the_cluster_side_loads_no_dra_driver(
    kubelet: KubeletStandin, apiserver: ApiServer
) -> None:
    apiserver.put("nodes", {"metadata": {"name": NODE}})
    agent = fake_agent(
        kubelet.directory,
        *("--kubeconfig", str(apiserver.kubeconfig), "--node-name", NODE),
        env={"PYTHONPROFILEIMPORTTIME": "1"},
    )
    modules = _registered_then_stopped(kubelet, agent, log=f"Node {NODE} labels: ")
    assert "lightkube" in modules, "the cluster side did not load: the test sees nothing"
    assert _under(modules, NEVER) == []
    assert _under(modules, COMMAND_LINE) == []

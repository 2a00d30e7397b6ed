"""The doctor's checks of the running agent, asked over its HTTP endpoint: ``/readyz``, ``/chips`` (the chips
it holds, npu-smi down) and the Kubernetes API state of ``/healthz``::

    checks = await agent_checks("127.0.0.1:9464")
"""

from __future__ import annotations

from typing import TYPE_CHECKING

from ascend_agent.doctor.check import DIAL_TIMEOUT as _DIAL_TIMEOUT
from ascend_agent.doctor.check import Check
from ascend_agent.observability.chipstate import NoAnswer, ask_agent, http_get

if TYPE_CHECKING:
    pass


async def _get(address: str, path: str) -> tuple[str, str] | str:
    """(status line, body) of ``GET path`` on the agent's HTTP address; a string saying why not."""
    try:
        status, body = await http_get(address, path, _DIAL_TIMEOUT)
    except NoAnswer as exc:
        return f"nothing answers on {address}: {exc}"
    return status, body.decode("latin-1")


async def _agent_chips(address: str) -> list[Check]:
    """What only the running agent knows: chips it holds Unhealthy for flapping, and npu-smi down."""
    held_name, down_name = "held chips (agent)", "npu-smi (agent)"
    view = await ask_agent(address)
    if isinstance(view, str):
        return [Check(held_name, None, f"unknown: {view}"), Check(down_name, None, f"unknown: {view}")]
    held = view.held()
    checks = [
        Check(
            held_name,
            False,
            "; ".join(f"{device} {state.hold_text()}" for device, state in sorted(held.items())),
            "they come back by themselves once Healthy for flapQuiet s; the agent's log says why they "
            "flapped (is held Unhealthy)",
        )
        if held
        else Check(held_name, True, "none")
    ]
    if view.npu_smi_down:
        checks.append(
            Check(
                down_name,
                False,
                view.npu_smi_down,
                "run npu-smi info on the host (the npu-smi check above says what to mount when it fails "
                "in the agent's container); the chips come back by themselves once it answers",
            )
        )
    else:
        checks.append(Check(down_name, True, "answers"))
    return checks


async def _kubernetes_api(address: str) -> Check:
    """The agent's own view of the API server (the /healthz detail): what its cluster side writes through."""
    name = "kubernetes api (agent)"
    if not address:
        return Check(name, None, "skipped: --metrics-address is empty")
    answer = await _get(address, "/healthz")
    if isinstance(answer, str):
        return Check(name, None, f"skipped: {answer}")
    detail = next((line for line in answer[1].splitlines() if line.startswith("kubernetes api: ")), "")
    if not detail:
        return Check(name, None, "skipped: the agent's cluster side is off (--no-cluster, or no credentials)")
    state = detail.removeprefix("kubernetes api: ")
    if state.endswith(": up"):
        return Check(name, True, state)
    if state == "starting" or state.endswith(": no request yet"):
        return Check(name, None, state)
    return Check(
        name,
        False,
        state,
        "node labels and Events wait (the device plugin works without them): for 403, grant the verb in the "
        "agent's ClusterRole; else check the API server and the agent's network",
    )


async def _readiness(address: str) -> Check:
    if not address:
        return Check("agent readiness", None, "skipped: --metrics-address is empty")
    answer = await _get(address, "/readyz")
    if isinstance(answer, str):
        return Check("agent readiness", False, answer, "is the agent running with this --metrics-address?")
    status, body = answer
    if " 200 " in status + " ":
        return Check("agent readiness", True, f"{address}/readyz: ready")
    return Check("agent readiness", False, f"{address}/readyz: {body.strip()}", "see the agent's log for why")


async def agent_checks(address: str) -> list[Check]:
    """Readiness, the agent's own view of the chips, and its Kubernetes API state."""
    return [await _readiness(address), *await _agent_chips(address), await _kubernetes_api(address)]

"""Asking the running agent over its HTTP endpoint (``chipstate.http_get``, used by ``list`` and the doctor):
the whole answer, however it arrives, and a wildcard address asked on loopback."""

from __future__ import annotations

import time
from collections.abc import AsyncIterator

import pytest

from ascend_agent.doctor import agent as doctor
from ascend_agent.model import Chip, Health, Inventory
from ascend_agent.observability import serve_http, serve_json
from ascend_agent.observability.chipstate import CHIPS_PATH, NoAnswer, ask_agent, chip_states, http_get
from tests.support.http_probe import free_port

# A chip list of about 1.6 MB: far more than one read of a socket gives.
_CHIPS = tuple(
    Chip.make(n, "910B4").with_health(Health.UNHEALTHY, f"fault {n}: " + "x" * 800) for n in range(2000)
)


@pytest.fixture
async def port() -> AsyncIterator[int]:
    """The agent's HTTP endpoint on loopback, serving a large /chips."""
    number = free_port()
    server = await serve_http(f"127.0.0.1:{number}", lambda: (True, ""))
    document = chip_states(Inventory(chips=_CHIPS), lambda _: None, "", now=time.time())
    serve_json(CHIPS_PATH, lambda: document)
    yield number
    serve_json(CHIPS_PATH, None)
    server.close()
    await server.wait_closed()


async def test_a_large_chip_list_is_read_whole(port: int) -> None:
    view = await ask_agent(f"127.0.0.1:{port}")
    assert not isinstance(view, str), view
    assert len(view.chips) == len(_CHIPS)
    assert view.chips["Ascend910-1999"].reason.startswith("fault 1999: ")


@pytest.mark.parametrize("host", ["0.0.0.0", "[::]", ""])
async def test_a_wildcard_address_is_asked_on_loopback(port: int, host: str) -> None:
    assert await doctor._get(f"{host}:{port}", "/readyz") == ("HTTP/1.0 200 OK", "ready\n")
    view = await ask_agent(f"{host}:{port}")
    assert not isinstance(view, str), view


async def test_no_agent_is_one_reason() -> None:
    with pytest.raises(NoAnswer, match=r"^connection refused$"):
        await http_get(f"127.0.0.1:{free_port()}", "/readyz")

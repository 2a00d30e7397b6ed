"""Probing the agent's HTTP endpoint from tests: a free port, one GET, and waiting for an answer to hold::

port = free_port()
status, body = wait_answer(port, "/readyz", lambda status, body: status == 200)
"""

from __future__ import annotations

import http.client
import re
import socket
import time
from collections.abc import Callable

from tests.support import PATIENCE

_POLL = 0.01
_NODE_LABEL = re.compile(r'\{node="[^"]*"\}|,node="[^"]*"|(?<=\{)node="[^"]*",')


def without_node(metrics: str) -> str:
    """A /metrics body without the ``node`` label every series carries (asserted where it is the point:
    tests/e2e/test_chip_faults.py), so that a test matches a series by the labels it is about:
    ``b{code="OK",node="n",r="x"} 2.0`` becomes ``b{code="OK",r="x"} 2.0``.
    """
    return _NODE_LABEL.sub("", metrics)


def free_port() -> int:
    with socket.socket() as probe:
        probe.bind(("127.0.0.1", 0))
        return int(probe.getsockname()[1])


def get(port: int, path: str, timeout: float = 5.0) -> tuple[int, str] | None:
    """(status, body) of ``GET path`` on 127.0.0.1:``port``; None when nothing listens there. A /metrics
    body comes :func:`without_node`."""
    connection = http.client.HTTPConnection("127.0.0.1", port, timeout=timeout)
    try:
        connection.request("GET", path)
        response = connection.getresponse()
        body = response.read().decode()
        return response.status, without_node(body) if path == "/metrics" else body
    except ConnectionRefusedError:
        return None
    finally:
        connection.close()


def wait_answer(
    port: int,
    path: str,
    predicate: Callable[[int | None, str], bool],
    timeout: float = PATIENCE,
    what: str = "answer",
) -> tuple[int | None, str]:
    """GET ``path`` until ``predicate(status, body)`` holds (status None: refused); the answer that did."""
    deadline = time.monotonic() + timeout
    seen: list[tuple[int | None, str]] = []
    while True:
        answer = get(port, path)
        status, body = answer if answer is not None else (None, "")
        if predicate(status, body):
            return status, body
        if not seen or seen[-1] != (status, body):
            seen.append((status, body))
        if time.monotonic() > deadline:
            raise AssertionError(f"no {what} from 127.0.0.1:{port}{path} within {timeout} s; saw {seen[-5:]}")
        time.sleep(_POLL)

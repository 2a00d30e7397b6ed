"""The state of the API server as the agent sees it: ``ascend_agent_kube_api_up``, the ``/healthz`` detail,
and one log line per kind of failure while it lasts.

Every request the cluster side makes goes through :meth:`ApiHealth.record_success` or
:meth:`ApiHealth.record_failure` under a *channel*: the verb and resource (``patch nodes``). A channel that
fails the same way again logs nothing; a new kind of failure logs one line; its first success logs one
line saying it works again.
"""

from __future__ import annotations

import logging
from dataclasses import dataclass

from prometheus_client import Gauge

log = logging.getLogger("ascend_agent.cluster")

KUBE_API_UP = Gauge(
    "ascend_agent_kube_api_up",
    "1 while requests to the Kubernetes API server succeed, 0 while it is down, hangs or refuses.",
)


@dataclass(frozen=True, slots=True)
class Failure:
    """One kind of failure: ``status`` is the HTTP status (0 when no answer came) and ``what`` says which."""

    status: int
    what: str

    def __str__(self) -> str:
        return self.what


@dataclass(frozen=True, slots=True)
class ApiState:
    up: bool | None  # None: nothing asked yet
    detail: str


class ApiHealth:
    """What ``ascend_agent_kube_api_up`` and ``/healthz`` say, fed by the result of every request."""

    def __init__(self, server: str) -> None:
        self.server = server
        self._failing: dict[str, Failure] = {}
        self._asked = False

    def record_success(self, channel: str) -> None:
        self._asked = True
        failure = self._failing.pop(channel, None)
        if failure is not None:
            log.info("Kubernetes API: %s works again", channel)
        self._publish()

    def record_failure(self, channel: str, failure: Failure) -> None:
        self._asked = True
        if self._failing.get(channel) != failure:
            self._failing[channel] = failure
            log.warning("Kubernetes API %s: %s failed: %s", self.server, channel, failure)
        self._publish()

    def state(self) -> ApiState:
        if not self._asked:
            return ApiState(None, f"{self.server}: no request yet")
        if not self._failing:
            return ApiState(True, f"{self.server}: up")
        failures = "; ".join(f"{channel}: {failure}" for channel, failure in sorted(self._failing.items()))
        return ApiState(False, f"{self.server}: {failures}")

    def _publish(self) -> None:
        KUBE_API_UP.set(0 if self._failing else 1)

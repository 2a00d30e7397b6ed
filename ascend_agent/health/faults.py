"""Fault codes in words, and ``faultPolicy``: the codes or code prefixes the config file grades itself.

The policy maps codes or prefixes to ``healthy`` or ``unhealthy``; the longest matching prefix wins, and a
code it does not name is left to the fault table (:mod:`ascend_agent.health.grading`)::

    policy = FaultPolicy({"80E3A203": "healthy", "8C": "unhealthy"})
    policy.verdict("8C1F8609")   # "unhealthy"
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping

from ascend_agent.model import Fault


class FaultPolicy:
    """The configured policy (``faultPolicy``).

    >>> policy = FaultPolicy({"80E3A203": "healthy", "80E3": "unhealthy"})
    >>> policy.verdict("80e3a203"), policy.verdict("80E18005"), policy.verdict("80E3A201")
    ('healthy', None, 'unhealthy')
    """

    def __init__(self, configured: Mapping[str, str]) -> None:
        self._configured = {prefix.upper(): verdict for prefix, verdict in configured.items()}

    def verdict(self, code: str) -> str | None:
        """``healthy``, ``unhealthy``, or None when the policy does not name the code."""
        code = code.upper()
        matches = [prefix for prefix in self._configured if code.startswith(prefix)]
        return self._configured[max(matches, key=len)] if matches else None


def describe(health: str, faults: Iterable[Fault]) -> str:
    """``Alarm, error code 80E3A203 (heartbeat lost)``: the Health column and the codes, for logs and reasons.

    >>> describe("Critical", [Fault("80E18005", "adda heart beat lost"), Fault("80CB8009")])
    'Critical, error codes 80E18005 (adda heart beat lost), 80CB8009'
    """
    listed = [f"{fault.code} ({fault.text})" if fault.text else fault.code for fault in faults]
    if not listed:
        return f"npu-smi reports health {health}"
    return f"{health}, error code{'s' if len(listed) > 1 else ''} {', '.join(listed)}"

"""Fault codes: which error codes of ``npu-smi info -t health`` keep a chip Healthy or make it Unhealthy.

The policy maps codes or code prefixes to ``healthy`` or ``unhealthy``; the longest matching prefix wins. The
configured policy (``faultPolicy`` in the config file) is asked first, then the defaults; a code neither
names leaves the decision to the Health column (``healthyStates``)::

    policy = FaultPolicy({"80E3A203": "healthy", "8C": "unhealthy"})
    policy.verdict("8C1F8609")   # "unhealthy": the configured "8C" before the defaults' exact code

The defaults are Huawei's own classes, as its device plugin ships them: codes it does not act on
(``NotHandleFaultCodes``) and sub-health codes (``SubHealthFaultCodes``) are ``healthy``; codes after which
the NPU must be reset or isolated (``RestartNPUCodes``, ``FreeRestartNPUCodes``, ``SeparateNPUCodes``) are
``unhealthy``. Codes that only ask for the job to restart are left to the Health column.
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping, Sequence

from ascend_agent.model import Fault

HEALTHY = "healthy"
UNHEALTHY = "unhealthy"
VERDICTS = (HEALTHY, UNHEALTHY)

# fmt: off
_INFORMATIONAL = (
    "4C1F8608", "80818200", "80818201", "80818202", "80818203", "80818204", "80818205", "80818C06",
    "80A18005", "80A18006", "80A38003", "80A38006", "80A58003", "80A58006", "80B78005", "80B78006",
    "80B98006", "80BD8006", "80C98006", "80CB8006", "80CD8003", "80CD8006", "80D38009", "80DD8007",
    "80DD8008", "80DE0200", "80DE0207", "80DE1803", "80DE1805", "80DF8006", "80DF8400", "80DF8401",
    "80E00209", "80E01805", "80E01809", "80E18006", "80E1800F", "80E18400", "80E18401", "80E18405",
    "80E20207", "80E21007", "80E38003", "80F18003", "80F18006", "80F38003", "80F38006", "80F38009",
    "80F78006", "80FB8000", "81078603", "81078605", "81318006", "81338004", "81338006", "813B8004",
    "813B8006", "81478004", "81478006", "814D8006", "814F8004", "814F8006", "81578004", "81578006",
    "815F8004", "815F8006", "816F8004", "816F8006", "817F8004", "817F8006", "81938004", "81938006",
    "81958004", "81958006", "81978004", "81978006", "81998006", "819B8003", "819B8006", "819B800D",
    "819B8605", "819D8000", "81A3880C", "81AD8605", "8C1F8608", "8C1F8609", "8C1F860A", "8C1F860B",
    "8C2FA001", "8C2FA009", "A2140007", "A2140008", "A2140009", "A214000A", "A214000B", "A214000D",
    "A4025021", "A4025041", "A4025061", "A4025081", "A40250E1", "A4025101", "A4028801", "A4140007",
    "A4140008", "A4140009", "A414000A", "A414000B", "A414000C", "A414000D", "A4303002", "A60250C1",
)
_FATAL = (
    "40F84E00", "4C4BA00C", "80818C00", "80818C05", "80A18008", "80A38008", "80A58008", "80B58000",
    "80B78000", "80B98000", "80B98008", "80BD8008", "80C78008", "80C98001", "80CB8001", "80CD8008",
    "80CF8000", "80CF8008", "80CF8009", "80DE1801", "80DF8000", "80DF8008", "80DF8009", "80DF800A",
    "80DF8402", "80E0020B", "80E18000", "80E18005", "80E18008", "80E1800A", "80E18402", "80E18404",
    "80E21008", "80E2120D", "80E21E01", "80E24E00", "80E38008", "80E39200", "80E3A201", "80E3A202",
    "80E3A203", "80E3A207", "80E44E00", "80E58005", "80E58009", "80E58E02", "80E58E03", "80E78000",
    "80E78008", "80F18000", "80F18008", "80F1800A", "80F2180D", "80F38008", "80F78003", "80F78008",
    "80F78009", "80F78C02", "80F78C03", "80F78C04", "80FA4E00", "80FB8005", "812E4E00", "812F8000",
    "81338002", "81338008", "8139800A", "813B8002", "813B8008", "813F800A", "8145800A", "81478002",
    "81478008", "81498004", "814F8002", "814F8008", "81578002", "81578008", "815F8002", "815F8008",
    "816F8002", "816F8008", "817F8002", "817F8008", "81938002", "81938008", "81958002", "81958008",
    "81978002", "81978008", "81998008", "81998009", "819B800A", "81B38008", "81C5800A", "81C7800A",
    "81C9800A", "8C03A000", "8C044E00", "8C064E00", "8C084E00", "8C0A4E00", "8C0C4E00", "8C0E4E00",
    "8C104E00", "8C124E00", "8C17A005", "8C19A005", "8C1DA005", "8C1FA006", "8C464E00", "8C4BA00C",
    "9419321B", "A2141004", "A2141006", "A2142004", "A2142006", "A2145004", "A2301000", "A2301001",
    "A2302001", "A4183200", "A4192C1A", "A4193216", "A4193217", "A4193218", "A419321B", "A419321C",
    "A42A0000", "A42F390F", "A42F3916", "A42F3917", "A42F3918", "A42F391A", "A6023001", "A6023002",
    "A6023003", "A6023004", "A6060000", "A6060001", "A6060002", "A6060003", "A6060004", "A6060005",
    "A606000A", "A606000B", "A606000C", "A606000F", "A606009D", "A6060FFF", "A607FFFF", "A6140001",
    "A6140002", "A6140003", "A6140004", "A6140005", "A6140006", "A6141003", "A6142003", "A6143003",
    "A6144003", "A6145003", "A6183207", "A6192D15", "A6193206", "A6193215", "A6193248", "A62F3905",
    "A62F3934", "A62FFFFF", "A6303003", "A6303004", "A6360000", "A6361000", "A6362000", "A8021004",
    "A8028801", "A8060FFF", "A807FFFF", "A819320F", "A8193234", "A8193235", "A82A0000",
)
# fmt: on
DEFAULT_FAULT_POLICY: Mapping[str, str] = {
    **dict.fromkeys(_INFORMATIONAL, HEALTHY),
    **dict.fromkeys(_FATAL, UNHEALTHY),
}


def _longest_prefix(policy: Mapping[str, str], code: str) -> str | None:
    matches = [prefix for prefix in policy if code.startswith(prefix)]
    return policy[max(matches, key=len)] if matches else None


class FaultPolicy:
    """The configured policy over the defaults.

    >>> policy = FaultPolicy({"80E3A203": "healthy"})
    >>> policy.verdict("80E3A203"), policy.verdict("80E18005"), policy.verdict("00000001")
    ('healthy', 'unhealthy', None)
    """

    def __init__(
        self, configured: Mapping[str, str], defaults: Mapping[str, str] = DEFAULT_FAULT_POLICY
    ) -> None:
        self._configured = {prefix.upper(): verdict for prefix, verdict in configured.items()}
        self._defaults = defaults

    def verdict(self, code: str) -> str | None:
        """``healthy``, ``unhealthy``, or None when neither the configured policy nor the defaults name it."""
        code = code.upper()
        return _longest_prefix(self._configured, code) or _longest_prefix(self._defaults, code)

    def healthy(self, column_healthy: bool, faults: Sequence[Fault]) -> bool:
        """Whether a chip is Healthy: any ``unhealthy`` code makes it Unhealthy; codes that are all
        ``healthy`` keep it Healthy whatever the Health column says; else the Health column decides."""
        verdicts = [self.verdict(fault.code) for fault in faults]
        if UNHEALTHY in verdicts:
            return False
        if verdicts and all(verdict == HEALTHY for verdict in verdicts):
            return True
        return column_healthy


def describe(health: str, faults: Iterable[Fault]) -> str:
    """``Alarm, error code 80E3A203 (heartbeat lost)``: the Health column and the codes, for logs and reasons.

    >>> describe("Critical", [Fault("80E18005", "adda heart beat lost"), Fault("80CB8009")])
    'Critical, error codes 80E18005 (adda heart beat lost), 80CB8009'
    """
    listed = [f"{fault.code} ({fault.text})" if fault.text else fault.code for fault in faults]
    if not listed:
        return f"npu-smi reports health {health}"
    return f"{health}, error code{'s' if len(listed) > 1 else ''} {', '.join(listed)}"

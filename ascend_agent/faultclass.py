"""Huawei's fault classes (``faultCode.json``), ordered from the mildest to the most severe; a chip's class
is the most severe of its fault codes' classes and their escalations.

    >>> FaultClass.RESTART_NPU > FaultClass.SUB_HEALTH, FaultClass.RESTART_NPU.huawei
    (True, 'RestartNPU')
    >>> max(FaultClass.NOT_HANDLE, FaultClass.FREE_RESTART_NPU).unhealthy
    True
    >>> FaultClass.from_huawei("SubHealthFault")
    <FaultClass.SUB_HEALTH: 1>

The name Huawei writes (``fault_level``, ``fault_handling`` in the device-info ConfigMap, ``FaultHandling``
in ``faultCustomization.json``) is :attr:`FaultClass.huawei`; the kubelet sees a chip Unhealthy from
``FreeRestartNPU`` up (:attr:`FaultClass.unhealthy`).
"""

from __future__ import annotations

import enum


class FaultClass(enum.IntEnum):
    """One of Huawei's eight fault classes; a greater value is more severe."""

    NOT_HANDLE = 0
    SUB_HEALTH = 1
    RESTART_REQUEST = 2
    RESTART_BUSINESS = 3
    FREE_RESTART_NPU = 4
    RESTART_NPU = 5
    PRE_SEPARATE_NPU = 6
    SEPARATE_NPU = 7

    @property
    def huawei(self) -> str:
        """The class as Huawei writes it: ``NotHandleFault``, ``SubHealthFault``, ``RestartRequest``..."""
        return _HUAWEI[self]

    @property
    def unhealthy(self) -> bool:
        """Whether a chip of this class is Unhealthy to the kubelet (from ``FreeRestartNPU`` up)."""
        return self >= FaultClass.FREE_RESTART_NPU

    @classmethod
    def from_huawei(cls, name: str) -> FaultClass:
        """The class Huawei names ``name``; ``ValueError`` for any other name."""
        for fault_class, huawei in _HUAWEI.items():
            if huawei == name:
                return fault_class
        raise ValueError(f"{name!r} is not a fault class ({', '.join(HUAWEI_NAMES)})")


_HUAWEI = {
    FaultClass.NOT_HANDLE: "NotHandleFault",
    FaultClass.SUB_HEALTH: "SubHealthFault",
    FaultClass.RESTART_REQUEST: "RestartRequest",
    FaultClass.RESTART_BUSINESS: "RestartBusiness",
    FaultClass.FREE_RESTART_NPU: "FreeRestartNPU",
    FaultClass.RESTART_NPU: "RestartNPU",
    FaultClass.PRE_SEPARATE_NPU: "PreSeparateNPU",
    FaultClass.SEPARATE_NPU: "SeparateNPU",
}
HUAWEI_NAMES = tuple(_HUAWEI.values())

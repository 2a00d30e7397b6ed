"""Every name the agent gives to the outside: resources, device IDs, sockets, CDI devices. One place, so the
kubelet, the CDI spec, the doctor and the backends always agree.

>>> family_for("Ascend910", "910B4", "huawei"), family_for("Ascend910", "910B4", "model")
('Ascend910', 'Ascend910B4')
>>> resource = resource_name("Ascend910")
>>> resource, device_id("Ascend910", 3), socket_name(resource), registry_socket_name(resource)
('huawei.com/Ascend910', 'Ascend910-3', 'Ascend910.sock', 'huawei.com_Ascend910.sock')
>>> replica_ids("Ascend310P-0", 2), cdi_device_name("Ascend910-3")
(('Ascend310P-0-0', 'Ascend310P-0-1'), 'huawei.com/npu=Ascend910-3')
"""

from __future__ import annotations

import hashlib

RESOURCE_DOMAIN = "huawei.com"
# The kubelet refuses longer device IDs.
MAX_DEVICE_ID_LENGTH = 63
# ``huawei``: Huawei's per-generation names (``huawei.com/Ascend910``); ``model``: one resource per SKU
# (``huawei.com/Ascend910B4``), as some schedulers expect.
NAMING_SCHEMES = ("huawei", "model")
CDI_KIND = "huawei.com/npu"
# Huawei's resource family of each chip generation (``model.Generation``): every 910 is ``Ascend910``; Atlas
# 350/850/950 (Ascend 950) are advertised as ``huawei.com/npu``.
DEFAULT_FAMILIES = {
    "910A": "Ascend910",
    "910B": "Ascend910",
    "910A3": "Ascend910",
    "310P": "Ascend310P",
    "310B": "Ascend310",
    "310": "Ascend310",
    "950": "npu",
}


def family_for(default_family: str, model: str, scheme: str) -> str:
    """A chip's resource family: its generation's ``default_family``, or the SKU under ``model`` naming."""
    return f"Ascend{model}" if scheme == "model" else default_family


def resource_name(family: str) -> str:
    return f"{RESOURCE_DOMAIN}/{family}"


def device_id(family: str, phys_id: int) -> str:
    return f"{family}-{phys_id}"


def device_path(phys_id: int) -> str:
    """The chip's device node on the host, as the container runtime must see it."""
    return f"/dev/davinci{phys_id}"


def replica_ids(chip_id: str, replicas: int) -> tuple[str, ...]:
    """The device IDs advertised for one chip shared ``replicas`` times; ``ValueError`` below 1."""
    if replicas < 1:
        raise ValueError(f"replicas must be at least 1, got {replicas}")
    if replicas == 1:
        return (chip_id,)
    return tuple(f"{chip_id}-{n}" for n in range(replicas))


def advertised_resource(resource: str, replicas: int, rename_shared: bool) -> str:
    """The name a resource is advertised under: ``<resource>.shared`` when its chips are shared
    (``replicas`` > 1) and ``renameShared`` is on, so that nobody takes a slice for a chip.

    >>> [advertised_resource("huawei.com/Ascend910", replicas, True) for replicas in (4, 1)]
    ['huawei.com/Ascend910.shared', 'huawei.com/Ascend910']
    """
    return f"{resource}.shared" if rename_shared and replicas > 1 else resource


def socket_name(resource: str) -> str:
    """The DevicePlugin socket of a resource, in the kubelet's directory or the plugin directory."""
    return resource.rpartition("/")[2] + ".sock"


def registry_socket_name(resource: str) -> str:
    """The plugin-watcher registration socket of a resource, in the kubelet's plugins registry."""
    return resource.replace("/", "_") + ".sock"


def cdi_device_name(chip_device_id: str) -> str:
    """The fully qualified CDI name of a chip."""
    return f"{CDI_KIND}={chip_device_id}"


# The longest name of a Kubernetes object named as a DNS subdomain (ResourceSlices, Events).
MAX_OBJECT_NAME_LENGTH = 253
_NAME_HASH_LENGTH = 10


def object_name(name: str) -> str:
    """``name`` when it fits an object name; else its head and a hash of the whole, so that two long names
    that differ only at the end stay two names, and the result is still a DNS subdomain:

    >>> object_name("node-1-npu.huawei.com-0")
    'node-1-npu.huawei.com-0'
    >>> long = object_name("n" * 250 + ".example-npu.huawei.com-0")
    >>> len(long), long[:3], long[-11]
    (253, 'nnn', '-')
    """
    if len(name) <= MAX_OBJECT_NAME_LENGTH:
        return name
    digest = hashlib.sha256(name.encode()).hexdigest()[:_NAME_HASH_LENGTH]
    head = name[: MAX_OBJECT_NAME_LENGTH - _NAME_HASH_LENGTH - 1].rstrip(".-")
    return f"{head}-{digest}"


# The DaemonSet of examples/daemonset.yaml, which the doctor looks for unless told another.
DAEMONSET_NAME = "ascend-device-plugin-daemonset"
DAEMONSET_NAMESPACE = "kube-system"
# The DaemonSet of examples/dra/daemonset.yaml: the doctor's default in DRA mode.
DRA_DAEMONSET_NAME = "ascend-dra-driver"

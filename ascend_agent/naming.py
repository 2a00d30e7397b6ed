"""Every name the agent gives to the outside: resources, device IDs, sockets, CDI devices. One place, so the
kubelet, the CDI spec, the doctor and the backends always agree.

>>> family_for("Ascend910", "910B4", "huawei"), family_for("Ascend910", "910B4", "model")
('Ascend910', 'Ascend910B4')
>>> resource = resource_name("Ascend910")
>>> resource, device_id("Ascend910", 3), socket_name(resource), registry_socket_name(resource)
('huawei.com/Ascend910', 'Ascend910-3', 'Ascend910.sock', 'huawei.com_Ascend910.sock')
>>> replica_ids("Ascend310P-0", 2), cdi_device_name("Ascend910-3")
(('Ascend310P-0-0', 'Ascend310P-0-1'), 'huawei.com/npu=Ascend910-3')
>>> kind = vnpu_type("Ascend310P", "vir02")
>>> kind, vnpu_device_id(kind, 100, 0), vnpu_device_path(100)
('Ascend310P-2c', 'Ascend310P-2c-100-0', '/dev/vdavinci100')
"""

from __future__ import annotations

import hashlib
import re

from ascend_agent.echo import cut

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


def dra_device_name(phys_id: int, vnpu_id: int | None = None) -> str:
    """A DRA device's name in the pool (a DNS label): ``npu-<phys id>`` for a chip, ``npu-<phys id>-vnpu-<vnpu
    id>`` for a vNPU of it.

    >>> dra_device_name(3), dra_device_name(3, 130)
    ('npu-3', 'npu-3-vnpu-130')
    """
    return f"npu-{phys_id}" if vnpu_id is None else f"npu-{phys_id}-vnpu-{vnpu_id}"


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


# Huawei's vNPU template names (vir02, vir04_3c, vir10_3c_16g_nm) give the suffix of the device type
# (Ascend310P-2c, -4c.3cpu, -10c.3cpu.16g.ndvpp): AI cores, AI CPUs, memory, media units.
_TEMPLATE = re.compile(r"vir([0-9]{1,3})(?:_([0-9]{1,3})c)?(?:_([0-9]{1,4})g)?(?:_(ndvpp|dvpp|nm|m))?")
_MEDIA = {"ndvpp": "ndvpp", "nm": "ndvpp", "dvpp": "dvpp", "m": "dvpp"}


def vnpu_suffix(template: str) -> str:
    """The device type suffix of a vNPU template; ``ValueError`` for a name that is not a template.

    >>> vnpu_suffix("vir10_3c_16g_nm"), vnpu_suffix("vir20_6c_64g")
    ('10c.3cpu.16g.ndvpp', '20c.6cpu.64g')
    """
    match = _TEMPLATE.fullmatch(template)
    if match is None:
        raise ValueError(
            f"{cut(template)!r} is not a vNPU template name (vir02, vir04_3c, vir10_3c_32g, ...)"
        )
    cores, cpus, memory, media = match.groups()
    parts = [f"{int(cores)}c"]
    parts += [f"{int(cpus)}cpu"] if cpus else []
    parts += [f"{int(memory)}g"] if memory else []
    parts += [_MEDIA[media]] if media else []
    return ".".join(parts)


def vnpu_type(family: str, template: str) -> str:
    """The device type of a vNPU of ``template`` on a chip of ``family`` (``Ascend910``, ``Ascend310P``)."""
    return f"{family}-{vnpu_suffix(template)}"


def vnpu_device_id(kind: str, vnpu_id: int, phys_id: int) -> str:
    """Huawei's device ID of a vNPU: ``<type>-<vnpu id>-<phys id>``."""
    return f"{kind}-{vnpu_id}-{phys_id}"


def vnpu_device_path(vnpu_id: int) -> str:
    """The vNPU's device node on the host; a container sees it as ``/dev/davinci<vnpu id>``."""
    return f"/dev/vdavinci{vnpu_id}"

"""What the DRA kubelet plugin's gRPC services on ``dra.sock`` do (:mod:`.handlers` serves them):
``DRAPlugin`` (v1 and v1beta1: the same answers, v1beta1 without share IDs) and ``DRAResourceHealth``
(KEP-4680; v1alpha1, the one released kubelets call, and v1: the same messages).

    prepared, _ = Prepared.open(checkpoint, cdi_dir, "npu.huawei.com", read_boot_id())
    service = DraService("npu.huawei.com", pool="node-1", prepared=prepared, reader=reader)
    service.publish(chips, spec_for)        # after each reconcile: chips, health, what Allocate gives
    grpc_handlers(service)                  # for a grpclib server on dra.sock (.handlers)

NodePrepareResources answers each claim on its own: a claim that cannot be prepared (a UID, namespace or
name the API server would not give, a device another prepared claim holds, among them) gets its ``error`` and
the others are prepared. A claim prepared before gets the same answer again without any request, and without
a write while its CDI spec is there and from this boot. Prepare and unprepare run one call at a time
(``calls``: with a pod UID, across the two pods of a rolling update). A device allocated with admin access is
prepared as its whole chip and is never exclusive. With ``statuses`` each prepared claim's
``status.devices`` is kept up to date (written by its own task, never on the kubelet's path).
"""

from __future__ import annotations

import contextlib
import logging
import time
from collections.abc import AsyncIterator, Callable, Collection, Iterable, Iterator, Mapping, Sequence
from dataclasses import replace
from types import ModuleType
from typing import Any

import anyio

from ascend_agent.container import container_spec, device_order
from ascend_agent.echo import cut
from ascend_agent.kube_names import is_dns_label, is_dns_subdomain
from ascend_agent.kubelet.dra.carving import MADE_VNPUS, Carving, MadeVnpus
from ascend_agent.kubelet.dra.claimread import ClaimError, ClaimReader, ClaimRef
from ascend_agent.kubelet.dra.claims import (
    CheckpointError,
    Prepared,
    PreparedClaim,
    PreparedDevice,
    cdi_device_id,
    claim_spec,
    uid_problem,
    valid_uid,
)
from ascend_agent.kubelet.dra.claimstatus import ClaimStatuses
from ascend_agent.kubelet.dra.devices import chip_of, device_name, overlap
from ascend_agent.kubelet.dra.npuconfig import NpuConfigError, npu_config, runtime_base
from ascend_agent.kubelet.dra.partitions import (
    ChipOffer,
    shortfall,
    template_device_name,
    template_device_of,
)
from ascend_agent.kubelet.dra.serialize import CallLock, CallLockError
from ascend_agent.model import Chip, ContainerBase, ContainerSpec, VNpu
from ascend_agent.naming import dra_device_name
from ascend_agent.observability import log_fields

log = logging.getLogger(__name__)

SpecFor = Callable[[Sequence[Chip]], ContainerSpec]
_MAX_MESSAGE = 1024


class DraService:
    """Prepares and unprepares claims against the chips last published, and feeds the health stream."""

    def __init__(
        self,
        driver: str,
        pool: str,
        prepared: Prepared,
        reader: ClaimReader | None,
        health_refresh: float = 10.0,
        calls: CallLock | None = None,
        statuses: ClaimStatuses | None = None,
        carving: Carving | None = None,
    ) -> None:
        self.driver = driver
        self.statuses = statuses
        self.pool = pool
        self.prepared = prepared
        self._reader = reader
        self._chips: dict[str, Chip] = {}
        self._whole: dict[str, Chip] = {}
        self._spec_for: SpecFor | None = None
        self._offers: dict[int, ChipOffer] = {}
        self._container: ContainerBase | None = None
        self.sweep_allowed = True  # False once the checkpoint was set aside at start
        self.carving = carving or Carving(MadeVnpus(prepared.checkpoint.with_name(MADE_VNPUS)))
        self.calls = calls or CallLock(None)
        self.calls_in_flight = 0
        self._idle = anyio.Event()
        self._health: tuple[tuple[str, bool, str], ...] = ()
        self._health_changed = anyio.Event()
        self.health_refresh = health_refresh
        self.health_streams = 0

    def publish(
        self,
        chips: Iterable[Chip],
        spec_for: SpecFor,
        offers: Mapping[int, ChipOffer] | None = None,
        container: ContainerBase | None = None,
        wholes: Iterable[Chip] | None = None,
    ) -> None:
        """The node's devices now (whole chips and vNPUs) and what a container that gets some of them needs;
        the dynamic chips' offers by physical id (one without counters offers nothing, and says why), the
        node's container base (for a claim's NpuConfig runtime), and every chip whole, also one split into
        vNPUs (what a device with admin access gets; by default each chip of ``chips``, a vNPU's made
        whole). Never blocks."""
        chips_before = self._chips
        self._chips = {device_name(chip): chip for chip in chips}
        if wholes is None:
            wholes = (replace(chip, vnpu=None) for chip in self._chips.values())
        self._whole = {device_name(whole): whole for whole in wholes}
        self._spec_for = spec_for
        self._offers = dict(offers or {})
        self._container = container
        # A template device of a dynamic chip has its chip's health.
        devices = list(self._chips.items())
        for phys_id, offer in sorted(self._offers.items()):
            chip = self._chips.get(dra_device_name(phys_id))
            if chip is not None:
                devices.extend(
                    (template_device_name(phys_id, template.name, index), chip)
                    for template, _, count in offer.templates
                    for index in range(count)
                )
        health = tuple(
            (name, chip.healthy and not chip.held, _health_message(chip))
            for name, chip in sorted(devices, key=lambda item: device_order(item[1]))
        )
        if self.statuses is not None and self._chips != chips_before:
            for claim in self.prepared:
                self.statuses.set(claim, self._devices_of(claim))
        if health != self._health:
            self._health = health
            self._health_changed.set()
            self._health_changed = anyio.Event()

    @contextlib.contextmanager
    def serving_call(self) -> Iterator[None]:
        """Around each prepare and unprepare the kubelet asks for: counted in ``calls_in_flight``."""
        self.calls_in_flight += 1
        try:
            yield
        finally:
            self.calls_in_flight -= 1
            if not self.calls_in_flight:
                self._idle.set()
                self._idle = anyio.Event()

    async def drained(self, timeout: float) -> int:
        """Wait up to ``timeout`` seconds for the prepares and unprepares in flight; those still running."""
        with anyio.move_on_after(timeout):
            while self.calls_in_flight:
                await self._idle.wait()
        return self.calls_in_flight

    # preparing ------------------------------------------------------------------------------------------
    async def prepare(self, claims: Sequence[ClaimRef]) -> dict[str, PreparedClaim | str]:
        """Each claim's prepared devices, or the one line saying why not, by UID. The claims this instance
        has not prepared are read first, side by side (with the API server hanging, a call waits one request
        timeout, not one per claim); then, one call at a time (across both instances during a rolling
        update, after reading what the other one wrote), their CDI specs and the checkpoint are written in one
        go. A claim prepared before is answered from the checkpoint once its spec is seen written in this
        boot; else its spec is written again first. A claim with a device another prepared claim holds is
        refused."""
        answers: dict[str, PreparedClaim | str] = {}
        valid = []
        for claim in claims:
            problem = _claim_problem(claim)
            if problem is None:
                valid.append(claim)
            else:
                self._refuse(claim, problem)
                answers[claim.uid] = problem
        unread: dict[str, str] = {}

        async def read(claim: ClaimRef) -> None:
            assert self._reader is not None
            try:
                await self._reader.allocated(claim)  # kept by the reader for the build below
            except ClaimError as exc:
                unread[claim.uid] = str(exc)

        if self._reader is not None:
            async with anyio.create_task_group() as tasks:
                for claim in valid:
                    if self.prepared.get(claim.uid) is None:
                        tasks.start_soon(read, claim)
        try:
            async with self.calls.held():
                await self._reload()
                answers.update(await self._prepare_held(valid, unread))
        except (CallLockError, CheckpointError) as exc:
            for claim in valid:
                self._refuse(claim, str(exc))
                answers[claim.uid] = str(exc)
        if self.statuses is not None:
            for answer in answers.values():
                if isinstance(answer, PreparedClaim):
                    self.statuses.set(answer, self._devices_of(answer))
        return {claim.uid: answers[claim.uid] for claim in claims}

    def _devices_of(self, claim: PreparedClaim) -> dict[str, Chip | None]:
        """The chip (or vNPU) each device of a prepared claim is now; None for one no longer here."""
        return {d.device_name: self._device_now(d) for d in claim.devices}

    def held_device_ids(self) -> frozenset[str]:
        """The device IDs of every chip and vNPU a prepared claim holds, a carved vNPU's chip with it: what
        the hot reset and the vNPU layout must leave alone (a claim is held from its prepare, before
        PodResources lists its pod)."""
        ids: set[str] = set()
        for claim in self.prepared:
            for device in claim.devices:
                chip = self._device_now(device)
                if chip is None:
                    continue
                ids.add(chip.device_id)
                if device.vnpu_id is not None:
                    ids.add(chip.chip_device_id)
        return frozenset(ids)

    def _device_now(self, device: PreparedDevice) -> Chip | None:
        if device.admin_access:
            return self._whole.get(chip_of(device.device_name))
        if device.vnpu_id is not None:  # carved at prepare: its dynamic chip, with the vNPU
            chip = self._chips.get(chip_of(device.device_name))
            return None if chip is None else self._carved(chip, VNpu(device.vnpu_id, device.template))
        return self._chips.get(device.device_name)

    async def _prepare_held(
        self, claims: Sequence[ClaimRef], unread: Mapping[str, str]
    ) -> dict[str, PreparedClaim | str]:
        answers: dict[str, PreparedClaim | str] = {}
        known = [claim.uid for claim in claims if self.prepared.get(claim.uid) is not None]
        fresh = await anyio.to_thread.run_sync(self.prepared.fresh_claims, known) if known else {}
        answers.update(fresh)
        held = _Holders(self.pool)
        for other in self.prepared:
            held.add(other)
        to_write: list[tuple[ClaimRef, PreparedClaim, dict[str, Any]]] = []
        for claim in claims:
            if claim.uid in fresh:
                continue
            is_new = self.prepared.get(claim.uid) is None
            try:
                if is_new and claim.uid in unread:
                    raise ClaimError(unread[claim.uid])
                prepared, document = await self._build(claim, held if is_new else None)
            except ClaimError as exc:
                self._refuse(claim, str(exc))
                answers[claim.uid] = str(exc)
                continue
            held.add(prepared)
            to_write.append((claim, prepared, document))
        if not to_write:
            return answers
        written = await anyio.to_thread.run_sync(
            self.prepared.add, [(prepared, document) for _, prepared, document in to_write]
        )
        for claim, *_ in to_write:
            result = written[claim.uid]
            if isinstance(result, OSError):
                failure = (
                    f"cannot write the CDI spec {self.prepared.spec_path(claim.uid)} or the checkpoint: "
                    f"{result.strerror or result}"
                )
                if self.prepared.get(claim.uid) is None:
                    await self.carving.release(claim.uid)
                self._refuse(claim, failure)
                answers[claim.uid] = failure
                continue
            answers[claim.uid] = result
            log.info(
                "Prepared claim %s: %s",
                claim,
                ", ".join(d.device_name for d in result.devices),
                extra=log_fields(claim=str(claim), uid=claim.uid),
            )
        return answers

    async def _reload(self) -> None:
        """While another instance may have acted since this one's last call: read the checkpoint it wrote."""
        if not self.calls.shared:
            return
        aside = await anyio.to_thread.run_sync(self.prepared.reload)
        if aside is not None:
            log.error(
                "DRA driver %s: %s; kept as %s, no claims prepared until the kubelet asks again",
                self.driver,
                aside.reason,
                aside.kept_as.name,
            )
        aside = await anyio.to_thread.run_sync(self.carving.made.reload)
        if aside is not None:
            log.error("DRA driver %s: %s; kept as %s", self.driver, aside.reason, aside.kept_as.name)

    async def sweep(self) -> None:
        """Destroy the vNPUs this driver made for claims that are not prepared (a crash between create and
        checkpoint); once the backend can carve, at start. Not after a checkpoint was set aside: its claims
        are unknown, and are released when the kubelet unprepares them."""
        if self.carving.carver is None or not self.sweep_allowed:
            return
        try:
            async with self.calls.held():
                await self._reload()
                await self.carving.sweep({claim.uid for claim in self.prepared})
        except (CallLockError, CheckpointError) as exc:
            log.warning("vNPUs made for claims that are not prepared are kept for now: %s", exc)

    @staticmethod
    def _refuse(claim: ClaimRef, reason: str) -> None:
        log.warning(
            "Cannot prepare claim %s: %s",
            claim,
            reason,
            extra=log_fields(claim=str(claim), uid=claim.uid, reason=reason),
        )

    async def _build(self, claim: ClaimRef, held: _Holders | None) -> tuple[PreparedClaim, dict[str, Any]]:
        """The claim as prepared and its CDI spec: for a claim in the checkpoint (its spec gone, or from an
        earlier boot) from the devices recorded there (its vNPUs carved again where a reboot took them),
        else from its ResourceClaim, checked free against ``held``, its vNPUs carved."""
        known = self.prepared.get(claim.uid)
        if known is not None:
            if self._spec_for is None:
                raise ClaimError("the chips are not discovered yet; the kubelet retries")
            chips: dict[str, Chip] = {}
            for device in known.devices:
                monitored = (device.device_name,) if device.admin_access else ()
                chip = self._chips_of(claim, [device.device_name], {}, monitored)[device.device_name]
                if device.vnpu_id is not None:
                    vnpu = await self.carving.carve(
                        claim.uid,
                        device.device_name,
                        chip,
                        device.template,
                        device.vnpu_id,
                        self._room(chip, device.template),
                    )
                    chip = self._carved(chip, vnpu)
                chips[device.device_name] = chip
            return known, self._document(claim, chips, known.runtime or None)
        if self._reader is None:
            raise ClaimError("the Kubernetes API is not available to read the claim (cluster side off)")
        if self._spec_for is None:
            raise ClaimError("the chips are not discovered yet; the kubelet retries")
        allocated = await self._reader.allocated(claim)
        # A device is for monitoring only when every request that got it asked for admin access.
        admin = {r.device for r in allocated if r.admin_access} - {
            r.device for r in allocated if not r.admin_access
        }
        carve: dict[str, str] = {}
        runtimes = set()
        for result in allocated:
            try:
                config = npu_config(result.parameters)
            except NpuConfigError as exc:
                request = cut(result.request) or "-"
                raise ClaimError(f"ResourceClaim {claim}, request {request}: {exc}") from None
            runtimes.add(config.runtime)
            if config.template is not None:
                carve[result.device] = config.template
        if len(runtimes) > 1:
            raise ClaimError(f"ResourceClaim {claim}: its NpuConfigs give two runtimes; give a claim one")
        runtime = runtimes.pop() if runtimes else None
        chips = self._chips_of(claim, [result.device for result in allocated], carve, admin)
        requests: dict[str, list[str]] = {}
        for result in allocated:
            requests.setdefault(result.device, []).append(result.request)
        order = sorted(chips, key=lambda name: device_order(chips[name]))
        devices = [
            PreparedDevice(
                tuple(r for r in requests[device] if r),
                self.pool,
                device,
                (cdi_device_id(self.driver, claim.uid, device),),
                admin_access=device in admin,
                template=carve.get(device, ""),
            )
            for device in order
        ]
        prepared = PreparedClaim(
            claim.uid, claim.namespace, claim.name, tuple(devices), runtime=runtime or ""
        )
        if held is not None:
            held.check_free(prepared)
        for index, device in enumerate(devices):
            if device.template:
                chip = chips[device.device_name]
                try:
                    vnpu = await self.carving.carve(
                        claim.uid,
                        device.device_name,
                        chip,
                        device.template,
                        room=self._room(chip, device.template),
                    )
                except ClaimError:
                    await self.carving.release(claim.uid)  # what this claim's other devices got
                    raise
                devices[index] = replace(device, vnpu_id=vnpu.vnpu_id)
                chips[device.device_name] = self._carved(chips[device.device_name], vnpu)
        try:
            document = self._document(claim, chips, runtime)
        except ClaimError:
            await self.carving.release(claim.uid)
            raise
        return replace(prepared, devices=tuple(devices)), document

    def _room(self, chip: Chip, template: str) -> Callable[[Sequence[VNpu]], str]:
        """Why one more ``template`` does not fit on ``chip`` beside its vNPUs now, by its counters."""
        offer = self._offers.get(chip.phys_id)
        return lambda now: (
            "" if offer is None else shortfall(offer, [vnpu.template for vnpu in now], template)
        )

    def _carved(self, chip: Chip, vnpu: VNpu) -> Chip:
        """The chip's vNPU as a device, with what its template gives."""
        offer = self._offers.get(chip.phys_id)
        template = offer.template(vnpu.template) if offer is not None else None
        if template is not None:
            vnpu = replace(vnpu, aicore=template.aicore, memory_gb=template.memory_gb, aicpu=template.aicpu)
        return chip.slice(vnpu)

    def _chips_of(
        self, claim: ClaimRef, devices: Sequence[str], carve: dict[str, str], admin: Collection[str] = ()
    ) -> dict[str, Chip]:
        """The chip of each device. A template device is its dynamic chip, to carve its template from
        (added to ``carve``); so is a whole dynamic chip that ``carve`` gives a template. A device with admin
        access is its whole chip: a monitoring container sees the chip's own device node, and nothing is
        carved or made for it."""
        chips: dict[str, Chip] = {}
        for device in devices:
            if device in admin:
                carve.pop(device, None)
                whole = self._whole.get(chip_of(device))
                if whole is None:
                    raise ClaimError(
                        f"device {device} of ResourceClaim {claim} is not on this node "
                        f"(devices here: {', '.join(self._chips) or 'none'})"
                    )
                chips[device] = whole
                continue
            parent = template_device_of(device)
            if parent is not None:
                if device in carve:
                    raise ClaimError(
                        f"ResourceClaim {claim}: NpuConfig template applies to a whole chip; {device} is a "
                        f"{parent[1]} already"
                    )
                carve[device] = parent[1]
            chip = self._chips.get(device if parent is None else f"npu-{parent[0]}")
            if chip is None:
                raise ClaimError(
                    f"device {device} of ResourceClaim {claim} is not on this node "
                    f"(devices here: {', '.join(self._chips) or 'none'})"
                )
            template = carve.get(device)
            if template is not None:
                offer = self._offers.get(chip.phys_id)
                if offer is None or chip.vnpu is not None:
                    raise ClaimError(
                        f"ResourceClaim {claim}: {device} is no dynamic chip (vnpu: {{dynamic: true}}); it "
                        f"cannot be carved into {cut(template)}"
                    )
                if not offer.counters:
                    raise ClaimError(
                        f"ResourceClaim {claim}: chip {chip.phys_id} is dynamic but offers nothing now "
                        f"({'; '.join(offer.left_out)}): check npu-smi info -t info-vnpu on the node"
                    )
                if offer.template(template) is None:
                    offered = ", ".join(t.name for t, _, _ in offer.templates) or "none"
                    raise ClaimError(
                        f"ResourceClaim {claim}: chip {chip.phys_id} ({chip.model}) offers no template "
                        f"{cut(template)} (it offers {offered})"
                    )
            chips[device] = chip
        return chips

    def _document(self, claim: ClaimRef, chips: Mapping[str, Chip], runtime: str | None) -> dict[str, Any]:
        assert self._spec_for is not None
        parts = list({chip.device_path: chip for chip in chips.values()}.values())
        if runtime is None or self._container is None:
            spec = self._spec_for(parts)
        else:
            try:
                spec = container_spec(parts, runtime_base(self._container, runtime))
            except NpuConfigError as exc:
                raise ClaimError(f"ResourceClaim {claim}: {exc}") from None
        return claim_spec(self.driver, claim.uid, chips, spec)

    async def unprepare(self, claims: Sequence[ClaimRef]) -> dict[str, str]:
        """Remove what was prepared for each claim (the checkpoint written once); an error line per claim,
        empty on success. A claim never prepared is success: so is a UID that is no UID (nothing was ever
        written for it)."""
        answers = dict.fromkeys((claim.uid for claim in claims), "")
        try:
            async with self.calls.held():
                await self._reload()
                released = {
                    c.uid: await self.carving.release(c.uid)
                    for c in claims
                    if valid_uid(c.uid) and self.carving.holds(c.uid)
                }
                answers.update({uid: problem for uid, problem in released.items() if problem})
                ours = [
                    c
                    for c in claims
                    if valid_uid(c.uid) and self.prepared.get(c.uid) is not None and not released.get(c.uid)
                ]
                removed = (
                    await anyio.to_thread.run_sync(self.prepared.remove, [c.uid for c in ours])
                    if ours
                    else {}
                )
        except (CallLockError, CheckpointError) as exc:
            return {claim.uid: str(exc) if valid_uid(claim.uid) else "" for claim in claims}
        for claim in ours:
            error = removed[claim.uid]
            if error is not None:
                answers[claim.uid] = f"cannot remove the CDI spec of {claim}: {error.strerror or error}"
                continue
            if self.statuses is not None:
                self.statuses.forget(claim.uid)
            log.info("Unprepared claim %s", claim, extra=log_fields(claim=str(claim), uid=claim.uid))
        return {claim.uid: answers[claim.uid] for claim in claims}

    # health ---------------------------------------------------------------------------------------------
    async def health_updates(self, api: ModuleType) -> AsyncIterator[Any]:
        """The health of every device now, then again on each change, and every ``health_refresh`` seconds
        so that the kubelet never takes a quiet device for one it has not heard of; as the
        NodeWatchResourcesResponse of ``api`` (v1 and v1alpha1 share the messages)."""
        timeout = int(self.health_refresh * 3) + 1
        self.health_streams += 1
        # Which of the services the kubelet opened: 1.37 picks v1 when listed, earlier ones v1alpha1.
        version = api.__name__.rsplit(".")[-1]
        log.info("the kubelet watches the devices' health through %s.DRAResourceHealth", version)
        try:
            while True:
                changed = self._health_changed
                now = int(time.time())
                yield api.NodeWatchResourcesResponse(
                    devices=[
                        api.DeviceHealth(
                            device=api.DeviceIdentifier(pool_name=self.pool, device_name=name),
                            health=api.HealthStatus.HEALTHY if healthy else api.HealthStatus.UNHEALTHY,
                            last_updated_time=now,
                            health_check_timeout_seconds=timeout,
                            message=message,
                        )
                        for name, healthy, message in self._health
                    ]
                )
                with anyio.move_on_after(self.health_refresh):
                    await changed.wait()
        finally:
            self.health_streams -= 1


class _Holders:
    """The prepared claims of the pool by the chip their devices are part of."""

    def __init__(self, pool: str) -> None:
        self.pool = pool
        self._by_chip: dict[str, list[tuple[str, PreparedClaim]]] = {}

    def add(self, claim: PreparedClaim) -> None:
        for device in claim.devices:
            if device.pool_name == self.pool and not device.admin_access:
                self._by_chip.setdefault(chip_of(device.device_name), []).append((device.device_name, claim))

    def check_free(self, claim: PreparedClaim) -> None:
        """ClaimError when a device of ``claim`` shares a chip with one another prepared claim holds: the
        scheduler should never allocate it twice, and the driver is the last that can refuse. Devices with
        admin access are shared: neither refused nor holding."""
        for device in claim.devices:
            if device.admin_access:
                continue
            for name, other in self._by_chip.get(chip_of(device.device_name), ()):
                if other.uid != claim.uid and overlap(device.device_name, name):
                    shared = name if name == device.device_name else f"{name} (the same chip)"
                    raise ClaimError(
                        f"device {device.device_name} is in use: ResourceClaim {other.namespace}/"
                        f"{other.name} (uid {other.uid}) holds {shared}; the kubelet retries, and the claim "
                        "is prepared once that one is unprepared"
                    )


def _claim_problem(claim: ClaimRef) -> str | None:
    """Why the kubelet's ``claim`` cannot be a ResourceClaim of the API server, or None."""
    if (problem := uid_problem(claim.uid)) is not None:
        return problem
    if not is_dns_label(claim.namespace):
        return f"claim namespace {claim.namespace[:80]!r} is not a Kubernetes namespace"
    if not is_dns_subdomain(claim.name):
        return f"claim name {claim.name[:80]!r} is not a Kubernetes object name"
    return None


def _health_message(chip: Chip) -> str:
    """The chip's reason while Unhealthy; a held chip's reason says it is held and until when."""
    if chip.healthy:
        return ""
    return (chip.reason or "unhealthy")[:_MAX_MESSAGE]

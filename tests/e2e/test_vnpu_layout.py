"""The vnpu: layout against a fake npu-smi that keeps vNPUs as a node does (its answers in the shared samples'
layout, its /dev/vdavinci* nodes made and removed): exactly the commands needed, nothing the second time,
never a vNPU a container holds; bad layouts, failed and refused creates give one line and change nothing."""

from __future__ import annotations

import json
import logging
import signal
import subprocess
import sys
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

from ascend_agent.backends.devfs import DevfsBackend
from ascend_agent.config import Settings
from ascend_agent.vnpu_layout import parse_layout
from tests.support.agent_process import AgentProcess
from tests.support.host_tree import HostTree
from tests.support.kubelet_standin import KubeletStandin
from tests.support.npusmi_fake import FakeNpuSmi
from tests.support.vnpu_node import TEMPLATE_INFO, TEMPLATES_310P, info_310p, wait_gone

CONTAINER = "3f2a9c1d7b4e"


def _chip(phys: int, vnpus: list[dict[str, Any]]) -> dict[str, Any]:
    return {"phys": phys, "aicore": 8, "memory": 21, "aicpu": 7, "vnpus": vnpus}


@pytest.fixture
def npu_smi(short_dir: Path, host: HostTree) -> FakeNpuSmi:
    """Chip 0 without vNPU support; chip 1 as in the sample (116 vir04 in a container, 117 vir02 free);
    chip 2 without vNPUs."""
    host.add_chips([0, 1, 2])
    fake = FakeNpuSmi(short_dir / "npu-smi")
    fake.set_output("info", info_310p([0, 1, 2]))
    for npu_id in (0, 1, 2):
        fake.set_output(f"info -t template-info -i {npu_id}", TEMPLATE_INFO)
    _state(fake, host)
    return fake


def _state(fake: FakeNpuSmi, host: HostTree, **options: Any) -> None:
    chips = {
        (1, 0): _chip(
            1, [{"id": 116, "template": "vir04", "container": CONTAINER}, {"id": 117, "template": "vir02"}]
        ),
        (2, 0): _chip(2, []),
    }
    fake.set_vnpu_state(host.dev, chips, TEMPLATES_310P, **options)


def _config(directory: Path, layout: str) -> Path:
    path = directory / "config.yaml"
    path.write_text(f"vnpu: {layout}\n")
    return path


def _vnpus(fake: FakeNpuSmi) -> dict[str, list[tuple[int, str]]]:
    return {
        key: [(v["id"], v["template"]) for v in chip["vnpus"]]
        for key, chip in fake.vnpu_state()["chips"].items()
    }


# Chip 1 keeps its vir02 and gets a vir01 beside the vir04 a container holds: 7 of its 7 AI CPUs.
LAYOUT = '{"1": [vir02, vir01], "2": [vir04, vir02]}'
NEEDED = [
    "set -t create-vnpu -i 1 -c 0 -f vir01",
    "set -t create-vnpu -i 2 -c 0 -f vir04",
    "set -t create-vnpu -i 2 -c 0 -f vir02",
]


def _run(host: HostTree, fake: FakeNpuSmi, *extra: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [sys.executable, "-m", "ascend_agent", "run", "--backend", "devfs", "--host-root", str(host.root),
         "--npu-smi", str(fake.path), "--metrics-address", "", *extra],
        capture_output=True, text=True, timeout=30,
    )  # fmt: skip


def test_dry_run_prints_the_plan_and_runs_nothing(
    host: HostTree, npu_smi: FakeNpuSmi, short_dir: Path
) -> None:
    result = _run(host, npu_smi, "--config", str(_config(short_dir, LAYOUT)), "--dry-run-vnpu")
    assert result.returncode == 0, result.stderr
    assert result.stdout.splitlines() == [
        f"npu-smi {NEEDED[0]}",
        "# kept: vNPU 116 (vir04) on chip 1 is in use",
        f"npu-smi {NEEDED[1]}",
        f"npu-smi {NEEDED[2]}",
    ]
    assert npu_smi.calls_of("set") == []


@pytest.fixture
def layout_agent(
    kubelet: KubeletStandin, host: HostTree, npu_smi: FakeNpuSmi, short_dir: Path, podresources: Any
) -> Iterator[AgentProcess]:
    process = AgentProcess(
        ["run", "--backend", "devfs", "--host-root", str(host.root), "--npu-smi", str(npu_smi.path),
         "--kubelet-dir", str(kubelet.directory), "--metrics-address", "", "--health-interval", "1",
         "--config", str(_config(short_dir, LAYOUT)), "--pod-resources-socket", str(podresources.path),
         "--no-cluster"]
    )  # fmt: skip
    yield process
    process.close()


def test_layout_applied_once_and_a_held_vnpu_kept_until_free(
    kubelet: KubeletStandin,
    host: HostTree,
    npu_smi: FakeNpuSmi,
    layout_agent: AgentProcess,
    short_dir: Path,
    podresources: Any,
) -> None:
    layout_agent.wait_log("vnpu: layout applied with 3 npu-smi commands")
    assert npu_smi.calls_of("set") == NEEDED
    assert _vnpus(npu_smi) == {
        "1:0": [(116, "vir04"), (117, "vir02"), (118, "vir01")],
        "2:0": [(132, "vir04"), (133, "vir02")],
    }
    kubelet.wait_for(
        lambda: (
            (two := kubelet.latest("huawei.com/Ascend310P-2c")) is not None
            and set(two.health()) == {"Ascend310P-2c-117-1", "Ascend310P-2c-133-2"}
            and (one := kubelet.latest("huawei.com/Ascend310P-1c")) is not None
            and set(one.health()) == {"Ascend310P-1c-118-1"}
        ),
        what="the new vNPUs advertised",
    )
    layout_agent.proc.send_signal(signal.SIGHUP)
    layout_agent.wait_log("vnpu: every chip holds its layout; nothing to run")
    assert npu_smi.calls_of("set") == NEEDED, "the second time issues nothing"
    assert (
        len(layout_agent.matching("Ascend310P-4c-116-1 .vir04. is not in the layout but a container holds"))
        == 1
    )

    # The container is gone: the next health interval destroys 116.
    state = npu_smi.vnpu_state()
    state["chips"]["1:0"]["vnpus"][0].pop("container")
    (npu_smi.directory / "vnpu.json").write_text(json.dumps(state))
    npu_smi.wait_count("set -t destroy-vnpu -i 1 -c 0 -v 116", 1)
    kubelet.wait_for(
        lambda: (
            (four := kubelet.latest("huawei.com/Ascend310P-4c")) is not None
            and "Ascend310P-4c-132-2" in four.health()
            and "Ascend310P-4c-116-1" not in four.health()
        ),
        what="116 gone from the kubelet's list",
    )
    assert npu_smi.calls_of("set") == [*NEEDED, "set -t destroy-vnpu -i 1 -c 0 -v 116"]

    # A pod holds 118 (the kubelet says so; npu-smi's column does not). A new layout in the config file,
    # read live: one vir01 on chip 1, chip 2 whole again. 118 stays; 117 goes.
    podresources.hold("huawei.com/Ascend310P-1c", ["Ascend310P-1c-118-1"], "team-a", "infer-0", "main")
    podresources.wait_calls(podresources.calls + 2)
    _config(short_dir, '{"1": [vir01], "2": []}')
    npu_smi.wait_count("set -t destroy-vnpu -i 2 -c 0 -v 133", 1)
    kubelet.wait_for(
        lambda: (
            (chips := kubelet.latest("huawei.com/Ascend310P")) is not None
            and set(chips.health()) == {"Ascend310P-0", "Ascend310P-2"}
        ),
        what="chip 2 whole again",
    )
    assert npu_smi.calls_of("set")[-3:] == [
        "set -t destroy-vnpu -i 1 -c 0 -v 117",
        "set -t destroy-vnpu -i 2 -c 0 -v 132",
        "set -t destroy-vnpu -i 2 -c 0 -v 133",
    ]
    assert [v[0] for v in _vnpus(npu_smi)["1:0"]] == [118]


def test_a_vnpu_just_handed_out_is_held_until_pod_resources_shows_it_freed(
    kubelet: KubeletStandin,
    host: HostTree,
    npu_smi: FakeNpuSmi,
    layout_agent: AgentProcess,
    short_dir: Path,
    podresources: Any,
) -> None:
    """Right after Allocate neither PodResources (the pod not recorded yet) nor npu-smi's column (the
    container has not opened the device) says 118 is in use: what Allocate handed over says it."""
    layout_agent.wait_log("vnpu: layout applied with 3 npu-smi commands")
    kubelet.wait_for(
        lambda: (
            (one := kubelet.latest("huawei.com/Ascend310P-1c")) is not None
            and "Ascend310P-1c-118-1" in one.health()
        ),
        what="118 advertised",
    )
    channel, stub = kubelet.plugin_stub("huawei.com/Ascend310P-1c")
    pb = kubelet.pb
    stub.Allocate(
        pb.AllocateRequest(
            container_requests=[pb.ContainerAllocateRequest(devices_ids=["Ascend310P-1c-118-1"])]
        ),
        timeout=5,
    )
    channel.close()
    _config(short_dir, '{"1": [], "2": [vir04, vir02]}')
    layout_agent.wait_log("Ascend310P-1c-118-1 .vir01. is not in the layout but a container holds it")
    npu_smi.wait_count("set -t destroy-vnpu -i 1 -c 0 -v 117", 1)
    assert npu_smi.count("set -t destroy-vnpu -i 1 -c 0 -v 118") == 0

    # The kubelet lists the pod, then the pod ends: 118 is freed, and destroyed at a health interval.
    podresources.hold("huawei.com/Ascend310P-1c", ["Ascend310P-1c-118-1"], "team-a", "infer-0", "main")
    podresources.wait_calls(podresources.calls + 2)
    assert npu_smi.count("set -t destroy-vnpu -i 1 -c 0 -v 118") == 0
    podresources.release_all()
    wait_gone(host.dev / "vdavinci118")
    assert [v[0] for v in _vnpus(npu_smi)["1:0"]] == [116]


def _backend(host: HostTree, fake: FakeNpuSmi) -> DevfsBackend:
    return DevfsBackend(Settings(host_root=host.root, npu_smi=str(fake.path), npu_smi_timeout=5))


async def test_a_vnpu_the_kubelet_holds_is_never_destroyed(host: HostTree, npu_smi: FakeNpuSmi) -> None:
    backend = _backend(host, npu_smi)
    await backend.query()
    plans = await backend.apply_vnpu_layout(
        parse_layout({"1": []}), lambda: {"Ascend310P-2c-117-1"}, run=True
    )
    assert [v.vnpu_id for v in plans[0].in_use] == [116, 117], "116 by npu-smi's column, 117 by the kubelet"
    assert npu_smi.calls_of("set") == []
    await backend.apply_vnpu_layout(parse_layout({"1": []}), frozenset, run=True)
    assert npu_smi.calls_of("set") == ["set -t destroy-vnpu -i 1 -c 0 -v 117"], "116 is still in a container"


async def test_while_holders_are_unknown_nothing_is_destroyed_and_no_chip_split(
    host: HostTree, npu_smi: FakeNpuSmi
) -> None:
    backend = _backend(host, npu_smi)
    await backend.query()
    layout = parse_layout({"1": ["vir02", "vir01"], "2": ["vir02"]})
    plans = await backend.apply_vnpu_layout(layout, lambda: None, run=True)
    assert npu_smi.calls_of("set") == ["set -t create-vnpu -i 1 -c 0 -f vir01"], "chip 1 is split already"
    assert (plans[1].create, plans[1].waiting) == ((), ("vir02",))
    await backend.apply_vnpu_layout(parse_layout({"1": []}), lambda: None, run=True)
    assert npu_smi.calls_of("set") == ["set -t create-vnpu -i 1 -c 0 -f vir01"], "nothing destroyed"


async def test_a_whole_chip_a_container_holds_is_not_split(host: HostTree, npu_smi: FakeNpuSmi) -> None:
    backend = _backend(host, npu_smi)
    await backend.query()
    layout = parse_layout({"2": ["vir02"]})
    plans = await backend.apply_vnpu_layout(layout, lambda: {"Ascend310P-2"}, run=True)
    assert (plans[0].create, plans[0].waiting) == ((), ("vir02",))
    assert npu_smi.calls_of("set") == []
    await backend.apply_vnpu_layout(layout, frozenset, run=True)
    assert npu_smi.calls_of("set") == ["set -t create-vnpu -i 2 -c 0 -f vir02"], "split once it is free"


@pytest.mark.parametrize(
    ("layout", "line"),
    [
        (
            '{"310P3": [vir04, vir04, vir02]}',
            "vnpu 310P3: vir04, vir04, vir02 need 10 AI cores; a 310P3 chip has 8",
        ),
        (
            '{"2": [vir08]}',
            "vnpu: chip 2 (310P3) offers no template vir08 (npu-smi info -t template-info lists",
        ),
        ('{"9": [vir02]}', "vnpu: chip 9 is not on this node (its chips: 0, 1, 2); nothing created"),
        ('{"0": [vir02]}', "vnpu: chip 0 (310P3) cannot be split into vNPUs; nothing created"),
        (
            '{"310P3": [vir02, vir02, vir04]}',
            "vnpu: chip 1 (310P3): vir02, vir02, vir04 need 8 AI CPUs; the chip has 7; nothing created",
        ),
    ],
)
def test_a_layout_the_chips_cannot_hold_is_refused_at_start(
    host: HostTree, npu_smi: FakeNpuSmi, short_dir: Path, layout: str, line: str
) -> None:
    result = _run(
        host, npu_smi, "--config", str(_config(short_dir, layout)), "--kubelet-dir", str(short_dir / "k")
    )
    assert result.returncode == 2
    said = [text for text in result.stderr.splitlines() if " INFO " not in text]
    assert len(said) == 1 and line in said[0], result.stderr
    assert npu_smi.calls_of("set") == []


def test_a_chip_is_judged_by_its_templates_not_by_the_usable_memory(
    host: HostTree, npu_smi: FakeNpuSmi, short_dir: Path
) -> None:
    """docs/vnpu.md's 310P3 entry: 4 x vir02_1c are 24 GB by template-info, on a chip whose info-vnpu shows
    21."""
    layout = '{"310P3": [vir02_1c, vir02_1c, vir02_1c, vir02_1c]}'
    result = _run(host, npu_smi, "--config", str(_config(short_dir, layout)), "--dry-run-vnpu")
    assert result.returncode == 0, result.stderr
    assert result.stdout.splitlines().count("npu-smi set -t create-vnpu -i 2 -c 0 -f vir02_1c") == 4


async def test_a_vnpu_id_listed_twice_refuses_that_chip_and_destroys_nothing(
    host: HostTree, npu_smi: FakeNpuSmi, caplog: pytest.LogCaptureFixture
) -> None:
    chips = {
        (1, 0): _chip(
            1, [{"id": 116, "template": "vir04", "container": CONTAINER}, {"id": 116, "template": "vir02"}]
        ),
        (2, 0): _chip(2, []),
    }
    npu_smi.set_vnpu_state(host.dev, chips, TEMPLATES_310P)
    backend = _backend(host, npu_smi)
    await backend.query()
    with caplog.at_level(logging.WARNING):
        plans = await backend.apply_vnpu_layout(parse_layout({"1": ["vir04"]}), frozenset, run=True)
    assert npu_smi.calls_of("set") == []
    assert plans[0].refused.startswith("vnpu: the vNPUs of chip 1 (310P3) are unknown (")
    assert "lists vNPU id 116 twice" in plans[0].refused
    warned = [r.getMessage() for r in caplog.records if r.levelno >= logging.WARNING]
    assert len(warned) == 1 and "Cannot read the vNPUs of chip 1" in warned[0], warned


async def test_a_chip_whose_table_was_listed_wrong_is_read_again_when_the_layout_is_applied(
    host: HostTree, npu_smi: FakeNpuSmi
) -> None:
    """The wrong table leaves no trace once npu-smi answers right, though no /dev/vdavinci* node changed."""
    wrong = {
        (1, 0): _chip(1, [{"id": 116, "template": "vir04"}, {"id": 116, "template": "vir02"}]),
        (2, 0): _chip(2, []),
    }
    npu_smi.set_vnpu_state(host.dev, wrong, TEMPLATES_310P)
    backend = _backend(host, npu_smi)
    await backend.query()
    layout = parse_layout({"1": ["vir04", "vir02"], "2": ["vir02"]})
    plans = await backend.apply_vnpu_layout(layout, frozenset, run=True)
    assert "lists vNPU id 116 twice" in plans[0].refused and plans[0].unread
    _state(npu_smi, host)
    for _ in range(3):
        await backend.query()
        await backend.discover()
    plans = await backend.apply_vnpu_layout(layout, frozenset, run=True)
    assert [plan.refused for plan in plans] == ["", ""]
    assert npu_smi.calls_of("set") == ["set -t create-vnpu -i 2 -c 0 -f vir02"]


@pytest.mark.parametrize(
    "error",
    ["Error: dcmi get vnpu info failed, ret = -8020\n", None],
    ids=["-8020", "timeout"],
)
async def test_a_chip_npu_smi_could_not_read_is_read_again_when_the_layout_is_applied(
    host: HostTree, npu_smi: FakeNpuSmi, error: str | None
) -> None:
    """A table read once, then not: a reload's read that failed does not block the layout after it."""
    backend = DevfsBackend(Settings(host_root=host.root, npu_smi=str(npu_smi.path), npu_smi_timeout=3))
    await backend.query()
    await backend.discover()
    backend.forget_vnpus()
    if error is None:
        npu_smi.set_mode("hang")
    else:
        npu_smi.set_error("info -t info-vnpu -i 2 -c 0", error)
    layout = parse_layout({"2": ["vir02"]})
    plans = await backend.apply_vnpu_layout(layout, frozenset, run=True)
    assert plans[0].refused.startswith("vnpu: the vNPUs of chip 2 (310P3) are unknown (") and plans[0].unread
    if error is None:
        npu_smi.set_mode("ok")
    else:
        npu_smi.clear_error("info -t info-vnpu -i 2 -c 0")
    await backend.query()
    plans = await backend.apply_vnpu_layout(layout, frozenset, run=True)
    assert plans[0].refused == ""
    assert npu_smi.calls_of("set") == ["set -t create-vnpu -i 2 -c 0 -f vir02"]


def test_a_layout_refused_for_a_failed_read_is_applied_once_npu_smi_answers(
    kubelet: KubeletStandin, host: HostTree, npu_smi: FakeNpuSmi, short_dir: Path, podresources: Any
) -> None:
    """A refusal for a table npu-smi could not give says nothing of the layout: the health timer retries."""
    config = _config(short_dir, '{"1": [vir04, vir02]}')
    process = AgentProcess(
        ["run", "--backend", "devfs", "--host-root", str(host.root), "--npu-smi", str(npu_smi.path),
         "--kubelet-dir", str(kubelet.directory), "--metrics-address", "", "--health-interval", "1",
         "--config", str(config), "--pod-resources-socket", str(podresources.path), "--no-cluster"]
    )  # fmt: skip
    try:
        process.wait_log("vnpu: every chip holds its layout; nothing to run")
        process.wait_log("Registered resource huawei.com/Ascend310P$")  # the config file is watched
        npu_smi.set_error("info -t info-vnpu -i 2 -c 0", "Error: dcmi get vnpu info failed, ret = -8020\n")
        _config(short_dir, '{"1": [vir04, vir02], "2": [vir02]}')
        process.wait_log(r"vnpu: the vNPUs of chip 2 \(310P3\) are unknown \(")
        npu_smi.clear_error("info -t info-vnpu -i 2 -c 0")
        npu_smi.wait_count("set -t create-vnpu -i 2 -c 0 -f vir02", 1)
        assert npu_smi.calls_of("set") == ["set -t create-vnpu -i 2 -c 0 -f vir02"]
    finally:
        process.close()


def test_a_chip_npu_smi_cannot_read_at_start_does_not_stop_the_agent(
    kubelet: KubeletStandin, host: HostTree, npu_smi: FakeNpuSmi, short_dir: Path, podresources: Any
) -> None:
    """No verdict on the layout, so no exit status 2: the agent serves, and the layout runs once it can."""
    npu_smi.set_error("info -t info-vnpu -i 2 -c 0", "Error: dcmi get vnpu info failed, ret = -8020\n")
    process = AgentProcess(
        ["run", "--backend", "devfs", "--host-root", str(host.root), "--npu-smi", str(npu_smi.path),
         "--kubelet-dir", str(kubelet.directory), "--metrics-address", "", "--health-interval", "1",
         "--config", str(_config(short_dir, '{"2": [vir02]}')),
         "--pod-resources-socket", str(podresources.path), "--no-cluster"]
    )  # fmt: skip
    try:
        process.wait_log(r"vnpu: the vNPUs of chip 2 \(310P3\) are unknown \(")
        process.wait_log("Registered resource huawei.com/Ascend310P$")
        npu_smi.clear_error("info -t info-vnpu -i 2 -c 0")
        npu_smi.wait_count("set -t create-vnpu -i 2 -c 0 -f vir02", 1)
        assert npu_smi.calls_of("set") == ["set -t create-vnpu -i 2 -c 0 -f vir02"]
    finally:
        process.close()


async def test_a_vnpu_id_on_two_chips_is_one_device(
    host: HostTree, npu_smi: FakeNpuSmi, caplog: pytest.LogCaptureFixture
) -> None:
    chips = {
        (1, 0): _chip(1, [{"id": 116, "template": "vir04"}]),
        (2, 0): _chip(2, [{"id": 116, "template": "vir02"}, {"id": 132, "template": "vir02"}]),
    }
    npu_smi.set_vnpu_state(host.dev, chips, TEMPLATES_310P)
    backend = _backend(host, npu_smi)
    with caplog.at_level(logging.WARNING):
        await backend.query()
        inventory = await backend.discover()
    assert [part.device_id for part in inventory.vnpus] == ["Ascend310P-4c-116-1"]
    warned = [r.getMessage() for r in caplog.records if r.levelno >= logging.WARNING]
    assert len(warned) == 1, warned
    assert warned[0].endswith(
        "npu-smi info -t info-vnpu -i 2 -c 0 lists vNPU id 116, which chip 1 holds "
        "(vNPU ids are unique per node)"
    )
    plans = await backend.apply_vnpu_layout(parse_layout({"2": []}), frozenset, run=True)
    assert "which chip 1 holds" in plans[0].refused
    assert npu_smi.calls_of("set") == []
    # Chip 2's vNPUs are unknown: handed out whole, it would hand out 132 (and what holds 116) with it.
    (second,) = [chip for chip in inventory.advertised if chip.phys_id == 2]
    assert not second.healthy
    assert second.reason.startswith(
        "its vNPUs are unknown: npu-smi info -t info-vnpu -i 2 -c 0 lists vNPU id 116"
    )
    npu_smi.set_vnpu_state(
        host.dev, {**chips, (2, 0): _chip(2, [{"id": 132, "template": "vir02"}])}, TEMPLATES_310P
    )
    await backend.query()
    inventory = await backend.discover()
    assert [part.device_id for part in inventory.vnpus] == ["Ascend310P-4c-116-1", "Ascend310P-2c-132-2"], (
        "the table is read again until it answers right"
    )
    assert all(chip.healthy for chip in inventory.chips)


async def test_a_failing_create_leaves_the_chip_as_it_was(
    host: HostTree, npu_smi: FakeNpuSmi, caplog: pytest.LogCaptureFixture
) -> None:
    _state(npu_smi, host, fail_create=True)
    before = _vnpus(npu_smi)
    backend = _backend(host, npu_smi)
    await backend.query()
    with caplog.at_level(logging.WARNING):
        await backend.apply_vnpu_layout(parse_layout({"2": ["vir04"]}), frozenset, run=True)
    assert _vnpus(npu_smi) == before
    errors = [r.getMessage() for r in caplog.records if r.levelno >= logging.WARNING]
    assert len(errors) == 1, errors
    assert errors[0].startswith("vnpu: chip 2: ")
    assert errors[0].endswith(
        "npu-smi set -t create-vnpu -i 2 -c 0 -f vir04 exited with status 1: "
        "Error: create vnpu failed: no free vgroup on this chip; the chip is left as it was"
    )


async def test_a_template_the_chip_rejects_undoes_what_this_run_made(
    host: HostTree, npu_smi: FakeNpuSmi, caplog: pytest.LogCaptureFixture
) -> None:
    _state(npu_smi, host, reject=["vir02"])
    before = _vnpus(npu_smi)
    backend = _backend(host, npu_smi)
    await backend.query()
    with caplog.at_level(logging.WARNING):
        await backend.apply_vnpu_layout(parse_layout({"2": ["vir04", "vir02"]}), frozenset, run=True)
    assert npu_smi.calls_of("set") == [
        "set -t create-vnpu -i 2 -c 0 -f vir04",
        "set -t create-vnpu -i 2 -c 0 -f vir02",
        "set -t destroy-vnpu -i 2 -c 0 -v 132",
    ]
    assert _vnpus(npu_smi) == before
    errors = [r.getMessage() for r in caplog.records if r.levelno >= logging.WARNING]
    assert len(errors) == 1 and "The template is not supported; the chip is left as it was" in errors[0]
    assert not (host.dev / "vdavinci132").exists()

"""The hot reset's parts: reset groups per model, the process table, npu-smi's reset run against a fake
npu-smi (its prompts answered, failing, hanging, unsupported), the budget and the ResetInfo document."""

from __future__ import annotations

import json
import logging
import os
import time
from pathlib import Path

import anyio
import pytest
from hypothesis import given
from hypothesis import strategies as st

from ascend_agent.backends import chipset
from ascend_agent.backends.dcmi_pairs import PairingError, parse_pairs, read_paired_cards
from ascend_agent.backends.devfs import DevfsBackend
from ascend_agent.backends.npusmi import parse_info
from ascend_agent.backends.npusmi_processes import parse_processes
from ascend_agent.backends.npusmi_reset import reset_chip, reset_result
from ascend_agent.config import ConfigError, Settings, SettingsSource
from ascend_agent.faultclass import FaultClass
from ascend_agent.health.hotreset.budget import ResetBudget
from ascend_agent.health.hotreset.groups import paired_known, reset_groups
from ascend_agent.health.hotreset.manager import cleared_by_reset
from ascend_agent.health.hotreset.resetinfo import ResetDevice, reset_info
from ascend_agent.model import Chip
from tests.support import CONSTRUCTED, FIXTURES
from tests.support.fake_libdcmi import build_libdcmi
from tests.support.host_tree import HostTree
from tests.support.npusmi_fake import FakeNpuSmi
from tests.support.processes import owner_of_this_test, running
from tests.support.training_fixtures import TRAINING


def _groups(chips: list[Chip]) -> set[tuple[int, ...]]:
    return {tuple(sorted(group)) for group in reset_groups(chips).values()}


def test_910a_resets_by_hccs_ring_of_four() -> None:
    chips = [Chip.make(i, "910A", npu_id=i) for i in range(8)]
    assert _groups(chips) == {(0, 1, 2, 3), (4, 5, 6, 7)}


def test_910b_resets_its_hccs_box_or_alone_without_hccs() -> None:
    assert _groups([Chip.make(i, "910B3", npu_id=i) for i in range(8)]) == {tuple(range(8))}
    assert _groups([Chip.make(i, "910B4", npu_id=i) for i in range(16)]) == {tuple(range(16))}
    pcie = [Chip.make(i, "910B4", npu_id=i, board_id=0x3C) for i in range(8)]
    assert _groups(pcie) == {(i,) for i in range(8)}


def _a3_dies(pairs: dict[int, int] | None) -> list[Chip]:
    """The 16 dies of the A3 sample, each card paired as ``pairs`` says (None: not read)."""
    table = parse_info((FIXTURES / "Ascend910-A3x16-24.1.rc3.7-info.txt").read_text())
    return [
        Chip.make(row.device or 0, "910_93", npu_id=row.npu_id, chip_on_card=row.chip,
                  paired_card=None if pairs is None else pairs[row.npu_id])
        for row in table.chips
    ]  # fmt: skip


def test_a3_resets_the_die_pair_with_the_card_the_driver_pairs_it_with() -> None:
    dies = _a3_dies({card: (card + 4) % 8 for card in range(8)})
    groups = reset_groups(dies)
    # NPU 1 holds Phy-IDs 2 and 3, its paired card NPU 5 holds 10 and 11.
    assert sorted(groups[3]) == [2, 3, 10, 11]
    assert len(_groups(dies)) == 4


def test_a3_groups_follow_the_driver_not_a_guess() -> None:
    """The card half the node away was a guess: where the driver pairs otherwise, or pairs no card (Atlas
    9000 A3 SuperPoD), the group is what the driver says; where it said nothing, the node's A3 chips are one
    group (and the hot reset resets none of them: ``paired_known``)."""
    neighbours = _a3_dies({card: card ^ 1 for card in range(8)})
    assert sorted(reset_groups(neighbours)[3]) == [0, 1, 2, 3]
    alone = _a3_dies(dict.fromkeys(range(8), -1))
    assert _groups(alone) == {(2 * card, 2 * card + 1) for card in range(8)}
    unread = _a3_dies(None)
    assert _groups(unread) == {tuple(range(16))}
    assert not any(paired_known(chip) for chip in unread) and all(paired_known(c) for c in alone)
    assert paired_known(Chip.make(0, "910B3"))


def test_the_pairs_the_driver_gives_are_checked() -> None:
    assert parse_pairs("0 4\n4 0\n1 -1\n", [0, 1, 4]) == {0: 4, 4: 0, 1: -1}
    for answer, cards, why in (
        ("0 4\n4 1\n1 4\n", [0, 1, 4], "but card 4 with 1"),
        ("0 9\n", [0], "card 9, which npu-smi does not list"),
        ("0 4\n", [0, 4], "leaves out card 4"),
        ("0 4\n0 4\n4 0\n", [0, 4], "card 0 twice"),
        ("ipmi failed\n", [0], "not CARD BROTHER"),
        ("0 --4\n", [0], "not CARD BROTHER"),  # int() refused it: a ValueError, not a PairingError
        ("\u0660 -1\n", [0], "not CARD BROTHER"),  # another script's digit
    ):
        with pytest.raises(PairingError, match=why):
            parse_pairs(answer, cards)


def test_300i_duo_resets_the_card_and_single_chips_alone() -> None:
    table = parse_info((CONSTRUCTED / "310P3-duo-23.0.0-info.txt").read_text())
    duo = [
        Chip.make(row.device or 0, row.name, npu_id=row.npu_id, chip_on_card=row.chip) for row in table.chips
    ]
    assert _groups(duo) == {(0, 1), (2, 3)}
    assert _groups([Chip.make(i, "950PR", npu_id=i) for i in range(2)]) == {(0,), (1,)}


def test_only_the_reset_classes_are_cleared_by_a_reset() -> None:
    cleared = {c for c in FaultClass if cleared_by_reset(Chip.make(0, "910B3", fault_class=c))}
    assert cleared == {FaultClass.FREE_RESTART_NPU, FaultClass.RESTART_NPU}
    assert not cleared_by_reset(Chip.make(0, "910B3"))


def test_the_process_table_says_which_chips_run_processes() -> None:
    busy = parse_processes((FIXTURES / "910B3x8-26.1.0-info-with-process.txt").read_text())
    assert [busy.count(npu, 0) for npu in range(8)] == [1, 0, 0, 0, 0, 0, 0, 0]
    warning = parse_processes((FIXTURES / "910A-24.1.RC2-info-warning.txt").read_text())
    # Four processes on chip 0; the author cut the table after them: the others are not known.
    assert warning.count(0, 0) == 4 and warning.count(1, 0) is None
    assert parse_processes((CONSTRUCTED / "910B3-health-26.0.0-info.txt").read_text()).count(0, 0) is None
    in_container = parse_processes((CONSTRUCTED / "910B3x2-26.1.0-info-in-container.txt").read_text())
    assert in_container.count(32768, 0) == 1 and in_container.count(96, 0) == 0


@given(st.text(max_size=400))
def test_the_process_table_parser_takes_any_text(text: str) -> None:
    processes = parse_processes(text)
    assert all(count >= 1 for count in processes.per_chip.values())
    assert not processes.idle_npus & {npu for npu, _ in processes.per_chip}


def test_reset_results_as_npu_smi_words_them() -> None:
    assert reset_result(0, "\tStatus : OK\n\tMessage : Reset chip successfully.\n").ok
    failed = reset_result(1, "\tMessage : resetting ...\n\tStatus : Fail\n\tMessage : Failed to reset chip\n")
    assert (failed.ok, failed.detail) == (False, "Failed to reset chip (exit status 1)")
    documented = (TRAINING / "npu-smi-set-t-reset_doc-Atlas200IA2-unsupported.txt").read_text()
    unsupported = reset_result(0, documented.split("$ ")[2].split("\n", 1)[1])
    assert (unsupported.ok, unsupported.detail) == (False, "This device does not support setting reset.")
    busy = reset_result(1, "Another user is resetting the NPU(s). Please try again later.\n")
    assert busy.detail.startswith("Another user is resetting")


@pytest.fixture
def npu_smi(short_dir: Path) -> FakeNpuSmi:
    return FakeNpuSmi(short_dir / "npu-smi")


@pytest.mark.parametrize("second_prompt", [False, True])
def test_the_reset_answers_each_confirmation_prompt(npu_smi: FakeNpuSmi, second_prompt: bool) -> None:
    npu_smi.set_reset("ok", second_prompt=second_prompt)
    outcome = anyio.run(reset_chip, str(npu_smi.path), 5, 1, 10.0)
    assert (outcome.ok, outcome.reason, outcome.detail) == (True, "ok", "Reset chip successfully.")
    answers = "Y y" if second_prompt else "Y"
    assert npu_smi.resets() == [f"set -t reset -i 5 -c 1 -m 1 | {answers}"]


@pytest.mark.parametrize(
    ("result", "detail"),
    [
        ("fail", "Failed to reset chip (exit status 1)"),
        ("unsupported", "This device does not support setting reset. (exit status 1)"),
    ],
)
def test_a_reset_npu_smi_refuses_is_a_failure_in_its_words(
    npu_smi: FakeNpuSmi, result: str, detail: str
) -> None:
    npu_smi.set_reset(result)
    outcome = anyio.run(reset_chip, str(npu_smi.path), 0, 0, 10.0)
    assert (outcome.ok, outcome.reason, outcome.detail) == (False, "failed", detail)


def test_a_hanging_reset_is_killed_at_its_timeout(npu_smi: FakeNpuSmi) -> None:
    npu_smi.set_reset("hang")
    started = time.monotonic()
    outcome = anyio.run(reset_chip, str(npu_smi.path), 0, 0, 1.0)
    assert (outcome.ok, outcome.reason) == (False, "hung")
    assert "timed out after 1 s and was killed" in outcome.detail
    assert time.monotonic() - started < 10, "bounded by the timeout and the reap"


def test_the_budget_counts_resets_per_chip_within_its_window() -> None:
    now = [0.0]
    budget = ResetBudget(limit=3, window=6 * 3600, clock=lambda: now[0])
    for _ in range(3):
        assert budget.allows(5)
        budget.spend(5)
    assert not budget.allows(5) and budget.allows(4)
    now[0] = 6 * 3600 + 1
    assert budget.allows(5) and budget.used(5) == 0


def test_reset_info_has_huaweis_shape() -> None:
    documented = json.loads((TRAINING / "node-annotation-ResetInfo_doc-example.json").read_text())
    dies = [
        Chip.make(p, "910_93", npu_id=p // 2, chip_on_card=p % 2, logic_id=p, paired_card=(p // 2 + 4) % 8)
        for p in range(16)
    ]
    written = json.loads(reset_info([ResetDevice.of(dies[2])]))
    assert written.keys() == documented.keys()
    assert written["ManualResetDevs"] == documented["ManualResetDevs"], "card 1 die 0, paired with card 5"
    assert written["ThirdPartyResetDevs"] == []
    plain = ResetDevice.of(Chip.make(3, "910B3", npu_id=3))
    unread = ResetDevice.of(Chip.make(2, "910_93", npu_id=1, chip_on_card=0))
    assert unread.associated_card_id == -1, "a pairing not read is not guessed"
    assert (plain.associated_card_id, plain.logic_id) == (-1, -1)


def test_hot_reset_settings_refuse_bad_values_in_one_line() -> None:
    with pytest.raises(ConfigError, match=r"^--hot-reset must be one of off, idle, dry-run$"):
        SettingsSource({"hot_reset": "always"}).load()
    with pytest.raises(ConfigError, match=r"^--hot-reset-idle must be a finite number above 0$"):
        SettingsSource({"hot_reset_idle": -1}).load()
    settings = SettingsSource({"hot_reset": "dry-run", "hot_reset_limit": 5}).load()
    assert (settings.hot_reset, settings.hot_reset_limit, settings.hot_reset_recover) == ("dry-run", 5, 180.0)


async def test_the_budget_is_kept_in_a_file_a_new_agent_reads(short_dir: Path) -> None:
    path = short_dir / "plugin" / "hot-reset-budget.json"
    now = [1_700_000_000.0]
    budget = ResetBudget(limit=2, window=100, clock=lambda: now[0], path=path)
    budget.spend(5)
    budget.spend(5)
    await budget.save()
    assert oct(path.stat().st_mode & 0o777) == "0o644"
    assert oct(path.parent.stat().st_mode & 0o777) == "0o750", "made as the instance lock makes it"
    written = {"version": 1, "chips": [{"physId": 5, "resets": [now[0], now[0]]}]}
    assert json.loads(path.read_text()) == written
    again = ResetBudget(limit=2, window=100, clock=lambda: now[0], path=path)
    await again.load()
    assert not again.allows(5) and again.used(5) == 2 and again.allows(4)
    now[0] += 101
    later = ResetBudget(limit=2, window=100, clock=lambda: now[0], path=path)
    await later.load()
    assert later.used(5) == 0, "resets older than the window are dropped"


async def test_two_instances_keep_each_others_resets(short_dir: Path) -> None:
    """A DRA driver's rolling update runs the new pod beside the old one, each with its hot reset and no
    instance lock between them: each save keeps the resets the other wrote (the last writer used to win),
    and each load takes them in, so chip 5's budget counts the resets of both."""
    path = short_dir / "hot-reset-budget.json"
    now = [1_700_000_000.0]
    old = ResetBudget(limit=3, window=100, clock=lambda: now[0], path=path)
    new = ResetBudget(limit=3, window=100, clock=lambda: now[0], path=path)
    old.spend(5)
    await old.save()
    await new.load()
    now[0] += 1
    old.spend(5)
    await old.save()
    now[0] += 1
    new.spend(6)
    await new.save()
    assert (new.used(5), new.used(6)) == (2, 1), "the save took in old's second reset"
    await old.load()
    assert (old.used(5), old.used(6)) == (2, 1)
    after = ResetBudget(limit=3, window=100, clock=lambda: now[0], path=path)
    await after.load()
    assert (after.used(5), after.used(6)) == (2, 1)


@pytest.mark.parametrize(
    "content",
    ["not json", '{"resets": {"5": [1]}}', '{"version": 1, "chips": {"5": [1]}}',
     '{"version": 1, "chips": [{"physId": "5", "resets": [1]}]}',
     '{"version": 1, "chips": [{"physId": true, "resets": [1]}]}',
     '{"version": 1, "chips": [{"physId": 5, "resets": ["now"]}]}',
     '{"version": 1, "chips": [{"physId": 5, "resets": [1e999]}]}', "[" * 100_000,
     '{"version": 1, "chips": [{"physId": 5, "resets": [' + "1," * 200_000 + "1]}]}"],
)  # fmt: skip
async def test_a_budget_file_that_makes_no_sense_is_one_warning_and_an_empty_budget(
    short_dir: Path, content: str, caplog: pytest.LogCaptureFixture
) -> None:
    path = short_dir / "hot-reset-budget.json"
    path.write_text(content)
    budget = ResetBudget(limit=1, window=100, path=path)
    await budget.load()
    await budget.load()
    assert budget.allows(5)
    (record,) = [r for r in caplog.records if "counting the resets from now" in r.getMessage()]
    assert str(path) in record.getMessage() and "\n" not in record.getMessage()
    assert "a hot reset budget" in record.getMessage()


async def test_a_budget_file_that_is_a_link_is_not_followed(short_dir: Path) -> None:
    target = short_dir / "elsewhere.json"
    target.write_text('{"version": 1, "chips": [{"physId": 5, "resets": [1]}]}')
    path = short_dir / "hot-reset-budget.json"
    path.symlink_to(target)
    budget = ResetBudget(limit=1, window=1e12, path=path)
    await budget.load()
    assert budget.allows(5)


async def test_a_reset_time_ahead_of_the_clock_counts_as_now(short_dir: Path) -> None:
    """The clock set back after the resets: they still count, for no longer than the window from now."""
    path = short_dir / "hot-reset-budget.json"
    path.write_text('{"version": 1, "chips": [{"physId": 5, "resets": [5000]}]}')
    now = [1000.0]
    budget = ResetBudget(limit=1, window=100, clock=lambda: now[0], path=path)
    await budget.load()
    assert not budget.allows(5)
    now[0] = 1101
    assert budget.allows(5)


def test_the_pairs_are_read_from_the_drivers_library_in_a_child(
    short_dir: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """The library the driver installs, loaded by a child process of the agent (a blocking driver call must
    be killable at its timeout); its refusals come back as one line with DCMI's meaning."""
    host = short_dir / "host"
    with pytest.raises(PairingError, match=r"libdcmi\.so is not there"):
        anyio.run(read_paired_cards, host, [0], 10.0)
    build_libdcmi(host)
    monkeypatch.setenv("FAKE_DCMI_BROTHERS", "0:4,1:5,2:6,3:7,4:0,5:1,6:2,7:3")
    assert anyio.run(read_paired_cards, host, list(range(8)), 30.0) == {
        0: 4, 1: 5, 2: 6, 3: 7, 4: 0, 5: 1, 6: 2, 7: 3
    }  # fmt: skip
    monkeypatch.setenv("FAKE_DCMI_BROTHERS", "ret:-8255")
    with pytest.raises(PairingError) as refused:
        anyio.run(read_paired_cards, host, [0, 4], 30.0)
    assert str(refused.value).endswith(
        "dcmi_get_netdev_brother_device for card 0 returned -8255 (not supported by this chip or driver)"
    )
    monkeypatch.setenv("FAKE_DCMI_INIT", "-8005")
    with pytest.raises(PairingError, match=r"dcmi_init returned -8005 \(the driver is not visible here\)"):
        anyio.run(read_paired_cards, host, [0, 4], 30.0)
    (host / "usr/local/dcmi/libdcmi.so").write_text("")
    with pytest.raises(PairingError, match=r"cannot load .*libdcmi\.so"):
        anyio.run(read_paired_cards, host, [0, 4], 30.0)


class _Said(logging.Handler):
    """Sets ``said`` when a log line contains ``text``."""

    def __init__(self, text: str) -> None:
        super().__init__()
        self.text = text
        self.said = anyio.Event()

    def emit(self, record: logging.LogRecord) -> None:
        if self.text in record.getMessage():
            self.said.set()


def _a3_node_whose_driver_fails(short_dir: Path, monkeypatch: pytest.MonkeyPatch) -> DevfsBackend:
    """A devfs backend on 16 A3 dies whose libdcmi fails to start (-8005), asked again at once."""
    host = HostTree(short_dir / "host").add_driver().add_management().add_chips(range(16))
    build_libdcmi(host.root)
    npu_smi = FakeNpuSmi(short_dir / "npu-smi")
    npu_smi.set_output("info", (FIXTURES / "Ascend910-A3x16-24.1.rc3.7-info.txt").read_text())
    settings = Settings(
        host_root=host.root, npu_smi=str(npu_smi.path), hot_reset="dry-run", npu_smi_timeout=300
    )
    monkeypatch.setattr(chipset, "PAIRING_RETRY", 0.0)
    monkeypatch.setenv("FAKE_DCMI_INIT", "-8005")
    return DevfsBackend(settings)


async def test_a_pairing_asked_again_never_holds_up_a_health_query(
    short_dir: Path, monkeypatch: pytest.MonkeyPatch, caplog: pytest.LogCaptureFixture
) -> None:
    """The retry of a pairing the driver could not give ran inside the health query: while libdcmi hung,
    every minute a query waited up to the npu-smi timeout for it (and counted it as npu-smi's time). It runs
    in a task of its own now; the query after it ends reports the pairs."""
    backend = _a3_node_whose_driver_fails(short_dir, monkeypatch)
    try:
        assert await backend.query()
        assert {chip.paired_card for chip in (await backend.discover()).chips} == {None}, "not read"
        fifo = short_dir / "dcmi-wait"
        os.mkfifo(fifo)
        monkeypatch.delenv("FAKE_DCMI_INIT")
        monkeypatch.setenv("FAKE_DCMI_WAIT", str(fifo))
        monkeypatch.setenv("FAKE_DCMI_BROTHERS", ",".join(f"{card}:{card ^ 4}" for card in range(8)))
        caplog.set_level(logging.INFO, logger="ascend_agent.backends.devfs")
        read = _Said("A3 cards the driver resets together: 0 with 4, 1 with 5")
        logging.getLogger("ascend_agent.backends.devfs").addHandler(read)
        try:
            with anyio.fail_after(60):  # the driver hangs for 300 s: a query that waits for it fails here
                assert not await backend.query()
            await anyio.to_thread.run_sync(fifo.write_bytes, b"")  # the driver answers
            with anyio.fail_after(60):
                await read.said.wait()
        finally:
            logging.getLogger("ascend_agent.backends.devfs").removeHandler(read)
        assert await backend.query(), "the pairs read between two queries are a change"
        paired = {chip.npu_id: chip.paired_card for chip in (await backend.discover()).chips}
        assert paired == {card: card ^ 4 for card in range(8)}
    finally:
        await backend.close()


async def test_a_pairing_asked_again_is_stopped_with_the_backend(
    short_dir: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """The retry's task ends with the backend (a reload, the agent stopping): its hanging child is killed."""
    backend = _a3_node_whose_driver_fails(short_dir, monkeypatch)
    await backend.query()
    fifo = short_dir / "dcmi-wait"
    os.mkfifo(fifo)
    monkeypatch.setenv("FAKE_DCMI_WAIT", str(fifo))
    try:
        with anyio.fail_after(60):
            await backend.query()
            # Opening the FIFO to write returns once the child has it open to read: it hangs in dcmi_init.
            writer = await anyio.to_thread.run_sync(os.open, fifo, os.O_WRONLY, abandon_on_cancel=True)
            await backend.close()
        os.close(writer)
        assert not [p for p in running(owner_of_this_test()) if "dcmi_pairs" in p.command]
    finally:
        os.close(os.open(fifo, os.O_RDONLY | os.O_NONBLOCK))  # a writer still waiting for a child goes on

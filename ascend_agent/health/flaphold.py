"""No flapping: a chip that turned Unhealthy ``threshold`` times within ``window`` seconds is held Unhealthy
until it has stayed Healthy for ``quiet`` seconds. A chip that recovers once comes back at once.

Pure bookkeeping over a clock that the caller passes in; the caller observes each chip's own health as often
as it likes (observing the same state again changes nothing) and logs the events::

    hold = FlapHold(threshold=3, window=600, quiet=600)
    step = hold.observe("Ascend910-3", healthy=False)
    step.held, step.event            # (False, None) on the first fault
"""

from __future__ import annotations

import enum
import logging
import time
from collections import deque
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field, replace

from ascend_agent.model import Chip, Health
from ascend_agent.observability import CHIP_HELD

log = logging.getLogger(__name__)


class HoldEvent(enum.StrEnum):
    STARTED = "started"
    ENDED = "ended"


@dataclass(frozen=True, slots=True)
class HoldStep:
    """What one observation found: whether the chip is held now, and whether a hold started or ended."""

    held: bool
    event: HoldEvent | None = None


@dataclass
class _Track:
    turns: deque[float] = field(default_factory=deque)  # when it turned Unhealthy, within the window
    healthy: bool | None = None
    held: bool = False
    healthy_since: float | None = None


class FlapHold:
    """Per-device flap detection; ``threshold`` 0 turns holding off.

    >>> now = [0.0]
    >>> hold = FlapHold(threshold=2, window=60, quiet=30, clock=lambda: now[0])
    >>> [hold.observe("a", healthy).held for healthy in (False, True, False)]
    [False, False, True]
    >>> now[0] = 10; hold.observe("a", True).held
    True
    >>> now[0] = 40; hold.observe("a", True)
    HoldStep(held=False, event=<HoldEvent.ENDED: 'ended'>)
    """

    def __init__(
        self, threshold: int, window: float, quiet: float, clock: Callable[[], float] = time.monotonic
    ) -> None:
        self.threshold = threshold
        self.window = window
        self.quiet = quiet
        self._clock = clock
        self._tracks: dict[str, _Track] = {}

    def observe(self, device: str, healthy: bool) -> HoldStep:
        """Record the chip's own health now; the answer says whether to report it held Unhealthy."""
        if self.threshold <= 0:
            return HoldStep(held=False)
        now = self._clock()
        track = self._tracks.setdefault(device, _Track())
        if not healthy and track.healthy is not False:
            track.turns.append(now)
        track.healthy = healthy
        while track.turns and track.turns[0] < now - self.window:
            track.turns.popleft()
        if not track.held:
            if not healthy and len(track.turns) >= self.threshold:
                track.held, track.healthy_since = True, None
                return HoldStep(held=True, event=HoldEvent.STARTED)
            return HoldStep(held=False)
        if not healthy:
            track.healthy_since = None
            return HoldStep(held=True)
        if track.healthy_since is None:
            track.healthy_since = now
        if now - track.healthy_since >= self.quiet:
            track.held, track.healthy_since = False, None
            track.turns.clear()
            return HoldStep(held=False, event=HoldEvent.ENDED)
        return HoldStep(held=True)

    def unknown(self, device: str) -> bool:
        """The chip's health cannot be read now (npu-smi is down): neither a turn nor quiet time, so a held
        chip's quiet period starts again once it is seen Healthy. Whether it is held."""
        track = self._tracks.get(device)
        if track is None or not track.held:
            return False
        track.healthy_since = None
        return True

    def release_in(self, device: str) -> float | None:
        """Seconds until a held chip's hold ends if it stays Healthy; None while it is not held or not
        Healthy (its quiet period has not started)."""
        track = self._tracks.get(device)
        if track is None or not track.held or track.healthy_since is None:
            return None
        return max(0.0, self.quiet - (self._clock() - track.healthy_since))

    def seconds_to_release(self) -> float | None:
        """Seconds until a held chip that is Healthy now has been so for the quiet period (observing it then
        ends its hold); None while no held chip is Healthy."""
        now = self._clock()
        left = [
            self.quiet - (now - track.healthy_since)
            for track in self._tracks.values()
            if track.held and track.healthy_since is not None
        ]
        return max(0.0, min(left)) if left else None

    def reason(self) -> str:
        """Why a held chip is Unhealthy, for ``list`` and the logs."""
        return (
            f"held Unhealthy: it turned Unhealthy {self.threshold} times within {self.window:g} s; "
            f"it comes back once Healthy for {self.quiet:g} s"
        )


class ChipHold:
    """The flap hold over the chips a backend reports, whichever backend: the agent keeps one for its
    lifetime, so a backend made anew by a config reload keeps the chips held and their history::

        hold = ChipHold(threshold=3, window=600, quiet=600)
        chips = hold.apply(inventory.chips)     # a held chip is Unhealthy with the hold's reason
        hold.seconds_to_release()               # when to look again although nothing else happens
    """

    def __init__(
        self, threshold: int, window: float, quiet: float, clock: Callable[[], float] = time.monotonic
    ) -> None:
        self._hold = FlapHold(threshold, window, quiet, clock)

    def configure(self, threshold: int, window: float, quiet: float) -> None:
        """New limits (a config reload); what each chip did so far is kept."""
        self._hold.threshold, self._hold.window, self._hold.quiet = threshold, window, quiet

    def seconds_to_release(self) -> float | None:
        return self._hold.seconds_to_release()

    def release_in(self, device: str) -> float | None:
        """Seconds until the chip's hold ends if it stays Healthy (None: not held, or not Healthy now)."""
        return self._hold.release_in(device)

    def reason(self) -> str:
        return self._hold.reason()

    def apply(self, chips: Sequence[Chip]) -> tuple[Chip, ...]:
        """The chips as reported: each one's own health, unless the hold keeps it Unhealthy."""
        return tuple(self._held(chip) for chip in chips)

    def _held(self, chip: Chip) -> Chip:
        hold = self._hold
        if chip.health_unknown:
            return replace(chip, held=hold.unknown(chip.device_id))
        step = hold.observe(chip.device_id, healthy=chip.health is Health.HEALTHY)
        if step.event is HoldEvent.STARTED:
            log.warning(
                "%s is held Unhealthy: %s (%s)",
                chip.device_id,
                hold.reason().removeprefix("held Unhealthy: "),
                chip.reason or "no reason reported",
            )
        elif step.event is HoldEvent.ENDED:
            log.info("%s is no longer held: Healthy for %g s", chip.device_id, hold.quiet)
        CHIP_HELD.labels(device=chip.device_id).set(1 if step.held else 0)
        if not step.held:
            return chip
        reason = f"{chip.reason or 'Healthy now'}; {hold.reason()}"
        return replace(chip, held=True).with_health(Health.UNHEALTHY, reason)

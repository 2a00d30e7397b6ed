"""Hot reset of chips whose fault a reset clears: reset groups (:mod:`.groups`), the budget
(:mod:`.budget`), the ``ResetInfo`` annotation (:mod:`.resetinfo`), what one reset is (:mod:`.command`) and
the task that resets (:mod:`.manager`)."""

from ascend_agent.health.hotreset.manager import ChipResetter, HotReset, cleared_by_reset

__all__ = ["ChipResetter", "HotReset", "cleared_by_reset"]

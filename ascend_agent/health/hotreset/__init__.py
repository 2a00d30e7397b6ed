"""Hot reset of chips whose fault a reset clears: reset groups (:mod:`.groups`), the budget
(:mod:`.budget`), the ``ResetInfo`` annotation (:mod:`.resetinfo`), what one reset is (:mod:`.command`) and
the task that resets (:mod:`.manager`, loaded only once ``hotReset`` is on)."""

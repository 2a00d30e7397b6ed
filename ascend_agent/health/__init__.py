"""The chips' health as the agent decides it over what a backend reports: the fault-code policy
(:mod:`.faults`), the flap hold (:mod:`.flaphold`) and an admin's manual separation (:mod:`.separation`)."""

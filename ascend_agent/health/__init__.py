"""The chips' health as the agent decides it over what a backend reports, its stages in one
:mod:`.pipeline`: the fault table and its grading (:mod:`.faulttable`, :mod:`.grading`, with
``faultPolicy`` from :mod:`.faults`), the hot reset (:mod:`.hotreset`), the flap hold (:mod:`.flaphold`) and
an admin's manual separation (:mod:`.separation`)."""

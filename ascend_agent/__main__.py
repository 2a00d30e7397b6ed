"""``python -m ascend_agent``: the same as the ``ascend-agent`` command."""

from ascend_agent.cli import main

main()

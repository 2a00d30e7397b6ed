"""``python -m ascend_agent`` and the ``ascend-agent`` command.

``run`` catches SIGTERM and SIGINT before anything else is imported (the command line's libraries take a
good part of a second): a signal in that time stops the agent with exit status 0, as documented, instead of
killing it or printing a traceback.
"""

from __future__ import annotations

import sys

from ascend_agent.stopping import catch_early


def main() -> None:
    if sys.argv[1:2] == ["run"]:
        catch_early()
    from ascend_agent.cli import main as command_line

    command_line()


if __name__ == "__main__":
    main()

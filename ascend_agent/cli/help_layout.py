"""``--help`` as plain text, each command's options under the heading of their group (``Kubelet options:``,
``Backend options:``, ...), in the order of :data:`GROUPS`::

    @app.command(cls=GroupedCommand)
    def run(backend: Annotated[str | None, typer.Option(..., rich_help_panel=BACKEND)] = None) -> None: ...

Click's formatter sets the width: the terminal's less 2, at most 78 and at least 50 columns, 78 without a
terminal (a pipe, a log), or ``COLUMNS``'s. Lines wrap between words only: an option's names, its environment
variable and its default are never cut or split, and a name longer than the first column gets a line of its
own (on a narrow terminal every name does, its help below it). A word longer than a line (none of ours at 80
columns) runs past the edge rather than be cut.
"""

from __future__ import annotations

import re
import textwrap

import click
from typer.core import TyperCommand

GENERAL = "General"
KUBELET = "Kubelet"
BACKEND = "Backend"
HEALTH = "Health"
CLUSTER = "Cluster"
VOLCANO = "Volcano"
DRA = "DRA"
VNPU = "vNPU"
TRAINING = "Training"
OBSERVABILITY = "Observability"
GROUPS = (GENERAL, KUBELET, BACKEND, HEALTH, CLUSTER, VOLCANO, DRA, VNPU, TRAINING, OBSERVABILITY)
# The first column's widest: longer option names sit on a line of their own.
NAME_COLUMN = 30
GAP = 2
# Narrower than this beside the names, the help goes below them, indented by STACKED_INDENT.
NARROWEST_HELP = 40
STACKED_INDENT = 4


def with_default(help: str, shown: str) -> str:
    """An option's help with what it does when not given, as a paragraph of its own: ``[default: ...]``
    (typer's ``show_default`` would write it in parentheses)."""
    return f"{help}\n\n[default: {shown}]"


class GroupedCommand(TyperCommand):
    """A command whose ``--help`` lists its options by group (an option's ``rich_help_panel``; none:
    :data:`GENERAL`)."""

    def format_options(self, ctx: click.Context, formatter: click.HelpFormatter) -> None:
        grouped: dict[str, list[tuple[str, str]]] = {}
        for param in self.get_params(ctx):
            record = param.get_help_record(ctx)
            if record is not None:
                group = getattr(param, "rich_help_panel", None) or GENERAL
                grouped.setdefault(group, []).append(record)
        for group in sorted(grouped, key=GROUPS.index):
            with formatter.section(f"{group} options"):
                write_rows(formatter, grouped[group])


def write_rows(formatter: click.HelpFormatter, rows: list[tuple[str, str]]) -> None:
    """An option per row, each paragraph of its help wrapped beside it, between words only.

    >>> formatter = click.HelpFormatter(width=64)
    >>> write_rows(formatter, [("--kubelet-dir PATH", with_default("The kubelet's.", "/var/lib/kubelet"))])
    >>> print(formatter.getvalue(), end="")
    --kubelet-dir PATH  The kubelet's.
                        [default: /var/lib/kubelet]
    """
    indent = formatter.current_indent
    first = min(max(len(name) for name, _ in rows), NAME_COLUMN) + GAP
    if formatter.width - indent - first < NARROWEST_HELP:
        first = STACKED_INDENT  # a narrow terminal: each name on its line, its help below it
    width = max(formatter.width - indent - first, NARROWEST_HELP // 2)
    for name, text in rows:
        lines = [line for paragraph in text.split("\n\n") for line in _wrap(paragraph, width)] or [""]
        if len(name) + GAP <= first:
            formatter.write(f"{'':>{indent}}{name:<{first}}{lines[0]}".rstrip() + "\n")
            lines = lines[1:]
        else:  # a pair of names wider than the terminal (--x / --no-x) goes on two lines, never cut
            for part in _wrap(name, max(formatter.width - indent, 1)):
                formatter.write(f"{'':>{indent}}{part}\n")
        for line in lines:
            formatter.write(f"{'':>{indent + first}}{line}\n")


_BRACKETED = re.compile(r"\[[^\]]*\]")
_KEEP = "\x00"


def _wrap(paragraph: str, width: int) -> list[str]:
    """Lines of at most ``width`` between words; a bracketed note (``[env var: NAME]``) kept on one line
    where it fits on one.

    >>> _wrap("Seconds.  [default: 5.0]  [env var: ASCEND_AGENT_HEALTH_INTERVAL]", 40)
    ['Seconds.  [default: 5.0]', '[env var: ASCEND_AGENT_HEALTH_INTERVAL]']
    """

    def keep(note: re.Match[str]) -> str:
        return note.group().replace(" ", _KEEP) if len(note.group()) <= width else note.group()

    kept = _BRACKETED.sub(keep, paragraph)
    wrapped = textwrap.wrap(kept, width, break_long_words=False, break_on_hyphens=False)
    return [line.replace(_KEEP, " ") for line in wrapped]

"""PyYAML's safe loader without aliases and without a key given twice, for files people write (the config
file). Imported only when such a file is read, so an agent started without one never loads PyYAML::

    try:
        document = load_document(text)
    except AliasFound as found:      # found.line
        ...
    except DuplicateKey as twice:    # twice.key, twice.first, twice.again
        ...
    except YAMLError:                # not YAML at all; PyYAML's problem_mark says where
        ...
"""

from __future__ import annotations

from typing import Any

import yaml
from yaml import YAMLError

__all__ = ["AliasFound", "DuplicateKey", "YAMLError", "load_document"]


class AliasFound(Exception):
    def __init__(self, line: int) -> None:
        super().__init__(line)
        self.line = line


class DuplicateKey(Exception):
    def __init__(self, key: Any, first: int, again: int) -> None:
        super().__init__(key, first, again)
        self.key, self.first, self.again = key, first, again


class _NoAliasLoader(yaml.SafeLoader):
    """PyYAML's safe loader without aliases: one short string referenced many times under a list expands
    into gigabytes (an "alias bomb"), and no setting needs one. A key given twice in one mapping is refused:
    PyYAML would keep the last one without a word, and which of two values was meant is the reader's guess."""

    def compose_node(self, parent: Any, index: Any) -> Any:
        if self.check_event(yaml.AliasEvent):
            raise AliasFound(self.peek_event().start_mark.line + 1)  # type: ignore[no-untyped-call]
        return super().compose_node(parent, index)

    def construct_mapping(self, node: yaml.MappingNode, deep: bool = False) -> dict[Any, Any]:
        lines: dict[Any, int] = {}
        for key_node, _ in node.value:
            if key_node.tag == "tag:yaml.org,2002:merge":
                continue
            key = self.construct_object(key_node, deep=True)
            line = key_node.start_mark.line + 1
            try:
                if key in lines:
                    raise DuplicateKey(key, lines[key], line)
                lines[key] = line
            except TypeError:  # an unhashable key: the base class says so
                continue
        return super().construct_mapping(node, deep=deep)


def load_document(text: str) -> Any:
    """The one YAML document in ``text`` (None when empty): :class:`AliasFound`, :class:`DuplicateKey` or
    :class:`YAMLError` when it cannot be taken."""
    return yaml.load(text, Loader=_NoAliasLoader)

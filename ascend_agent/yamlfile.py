"""Reading a YAML document a person wrote (the config file): UTF-8 checked, no aliases, no key given twice,
every problem one :class:`ConfigError` line naming the file::

    document = load_yaml(path.read_bytes(), f"config file {path}")   # None for an empty file

:class:`ConfigError`, every bad setting's error, is defined here, beneath ``config`` (which re-exports it).
"""

from __future__ import annotations

from typing import Any

import yaml


class ConfigError(ValueError):
    """Bad usage or configuration: the CLI prints it as one line and exits 2."""


def decode_utf8(data: bytes, what: str) -> str:
    """``data`` as text; :class:`ConfigError` names ``what`` and the first byte that is not UTF-8::

    decode_utf8(b"a: 1 # \xb2\xe2", "config file c.yaml")
    # ConfigError: config file c.yaml is not UTF-8: byte 0xb2 at offset 7 (line 1); save it as UTF-8
    """
    try:
        return data.decode("utf-8")
    except UnicodeDecodeError as exc:
        line = data.count(b"\n", 0, exc.start) + 1
        raise ConfigError(
            f"{what} is not UTF-8: byte 0x{data[exc.start]:02x} at offset {exc.start} (line {line}); "
            "save it as UTF-8"
        ) from None


class _AliasFound(Exception):
    def __init__(self, line: int) -> None:
        super().__init__(line)
        self.line = line


class _DuplicateKey(Exception):
    def __init__(self, key: Any, first: int, again: int) -> None:
        super().__init__(key, first, again)
        self.key, self.first, self.again = key, first, again


class _NoAliasLoader(yaml.SafeLoader):
    """PyYAML's safe loader without aliases: one short string referenced many times under a list expands
    into gigabytes (an "alias bomb"), and no setting needs one. A key given twice in one mapping is refused:
    PyYAML would keep the last one without a word, and which of two values was meant is the reader's guess."""

    def compose_node(self, parent: Any, index: Any) -> Any:
        if self.check_event(yaml.AliasEvent):
            raise _AliasFound(self.peek_event().start_mark.line + 1)  # type: ignore[no-untyped-call]
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
                    raise _DuplicateKey(key, lines[key], line)
                lines[key] = line
            except TypeError:  # an unhashable key: the base class says so
                continue
        return super().construct_mapping(node, deep=deep)


def load_yaml(data: bytes, what: str) -> Any:
    """The document in ``data`` (UTF-8 YAML); :class:`ConfigError` names ``what`` and the line."""
    text = decode_utf8(data, what)
    try:
        return yaml.load(text, Loader=_NoAliasLoader)
    except _AliasFound as found:
        raise ConfigError(
            f"{what} uses a YAML alias at line {found.line}; write the value out instead"
        ) from None
    except _DuplicateKey as twice:
        raise ConfigError(
            f"{what}: {twice.key} is given twice (lines {twice.first} and {twice.again}); keep one"
        ) from None
    except yaml.YAMLError as exc:
        mark = getattr(exc, "problem_mark", None)
        where = f" at line {mark.line + 1}" if mark is not None else ""
        raise ConfigError(f"{what} is not valid YAML{where}") from None

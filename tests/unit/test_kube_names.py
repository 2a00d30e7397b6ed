"""The Kubernetes name rules, kept in one place (``kube_names``) for the config, the claims' files and the
DRA service."""

from __future__ import annotations

from pathlib import Path

import pytest
from hypothesis import given
from hypothesis import strategies as st

import ascend_agent
from ascend_agent.kube_names import is_dns_label, is_dns_subdomain

_PACKAGE = Path(ascend_agent.__file__).parent


@pytest.mark.parametrize(
    ("value", "label", "subdomain"),
    [
        ("default", True, True),
        ("kube-system", True, True),
        ("npu.huawei.com", False, True),
        ("3f2a9c1d-7b4e-4c1a-9d2e-0123456789ab", True, True),
        ("a" * 63, True, True),
        ("a" * 64, False, True),
        ("", False, False),
        ("-a", False, False),
        ("a-", False, False),
        ("A", False, False),
        ("a..b", False, False),
        ("a\n", False, False),
    ],
)
def test_labels_and_subdomains(value: str, label: bool, subdomain: bool) -> None:
    assert (is_dns_label(value), is_dns_subdomain(value)) == (label, subdomain)


def test_a_subdomain_is_at_most_253_or_the_limit_given() -> None:
    name = ".".join(["a" * 63] * 4)[:253]
    assert is_dns_subdomain(name) and not is_dns_subdomain(name + "b")
    assert not is_dns_subdomain("a" * 64, most=63)


@given(st.lists(st.from_regex(r"[a-z0-9]([-a-z0-9]{0,61}[a-z0-9])?", fullmatch=True), min_size=1, max_size=4))
def test_labels_joined_by_dots_are_a_subdomain(labels: list[str]) -> None:
    assert all(is_dns_label(label) for label in labels)
    assert is_dns_subdomain(".".join(labels))


@pytest.mark.parametrize("rule", [r"[-a-z0-9]{0,61}", r"(\.[a-z0-9]("])
def test_each_rule_is_written_once(rule: str) -> None:
    holders = sorted(
        str(path.relative_to(_PACKAGE)) for path in _PACKAGE.rglob("*.py") if rule in path.read_text()
    )
    assert holders == ["kube_names.py"]

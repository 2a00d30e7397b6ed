"""The Kubernetes API's rules for names (RFC 1123): a DNS label (namespaces, UIDs as file names) and a DNS
subdomain (object names, the driver name). Names others give; the agent's own are in ``naming``."""

from __future__ import annotations

import re

_DNS_LABEL = re.compile(r"[a-z0-9]([-a-z0-9]{0,61}[a-z0-9])?")
# A JSON Schema pattern too (values.schema.json): anchored there, as JSON Schema patterns are not.
DNS_SUBDOMAIN_PATTERN = r"[a-z0-9]([-a-z0-9]*[a-z0-9])?(\.[a-z0-9]([-a-z0-9]*[a-z0-9])?)*"
_DNS_SUBDOMAIN = re.compile(DNS_SUBDOMAIN_PATTERN)
DNS_SUBDOMAIN_MAX = 253


def is_dns_label(value: str) -> bool:
    """Lower-case letters, digits and '-', at most 63, starting and ending with a letter or digit."""
    return _DNS_LABEL.fullmatch(value) is not None


def is_dns_subdomain(value: str, most: int = DNS_SUBDOMAIN_MAX) -> bool:
    """DNS labels joined by '.', at most ``most`` characters in all."""
    return len(value) <= most and _DNS_SUBDOMAIN.fullmatch(value) is not None

"""Where completion webhooks may go, and whose key signs them.

Addresses: a `metadata.webhook_url` is a request the worker makes on a tenant's behalf
(SSRF). Only public addresses are allowed: not loopback, private, link-local (the
cloud metadata service at 169.254.169.254), shared (CGNAT), multicast, reserved or
unspecified, the same for IPv6, and an IPv4 address inside IPv6 (mapped, NAT64, 6to4,
Teredo) is judged as that IPv4 address. `TOKENQ_WEBHOOK_ALLOW_HOSTS` lets an operator
allow in-cluster receivers by exact host name or by CIDR. The API checks at submit
(400); the sender checks again at send time on the address it resolved, and connects
to that very address (no second lookup for a DNS rebinding to answer differently).

Secrets (Standard Webhooks): `whsec_<base64>`; the HMAC key is the decoded bytes. Each
tenant has its own: `TOKENQ_WORKER__WEBHOOK_SECRETS` names some, the others are derived from
`TOKENQ_WORKER__WEBHOOK_SECRET` and the tenant's name (HMAC), so no tenant can verify, or
forge, another tenant's events.
"""

from __future__ import annotations

import asyncio
import base64
import hashlib
import hmac
import ipaddress
import socket
from typing import TYPE_CHECKING
from urllib.parse import urlsplit

from tokenq.shared.parsing import SECRET_PREFIX, secret_key

if TYPE_CHECKING:
    from tokenq.shared.settings import Settings

IPAddress = ipaddress.IPv4Address | ipaddress.IPv6Address
NAT64 = ipaddress.ip_network("64:ff9b::/96")


class UnsafeWebhook(ValueError):
    """The webhook URL is not one this server sends to."""


def embedded_v4(ip: IPAddress) -> ipaddress.IPv4Address | None:
    """The IPv4 address an IPv6 one carries (mapped, NAT64, 6to4, Teredo), if any."""
    if isinstance(ip, ipaddress.IPv4Address):
        return None
    if ip.ipv4_mapped is not None:
        return ip.ipv4_mapped
    if ip in NAT64:
        return ipaddress.IPv4Address(int(ip) & 0xFFFFFFFF)
    if ip.sixtofour is not None:
        return ip.sixtofour
    if ip.teredo is not None:
        return ip.teredo[1]
    return None


def is_public(ip: IPAddress) -> bool:
    inner = embedded_v4(ip)
    if inner is not None and not is_public(inner):
        return False
    return bool(ip.is_global) and not (ip.is_multicast or ip.is_reserved or ip.is_unspecified
                                       or ip.is_loopback or ip.is_link_local or ip.is_private)


class AddressPolicy:
    """Public addresses, plus the operator's allowlist (host names and CIDRs)."""

    def __init__(self, allow: list[str]):
        self.names: set[str] = set()
        self.nets: list[ipaddress.IPv4Network | ipaddress.IPv6Network] = []
        for item in allow:
            try:
                self.nets.append(ipaddress.ip_network(item.strip(), strict=False))
            except ValueError:
                self.names.add(item.strip().lower().rstrip("."))

    def host_allowed(self, host: str) -> bool:
        return host.lower().rstrip(".") in self.names

    def address_allowed(self, ip: IPAddress, host: str) -> bool:
        if self.host_allowed(host) or is_public(ip):
            return True
        return any(ip.version == net.version and ip in net for net in self.nets)


def split_url(url: str) -> tuple[str, str, int]:
    """(scheme, host, port) of a webhook URL; UnsafeWebhook when it is not http(s)."""
    try:
        parts = urlsplit(url)
        port = parts.port
    except ValueError as exc:
        raise UnsafeWebhook(f"webhook_url is not a URL: {exc}") from exc
    if parts.scheme not in ("http", "https") or not parts.hostname:
        raise UnsafeWebhook("webhook_url must be an http:// or https:// URL with a host")
    if parts.username is not None or parts.password is not None:
        raise UnsafeWebhook("webhook_url must not carry credentials before the host")
    return parts.scheme, parts.hostname, port or (443 if parts.scheme == "https" else 80)


def literal_ip(host: str) -> IPAddress | None:
    try:
        return ipaddress.ip_address(host.split("%", 1)[0])
    except ValueError:
        return None


def check_addresses(policy: AddressPolicy, host: str, addresses: list[str]) -> IPAddress:
    """The first resolved address of `host`, if every one is allowed (a name that resolves
    to a public and a private address is refused: which one a client uses is not ours to
    know); UnsafeWebhook otherwise."""
    ips = [ip for a in addresses if (ip := literal_ip(a)) is not None]
    if not ips:
        raise UnsafeWebhook(f"webhook_url host {host!r} does not resolve")
    for ip in ips:
        if not policy.address_allowed(ip, host):
            raise UnsafeWebhook(f"webhook_url host {host!r} is not a public address "
                                f"({ip}); an operator can allow it with "
                                "TOKENQ_WEBHOOK_ALLOW_HOSTS")
    return ips[0]


async def resolve(policy: AddressPolicy, url: str,
                  timeout_s: float = 5.0) -> tuple[str, str, int, IPAddress]:
    """(scheme, host, port, the address to connect to) of an allowed webhook URL; the
    lookup runs in the loop's resolver threads (never blocks the loop)."""
    scheme, host, port = split_url(url)
    ip = literal_ip(host)
    if ip is not None:
        return scheme, host, port, check_addresses(policy, host, [str(ip)])
    try:
        infos = await asyncio.wait_for(asyncio.get_running_loop().getaddrinfo(
            host, port, type=socket.SOCK_STREAM), timeout_s)
    except (OSError, TimeoutError) as exc:
        raise UnsafeWebhook(f"webhook_url host {host!r} does not resolve ({exc})") from exc
    return scheme, host, port, check_addresses(policy, host, [str(i[4][0]) for i in infos])


# -- secrets ---------------------------------------------------------------------------
def tenant_secret(s: Settings, tenant: str) -> str | None:
    """The tenant's signing secret: named in webhook_secrets, else derived from
    webhook_secret (None: neither is set, events go unsigned)."""
    named = s.worker.webhook_secrets.get(tenant)
    if named:
        return named
    master = s.worker.webhook_secret
    if not master:
        return None
    derived = hmac.new(secret_key(master), b"tokenq-webhook-tenant:" + tenant.encode(),
                       hashlib.sha256).digest()
    return SECRET_PREFIX + base64.b64encode(derived).decode()

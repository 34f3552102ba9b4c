"""The pure parsers settings validation needs: a leaf module (it imports nothing of
tokenq), so that settings.py and settings_roles.py check values without importing the
Redis client or the webhook sender, which themselves read the settings."""

from __future__ import annotations

import base64
import binascii
import re

SECRET_PREFIX = "whsec_"
_HOST = re.compile(r"[A-Za-z0-9]([A-Za-z0-9.-]{0,252})?")
SENTINELS_FORM = "host:port,host:port (e.g. sentinel-1:26379,sentinel-2:26379,[::1]:26379)"


def parse_address(text: str) -> tuple[str, int]:
    """One sentinel's `host:port` (`[v6]:port` for IPv6); ValueError naming the entry."""
    entry = text.strip()
    host, sep, port = entry.rpartition(":")
    if host.startswith("[") and host.endswith("]"):
        host = host[1:-1]
        ok_host = bool(host) and all(c in "0123456789abcdefABCDEF:." for c in host)
    else:
        ok_host = _HOST.fullmatch(host) is not None
    if not sep or not ok_host or not port.isascii() or not port.isdigit() \
            or len(port) > 5 or not 0 < int(port) < 65536:
        shown = entry if len(entry) <= 80 else entry[:80] + "..."
        raise ValueError(f"sentinel {shown!r} is not host:port; expected {SENTINELS_FORM}")
    return host, int(port)


def secret_key(secret: str) -> bytes:
    """A Standard Webhooks secret's HMAC key: the base64-decoded part after `whsec_`."""
    if not secret.startswith(SECRET_PREFIX):
        raise ValueError("a webhook secret has the form whsec_<base64>")
    try:
        return base64.b64decode(secret.removeprefix(SECRET_PREFIX), validate=True)
    except binascii.Error as exc:
        raise ValueError(f"a webhook secret has the form whsec_<base64>: {exc}") from exc

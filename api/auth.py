"""API keys: who is calling (tenant, admin role), checked once for every route.

Keys come from `TOKENQ_API_KEYS` (`key:tenant[:role[+role]],…`, for dev and tests) and/or
a keys file (`TOKENQ_API__KEYS_FILE`) holding only SHA-256 hashes, one key a line:

    # sha256 of the key          tenant   [roles: admin | high | metrics] [weight=N]
    sha256:9f86d081884c7d65...   acme     weight=2
    sha256:60303ae22b998861...   ops      admin
    sha256:2c26b46b68ffc68f...   rush     high
    sha256:fcde2b2edba56bf4...   prom     metrics

Both are kept as hash -> Principal, so a presented key is hashed and looked up; the
process never needs the plain keys of a file. (`tokenq hash-key KEY` prints a line.)
Every entry needs a key and a tenant: an entry without either, an unknown role or a file
that cannot be read refuses the API's start with one line naming the entry (its position
and tenant, never the key), as a wrong setting does (`keys_from_env`).

Why a middleware rather than a dependency on each route: a route added later (files,
batches, admin) cannot forget it. With keys configured, every path but the public ones
needs `Authorization: Bearer <key>` (401 otherwise, before the body is read), and each
request is charged to its tenant's requests/s bucket (429 + Retry-After). `/metrics` and
`/metrics/targets` need a key with the `metrics` (or `admin`) role: Prometheus sends it as
a bearer token.

Without keys, everyone is tenant `default` with the admin role, so such an API must not be
reachable from another machine. `tokenq api` and api/server.py bind to loopback; every
other way to serve it (`uvicorn tokenq.api.app:create_app --factory --host 0.0.0.0`,
gunicorn, hypercorn) is covered here: a request that arrived on an address outside
loopback (the ASGI scope's `server`, the socket's own address) is refused with 403. Checked
per request because the app cannot know at start which interfaces its server listens on,
and a request's local address is what matters whatever the server binds.
"""

from __future__ import annotations

import hashlib
import ipaddress
import logging
import os
from dataclasses import dataclass
from pathlib import Path

from redis.exceptions import RedisError
from starlette.types import ASGIApp, Receive, Scope, Send

from tokenq.api.errors import RateLimited, envelope
from tokenq.shared import logs
from tokenq.shared.settings import Settings, SettingsProblem

log = logging.getLogger(__name__)

DEFAULT_TENANT = "default"
# Health and readiness are probed without keys; the docs show only the shapes. The
# playground page is static; its API calls carry the key typed into it. Metrics are not
# public: they tell queue depths, models and load (a `metrics` key).
PUBLIC_PATHS = frozenset({"/health", "/ready", "/docs", "/redoc", "/openapi.json",
                          "/docs/oauth2-redirect", "/playground"})


# Roles a key may carry besides its tenant: `admin` (every admin route, and all below),
# `high` (may submit `priority: high`), `metrics` (Prometheus: /metrics, /metrics/targets).
ROLES = frozenset({"admin", "high", "metrics"})


@dataclass(frozen=True)
class Principal:
    tenant: str
    admin: bool = False
    high: bool = False  # may use `priority: high`
    metrics: bool = False  # may read /metrics and /metrics/targets (workers' addresses)
    weight: float = 1.0  # fair share between tenants (docs/scheduling.md): `weight=N`

    @classmethod
    def of(cls, tenant: str, roles: list[str], where: str) -> Principal:
        weights = [r for r in roles if r.startswith("weight=")]
        roles = [r for r in roles if not r.startswith("weight=")]
        unknown = set(roles) - ROLES
        if unknown:
            raise SettingsProblem(f"{where}: unknown role {sorted(unknown)[0]!r}; roles "
                                  f"are {', '.join(sorted(ROLES))} (and weight=N)")
        admin = "admin" in roles
        return cls(tenant, admin=admin, high=admin or "high" in roles,
                   metrics=admin or "metrics" in roles,
                   weight=parse_weight(weights, where))


MAX_WEIGHT = 1000.0


def parse_weight(items: list[str], where: str) -> float:
    """`weight=N` (at most one): a number in (0, MAX_WEIGHT]; none: 1."""
    if len(items) > 1:
        raise SettingsProblem(f"{where}: weight given {len(items)} times")
    if not items:
        return 1.0
    text = items[0].removeprefix("weight=")
    try:
        weight = float(text)
    except ValueError:
        weight = float("nan")
    if not 0 < weight <= MAX_WEIGHT:  # nan fails too
        raise SettingsProblem(f"{where}: weight={text!r}: a tenant's fair-share weight is "
                              f"a number above 0 and at most {MAX_WEIGHT:g}")
    return weight


def check_weights(keys: dict[str, Principal]) -> None:
    """A tenant's key entries must agree on its weight (a weight belongs to the tenant)."""
    seen: dict[str, float] = {}
    for p in keys.values():
        if seen.setdefault(p.tenant, p.weight) != p.weight:
            raise SettingsProblem(f"tenant {p.tenant!r}: its API key entries give "
                                  f"different weights ({seen[p.tenant]:g} and {p.weight:g}); "
                                  f"give one weight=N on each of its keys, or on none")


# Only when no keys are configured.
ANONYMOUS = Principal(DEFAULT_TENANT, admin=True, high=True, metrics=True)


def hash_key(key: str) -> str:
    return hashlib.sha256(key.encode()).hexdigest()


KEYS_FORM = "KEY:TENANT[:ROLE[+ROLE]], comma-separated"


def parse_keys(raw: str | None) -> dict[str, Principal]:
    """`key:tenant[:role[+role]],…` -> {sha256(key): Principal} (a role may be
    `weight=N`). An entry without a key or a tenant is refused (SettingsProblem) naming its
    position and tenant, never the key: a key without a tenant would share `default` with
    every other such key, and an empty key would leave the API without keys (everyone its
    admin). Blank entries (a trailing comma) are skipped."""
    out: dict[str, Principal] = {}
    wheres: dict[str, str] = {}
    for n, item in enumerate((raw or "").split(","), 1):
        if not item.strip():
            continue
        key, colon, rest = item.strip().partition(":")
        tenant, _, role = rest.partition(":")
        key, tenant = key.strip(), tenant.strip()
        where = f"TOKENQ_API_KEYS entry {n}" + (f" (tenant {tenant!r})" if tenant else "")
        if not colon:
            raise SettingsProblem(f"{where}: no tenant (the entry is a key alone); each "
                                  f"entry is {KEYS_FORM}")
        if not key:
            raise SettingsProblem(f"{where}: the key is empty; each entry is {KEYS_FORM}")
        if not tenant:
            raise SettingsProblem(f"{where}: the tenant is empty; each entry is {KEYS_FORM}")
        _add(out, wheres, hash_key(key),
             Principal.of(tenant, [r for r in role.split("+") if r], where), where)
    if not out and raw and raw.strip():
        raise SettingsProblem(f"TOKENQ_API_KEYS has no entries; each entry is {KEYS_FORM}")
    return out


def load_keys_file(path: Path) -> dict[str, Principal]:
    """Lines of `sha256:<hex> tenant [role ...]`; `#` starts a comment."""
    try:
        text = path.read_text()
    except (OSError, UnicodeDecodeError) as exc:
        why = exc.strerror if isinstance(exc, OSError) and exc.strerror else str(exc)
        raise SettingsProblem(f"TOKENQ_API__KEYS_FILE={path}: cannot read it ({why})"
                              ) from exc
    out: dict[str, Principal] = {}
    wheres: dict[str, str] = {}
    for n, line in enumerate(text.splitlines(), 1):
        parts = line.split("#", 1)[0].split()
        if not parts:
            continue
        digest = parts[0].removeprefix("sha256:").lower()
        if len(parts) < 2 or len(digest) != 64 or any(c not in "0123456789abcdef"
                                                       for c in digest):
            raise SettingsProblem(f"TOKENQ_API__KEYS_FILE {path}:{n}: expected "
                                  "'sha256:<64 hex> tenant [role ...]'")
        where = f"TOKENQ_API__KEYS_FILE {path}:{n}"
        _add(out, wheres, digest, Principal.of(parts[1], parts[2:], where), where)
    return out


def _add(out: dict[str, Principal], wheres: dict[str, str], digest: str,
         principal: Principal, where: str) -> None:
    """One key's entry; the same key given again for another tenant or other roles is a
    SettingsProblem naming both entries (which one wins would be an accident of order)."""
    if digest in out and out[digest] != principal:
        raise SettingsProblem(f"{where}: the same key as {wheres[digest]}, for another tenant "
                              "or other roles; each key belongs to one entry")
    out[digest] = principal
    wheres.setdefault(digest, where)


def load_keys(raw: str | None, path: Path | None) -> dict[str, Principal]:
    """The keys of `raw` (TOKENQ_API_KEYS) and of the file at `path`; any problem is a
    SettingsProblem, one line naming the entry (never a key)."""
    keys = parse_keys(raw)
    if path is not None:
        for digest, principal in load_keys_file(path).items():
            if digest in keys and keys[digest] != principal:
                raise SettingsProblem(f"TOKENQ_API__KEYS_FILE {path}: a key also in "
                                      "TOKENQ_API_KEYS, for another tenant or other roles; "
                                      "each key belongs to one entry")
            keys[digest] = principal
    check_weights(keys)
    return keys


def keys_from_env(settings: Settings) -> dict[str, Principal]:
    """The keys this process's API serves: TOKENQ_API_KEYS and TOKENQ_API__KEYS_FILE."""
    return load_keys(os.environ.get("TOKENQ_API_KEYS"), settings.api.keys_file)


def off_loopback(scope: Scope) -> str | None:
    """The address a request arrived on (the server's side of its connection), when that
    is an IP address outside loopback; None for loopback, a Unix socket's path or an
    in-process test client's name."""
    server = scope.get("server")
    if not server:
        return None
    host = str(server[0])
    try:
        ip = ipaddress.ip_address(host.split("%", 1)[0])
    except ValueError:
        return None
    mapped = ip.ipv4_mapped if isinstance(ip, ipaddress.IPv6Address) else None
    return None if (mapped or ip).is_loopback else host


def bearer(headers: list[tuple[bytes, bytes]]) -> str | None:
    for name, value in headers:
        if name == b"authorization":
            scheme, _, token = value.decode("latin-1").partition(" ")
            return token.strip() if scheme.lower() == "bearer" and token.strip() else None
    return None


class KeyAuth:
    """ASGI middleware: sets scope["state"]["principal"] or answers 401/429 itself."""

    def __init__(self, app: ASGIApp, keys: dict[str, Principal]):
        self.app = app
        self.keys = keys
        self._warned = False

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        if scope["type"] == "http" and not self.keys:
            where = off_loopback(scope)
            if where is not None:
                await self._refuse_off_loopback(where, scope, receive, send)
                return
        if scope["type"] != "http" or scope.get("path", "") in PUBLIC_PATHS:
            await self.app(scope, receive, send)
            return
        principal = ANONYMOUS
        if self.keys:
            token = bearer(scope.get("headers") or [])
            found = self.keys.get(hash_key(token)) if token else None
            if found is None:
                resp = envelope(401, "missing or invalid API key (Authorization: Bearer <key>)",
                                "authentication_error", "invalid_api_key",
                                headers={"WWW-Authenticate": "Bearer"})
                await resp(scope, receive, send)
                return
            principal = found
        scope.setdefault("state", {})["principal"] = principal
        state = getattr(scope["app"].state, "tokenq", None)
        if state is not None and state.settings.api.rate_limit_rps > 0:
            s = state.settings
            try:
                await state.limits.charge_requests(principal.tenant, s.api.rate_limit_rps,
                                                   s.api.rate_limit_burst)
            except RateLimited as exc:
                resp = envelope(429, exc.message, exc.type, exc.code,
                                headers={"Retry-After": str(exc.retry_after)})
                await resp(scope, receive, send)
                return
            except RedisError as exc:
                log.warning("rate limit check failed: %s", exc)
                resp = envelope(503, "the job store is unavailable for the moment; retry",
                                "service_unavailable", "unavailable",
                                headers={"Retry-After": "1"})
                await resp(scope, receive, send)
                return
        with logs.bind(tenant=principal.tenant):
            await self.app(scope, receive, send)

    async def _refuse_off_loopback(self, where: str, scope: Scope, receive: Receive,
                                   send: Send) -> None:
        if not self._warned:
            self._warned = True
            log.warning("no API keys configured: refusing requests that arrive on %s (only "
                        "loopback is served); set TOKENQ_API__KEYS_FILE or TOKENQ_API_KEYS "
                        "to serve other interfaces", where)
        resp = envelope(403, "this API has no API keys configured, so it answers on loopback "
                        "only (every caller would be its admin); the operator sets "
                        "TOKENQ_API__KEYS_FILE or TOKENQ_API_KEYS to serve this address",
                        "permission_error", "loopback_only")
        await resp(scope, receive, send)

"""docs/api.md's routes table lists exactly the routes the app serves: a route added
without a line there (or a line for a route that is gone) fails here."""

from __future__ import annotations

import os
import re
from pathlib import Path

import pytest
from starlette.routing import Route

from tokenq.api.app import create_app
from tokenq.shared.settings import Settings
from tokenq.shared.settings_roles import ApiSettings

DOC = Path(__file__).resolve().parents[2] / "docs" / "api.md"


def expand(path: str) -> list[str]:
    """`/v1/files[/{id}[/content]]` -> /v1/files, /v1/files/{id}, /v1/files/{id}/content."""
    m = re.search(r"\[([^\[\]]*)\]", path)
    if m is None:
        return [path]
    return [*expand(path[:m.start()] + path[m.end():]),
            *expand(path[:m.start()] + m.group(1) + path[m.end():])]


def normal(path: str) -> str:
    return re.sub(r"\{[^}]*\}", "{}", path)  # a parameter's name is no part of the route


def documented() -> set[tuple[str, str]]:
    text = DOC.read_text().split("## Routes", 1)[1]
    table = text.split("\n\n", 2)[1]  # the table: the block after the heading
    out: set[tuple[str, str]] = set()
    for row in table.splitlines()[2:]:
        first = row.split(" | ", 1)[0]
        for method, path in re.findall(r"`(GET|POST|PUT|PATCH|DELETE) (/[^`\s]*)`", first):
            out |= {(method, normal(p)) for p in expand(path)}
    return out


def served() -> set[tuple[str, str]]:
    app = create_app(Settings(redis_url="redis://127.0.0.1:1/0",
                              api=ApiSettings(playground=True)))
    out = set()
    for route in app.routes:
        assert isinstance(route, Route), route  # a mount would hide its routes from here
        out |= {(m, normal(route.path)) for m in route.methods or () if m != "HEAD"}
    return out


def test_docs_api_lists_every_route_the_app_serves(monkeypatch: pytest.MonkeyPatch,
                                                  tmp_path: Path) -> None:
    for var in [v for v in os.environ if v.upper().startswith("TOKENQ_")]:
        monkeypatch.delenv(var)
    monkeypatch.chdir(tmp_path)  # no tokenq.toml
    doc, app = documented(), served()
    assert ("POST", "/v1/adapters/{}/rollback") in app  # the walk sees the routers' routes
    assert app - doc == set(), "served, not in docs/api.md's routes table"
    assert doc - app == set(), "in docs/api.md's routes table, not served"


def test_the_table_reader_expands_optional_parts() -> None:
    assert set(expand("/v1/files[/{id}[/content]]")) == {
        "/v1/files", "/v1/files/{id}", "/v1/files/{id}/content"}

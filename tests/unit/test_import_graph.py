"""The modules of tokenq.shared import one another without a circle (function-level
imports counted too: a circle hidden inside a function is still one)."""

from __future__ import annotations

import ast
from pathlib import Path

import tokenq.shared

SHARED = Path(tokenq.shared.__file__).parent


def imports_of(path: Path) -> set[str]:
    found = set()
    for node in ast.walk(ast.parse(path.read_text())):
        if isinstance(node, ast.ImportFrom) and node.module:
            if node.module == "tokenq.shared":
                found |= {a.name for a in node.names}
            elif node.module.startswith("tokenq.shared."):
                found.add(node.module.split(".")[2])
            elif node.level == 1:
                found.add(node.module.split(".")[0])
        elif isinstance(node, ast.Import):
            found |= {a.name.split(".")[2] for a in node.names
                      if a.name.startswith("tokenq.shared.")}
    return found


def test_no_import_circle_in_shared() -> None:
    mods = {p.stem: imports_of(p) for p in SHARED.glob("*.py") if p.stem != "__init__"}
    graph = {m: {d for d in deps if d in mods and d != m} for m, deps in mods.items()}
    state: dict[str, int] = {}

    def visit(m: str, trail: list[str]) -> None:
        state[m] = 1
        for d in sorted(graph[m]):
            assert state.get(d) != 1, " -> ".join([*trail, m, d])
            if d not in state:
                visit(d, [*trail, m])
        state[m] = 2

    for m in sorted(graph):
        if m not in state:
            visit(m, [])


def test_the_parsers_are_a_leaf() -> None:
    assert imports_of(SHARED / "parsing.py") == set()

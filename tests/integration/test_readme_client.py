"""The README's client example runs as written (against the test stack's URL)."""

from __future__ import annotations

import contextlib
import io
import re
from pathlib import Path

from tokenq.cli.stack import Stack

README = Path(__file__).resolve().parents[2] / "README.md"


def test_readme_client_example_runs(stack: Stack) -> None:
    section = README.read_text().split("## The Python client", 1)[1]
    code = re.search(r"```python\n(.*?)```", section, re.S)
    assert code is not None
    src = code.group(1).replace("http://127.0.0.1:8000", stack.url)
    out = io.StringIO()
    with contextlib.redirect_stdout(out):
        exec(compile(src, "README.md", "exec"), {})
    printed = out.getvalue()
    assert "completion_tokens=" in printed and len(printed.split("\n", 1)[0]) > 0

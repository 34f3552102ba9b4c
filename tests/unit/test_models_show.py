"""`tokenq models show` prints what the API gave: a key without the admin role gets
OpenAI's model object (no state, version or workers), which once printed as
`version None  None  None  workers: 0` beside a live worker."""

from __future__ import annotations

import pytest

from tokenq.cli.models_cmds import _print


def test_show_with_a_plain_key_prints_no_none(capsys: pytest.CaptureFixture[str]) -> None:
    _print({"id": "smol", "object": "model", "created": 0, "owned_by": "tokenq",
            "root": "smol", "parent": None, "max_model_len": 16384}, as_json=False)
    out = capsys.readouterr().out
    assert "None" not in out and "max_model_len 16384" in out and "admin key" in out


def test_show_with_an_admin_key_prints_the_catalogue(capsys: pytest.CaptureFixture[str]) -> None:
    _print({"id": "smol", "version": 2, "state": "ready", "backend": "llama",
            "workers": ["w1"]}, as_json=False)
    assert capsys.readouterr().out.split() == [
        "smol", "version", "2", "ready", "llama", "workers:", "1"]

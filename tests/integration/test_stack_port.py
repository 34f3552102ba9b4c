"""A stack started without a port picks one, and picks another when a different process
binds the picked one before the API does (a fresh-clone run once failed at a fixture's
setup with "address already in use")."""

from __future__ import annotations

import json
import socket
from pathlib import Path

import httpx
import pytest

from tokenq.cli import stack as stack_mod
from tokenq.cli.stack import Stack
from tokenq.shared.redis_server import free_port
from tokenq.shared.settings import Settings


def fake_settings(tmp: Path) -> Settings:
    (tmp / "models.json").write_text(json.dumps({"fake": {"backend": "fake", "n_parallel": 2}}))
    return Settings(redis_url=None, state_dir=tmp, models_file=tmp / "models.json")


def test_the_api_moves_off_a_picked_port_another_process_took(
        tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    settings = fake_settings(tmp_path)
    with socket.socket() as squatter:  # takes the port the stack will pick first
        squatter.bind(("127.0.0.1", 0))
        squatter.listen()
        taken = squatter.getsockname()[1]
        picks = iter([taken])
        monkeypatch.setattr(stack_mod, "free_port", lambda: next(picks, None) or free_port())
        st = Stack(settings, workers=0, models=["fake"], quiet=True)
        st.start_parts()
        try:
            st.wait_ready(models=[], timeout=60)
            assert st.port != taken
            assert httpx.get(f"{st.url}/health", timeout=5).status_code == 200
        finally:
            st.stop()


def test_an_explicit_port_that_is_taken_fails_the_start(tmp_path: Path) -> None:
    """A port the operator chose is never swapped for another."""
    settings = fake_settings(tmp_path)
    with socket.socket() as squatter:
        squatter.bind(("127.0.0.1", 0))
        squatter.listen()
        taken = squatter.getsockname()[1]
        st = Stack(settings, port=taken, workers=0, models=["fake"], quiet=True)
        st.start_parts()
        try:
            # The API cannot bind it and exits. Waited for first: a probe of the port in
            # between reaches whatever listens there, which is not this stack's API.
            assert st.api is not None
            st.api.wait(timeout=60)
            with pytest.raises(RuntimeError, match="the API exited"):
                st.wait_ready(models=[], timeout=60)
            assert st.port == taken
        finally:
            st.stop()

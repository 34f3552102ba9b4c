"""What `tokenq up` serves when no --model is named."""

from __future__ import annotations

from pathlib import Path

import pytest

from tokenq.cli import stack
from tokenq.cli.stack import default_models
from tokenq.shared.settings import Settings


def test_served_models_are_what_up_serves(tmp_path: Path) -> None:
    s = Settings(state_dir=tmp_path, served_models=["smollm2-135m-instruct"])
    assert default_models(s) == ["smollm2-135m-instruct"]


def test_defaults_are_the_chat_and_the_embedding_model(tmp_path: Path,
                                                        monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(stack, "missing_weights", lambda _cfg, _dir: None)
    s = Settings(state_dir=tmp_path)
    assert default_models(s) == [s.default_model, s.default_embedding_model]


def test_the_embedding_default_is_left_out_without_its_weights(
        tmp_path: Path, monkeypatch: pytest.MonkeyPatch, caplog: pytest.LogCaptureFixture) -> None:
    s = Settings(state_dir=tmp_path)
    monkeypatch.setattr(stack, "missing_weights", lambda cfg, _dir: "pip install X"
                        if cfg.embedding else None)
    assert default_models(s) == [s.default_model]
    assert "pip install X" in caplog.text

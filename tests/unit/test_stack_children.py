"""The stack's children (API, workers) run the code of the tree the stack runs from.

`python -m` puts the working directory ahead of PYTHONPATH, so a bench started from one
checkout with PYTHONPATH set to another once ran the other tree's client against this
checkout's API and workers: an A/B of two trees that compared one tree with itself.
"""

from __future__ import annotations

import os
import subprocess
from pathlib import Path

import pytest

from tokenq.cli.stack import INSTALLED, ROOT, Stack, python_module
from tokenq.shared.settings import Settings


def impostor_tree(root: Path) -> Path:
    """A tree whose `tokenq.shared.keys` says it ran, and fails."""
    pkg = root / "shared"
    pkg.mkdir(parents=True)
    (pkg / "__init__.py").write_text("")
    (pkg / "keys.py").write_text("import sys\nprint('impostor')\nsys.exit(3)\n")
    return root


CODE_ROOT = str(ROOT)
checkout_only = pytest.mark.skipif(INSTALLED, reason="an installed copy sets no PYTHONPATH")


@checkout_only
@pytest.mark.parametrize("via", ["cwd", "pythonpath"])
def test_a_child_imports_this_tree_not_the_cwd_or_pythonpath(
        tmp_path: Path, monkeypatch: pytest.MonkeyPatch, via: str) -> None:
    other = impostor_tree(tmp_path / "other")
    if via == "pythonpath":
        monkeypatch.setenv("PYTHONPATH", str(other))
    else:
        monkeypatch.delenv("PYTHONPATH", raising=False)
    env = Stack(Settings(state_dir=tmp_path / "state"))._env()
    assert env["PYTHONPATH"].split(os.pathsep)[0] == CODE_ROOT
    run = subprocess.run(python_module("tokenq.shared.keys"), cwd=other, env=env,
                         capture_output=True, text=True, timeout=60)
    assert (run.returncode, "impostor" in run.stdout) == (0, False), run.stdout + run.stderr


@checkout_only
def test_pythonpath_keeps_what_was_there_after_this_tree(
        monkeypatch: pytest.MonkeyPatch, tmp_path: Path) -> None:
    monkeypatch.setenv("PYTHONPATH", os.pathsep.join(["/x", CODE_ROOT, "/y"]))
    env = Stack(Settings(state_dir=tmp_path))._env()
    assert env["PYTHONPATH"] == os.pathsep.join([CODE_ROOT, "/x", "/y"])


def test_a_bench_queue_starts_empty_and_is_removed(tmp_path: Path) -> None:
    """A bench's stack (`scratch_redis`) never runs jobs left in the state dir's Redis: a
    killed `bench mixed --vllm` left its batch queued there, and the next run's "idle"
    phase ran beside it (TTFT 11 s instead of well under 1 s)."""
    import redis

    from tokenq.shared.redis_server import EmbeddedRedis

    left = EmbeddedRedis(tmp_path / "redis").start()
    try:
        redis.Redis.from_url(left.url).rpush("queue", "a job left by a killed run")
    finally:
        left.stop()
    settings = Settings(redis_url="redis://127.0.0.1:1/0", state_dir=tmp_path)
    st = Stack(settings, scratch_redis=True)
    st.start_redis()
    try:
        assert st.redis is not None and st.redis.data_dir.parent == tmp_path
        assert redis.Redis.from_url(st.redis_url).llen("queue") == 0
    finally:
        st.stop()
    assert not st.redis.data_dir.exists()
    user = Stack(Settings(redis_url=None, state_dir=tmp_path))
    user.start_redis()  # `tokenq up`: the state dir's own, with what it holds
    try:
        assert redis.Redis.from_url(user.redis_url).llen("queue") == 1
    finally:
        user.stop()

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

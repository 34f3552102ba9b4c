"""tokenq as a user installs it: a wheel whose top level is `tokenq/` alone, installed into a
fresh venv outside the checkout, that runs `tokenq up` and streams a job with the CLI.

The venv gets the wheel itself (no deps) and reaches its dependencies in this test run's
own environment through a path entry (no .pth of that environment is processed, so the
checkout's editable install is not seen there): what is under test is the wheel's own
content, from a folder where no `api/` or `tokenq/` of the checkout is importable.
"""

from __future__ import annotations

import os
import shutil
import signal
import subprocess
import sys
import sysconfig
import zipfile
from collections.abc import Iterator
from pathlib import Path

import pytest

from tokenq.cli.bench.peers import wait_http
from tokenq.shared.redis_server import free_port

pytestmark = pytest.mark.slow
ROOT = Path(__file__).resolve().parents[2]


@pytest.fixture(scope="module")
def wheel(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """Built from a copy of the tracked files (symlinks kept): an in-tree build/ left by
    an earlier build would carry modules that no longer exist into the wheel."""
    src, out = tmp_path_factory.mktemp("src"), tmp_path_factory.mktemp("dist")
    tracked = subprocess.run(["git", "ls-files", "-z"], cwd=ROOT, capture_output=True,
                             check=True).stdout.decode().split("\0")
    for name in filter(None, tracked):
        path, dest = ROOT / name, src / name
        dest.parent.mkdir(parents=True, exist_ok=True)
        if path.is_symlink():
            os.symlink(os.readlink(path), dest)
        elif path.is_file():
            shutil.copy2(path, dest)
    subprocess.run([sys.executable, "-m", "pip", "wheel", "--no-deps", "--no-build-isolation",
                    "-q", "-w", str(out), str(src)], check=True, timeout=300)
    (whl,) = out.glob("tokenq-*.whl")
    return whl


def test_the_wheel_holds_tokenq_alone(wheel: Path) -> None:
    names = zipfile.ZipFile(wheel).namelist()
    top = {n.split("/")[0] for n in names if not n.split("/")[0].endswith(".dist-info")}
    assert top == {"tokenq"}, top
    # what `tokenq up`, the workers and the playground read at run time ships as data
    for data in ("tokenq/shared/lua/take.lua", "tokenq/api/static/playground.html",
                 "tokenq/shared/llamacpp_probe.py"):
        assert data in names, data
    meta = next(n for n in names if n.endswith(".dist-info/entry_points.txt"))
    entry_points = zipfile.ZipFile(wheel).read(meta).decode()
    assert "tokenq = tokenq.cli.main:app" in entry_points
    assert "vllm.general_plugins" not in entry_points  # never in a plain `vllm serve`


@pytest.fixture(scope="module")
def venv(wheel: Path, tmp_path_factory: pytest.TempPathFactory) -> Iterator[Path]:
    home = tmp_path_factory.mktemp("user")
    env_dir = home / "venv"
    subprocess.run([sys.executable, "-m", "venv", "--without-pip", str(env_dir)], check=True)
    py = env_dir / "bin" / "python"
    site = subprocess.run([str(py), "-c", "import sysconfig; print(sysconfig.get_path('purelib'))"],
                          capture_output=True, text=True, check=True).stdout.strip()
    subprocess.run([sys.executable, "-m", "pip", "install", "-q", "--no-deps", "--target", site,
                    str(wheel)], check=True, timeout=300)
    # the bin/tokenq script pip --target does not write: the same as a console script
    (env_dir / "bin" / "tokenq").write_text(
        f"#!{py}\nimport sys\nfrom tokenq.cli.main import app\nsys.exit(app())\n")
    (env_dir / "bin" / "tokenq").chmod(0o755)
    (Path(site) / "zz_deps.pth").write_text(sysconfig.get_path("purelib") + "\n")
    yield env_dir


def _env(home: Path) -> dict[str, str]:
    env = {k: v for k, v in os.environ.items()
           if not k.startswith(("TOKENQ_", "PYTHON", "VIRTUAL_ENV"))}
    env["TOKENQ_STATE_DIR"] = str(home / "state")
    return env


def test_no_generic_top_level_module_and_tokenq_from_the_wheel(venv: Path) -> None:
    py, cwd = str(venv / "bin" / "python"), venv.parent
    env = _env(venv.parent)
    for name in ("api", "cli", "shared", "workers"):
        done = subprocess.run([py, "-c", f"import {name}"], cwd=cwd, env=env,
                              capture_output=True, text=True)
        assert done.returncode != 0 and "ModuleNotFoundError" in done.stderr, name
    where = subprocess.run([py, "-c", "import tokenq.api.app as m; print(m.__file__)"],
                           cwd=cwd, env=env, capture_output=True, text=True, check=True)
    assert str(venv) in where.stdout and str(ROOT) not in where.stdout


def test_up_from_the_wheel_streams_a_job(venv: Path) -> None:
    port = free_port()
    env = _env(venv.parent)
    tokenq = str(venv / "bin" / "tokenq")
    log = (venv.parent / "up.log").open("w")
    proc = subprocess.Popen([tokenq, "up", "--port", str(port), "--workers", "1"],
                            cwd=venv.parent, env=env, stdout=log, stderr=subprocess.STDOUT,
                            start_new_session=True)
    try:
        url = f"http://127.0.0.1:{port}"
        try:
            wait_http(f"{url}/ready", proc, timeout=180)
        except (RuntimeError, TimeoutError) as exc:
            raise AssertionError((venv.parent / "up.log").read_text()[-3000:]) from exc
        done = subprocess.run(
            [tokenq, "jobs", "submit", "smollm2-135m-instruct", "Say hi.", "--chat",
             "--url", url, "--max-tokens", "8", "--temperature", "0", "--watch"],
            cwd=venv.parent, env=env, capture_output=True, text=True, timeout=180)
        assert done.returncode == 0, done.stdout + done.stderr
        assert done.stdout.strip(), done.stderr
    finally:
        os.killpg(proc.pid, signal.SIGTERM)
        try:
            proc.wait(60)
        except subprocess.TimeoutExpired:
            os.killpg(proc.pid, signal.SIGKILL)
        log.close()


def test_a_plain_vllm_process_imports_nothing_of_tokenq() -> None:
    """tokenq declares no vLLM plugin: vLLM finds its hook only in the processes tokenq's
    worker starts (tokenq.workers.engines.vllm_plugin.register)."""
    pytest.importorskip("vllm")
    code = ("import sys; from vllm.plugins import load_general_plugins; "
            "load_general_plugins(); "
            "print(sorted(m for m in sys.modules if m.split('.')[0] == 'tokenq'))")
    env = {k: v for k, v in os.environ.items() if not k.startswith("TOKENQ_")}
    done = subprocess.run([sys.executable, "-c", code], env=env, cwd="/", capture_output=True,
                          text=True, timeout=300, check=True)
    assert done.stdout.strip().splitlines()[-1] == "[]", done.stdout

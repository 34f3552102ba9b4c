"""`tokenq bench postcall`: the post-call batch, end to end, beside C++ llama-server.

N call transcripts (calls.py: made from a seed, 200-600 tokens each) with one system
prompt, one instruction and one JSON schema for the summary:
- tokenq: one OpenAI Batch API job (upload, create, poll to the end) on an embedded stack
  with one worker of the model (fresh Redis per run);
- llama-server: the same N requests to C++ llama-server (same GGUF, slots, threads and
  n_ctx; `cache_prompt` on, the same `response_format`) from a client keeping as many
  requests in flight as there are slots.
Each arm is warmed up first (one request per slot, not timed), as a serving deployment is.
Per arm: makespan, output tokens and tok/s, how many summaries parse and validate against
the schema, how many ran to max_tokens, and the tokens (prompt + output) processed a second
in the run's first and second half (`halves`: a cost that grows with the batch's length
shows as a slower second half). Runs alternate the arms; medians over runs.
"""

from __future__ import annotations

import json
import statistics
import tempfile
import time
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path
from typing import Any

import httpx
import jsonschema
from rich.console import Console
from rich.table import Table

from tokenq.cli.bench.calls import requests
from tokenq.cli.bench.peers import llama_server_args, llama_server_binary, peer_process
from tokenq.cli.stack import Stack
from tokenq.cli.transcripts import SUMMARY_SCHEMA
from tokenq.shared.redis_server import free_port
from tokenq.shared.settings import Settings
from tokenq.shared.weights import gguf_path


def judge(content: str | None, finish: str | None) -> tuple[bool, bool]:
    """(a valid summary, ran to max_tokens)."""
    try:
        jsonschema.validate(json.loads(content or ""), SUMMARY_SCHEMA)
        ok = True
    except (ValueError, jsonschema.ValidationError):
        ok = False
    return ok, finish == "length"


Span = tuple[float, float, int]  # a request's start, end (seconds) and tokens (prompt + output)


def halves(spans: list[Span]) -> tuple[float, float]:
    """Tokens a second over the first and the second half of a run (first start to last
    end), each request's tokens spread evenly over its span."""
    if not spans:
        return 0.0, 0.0
    t0, t1 = min(s for s, _, _ in spans), max(e for _, e, _ in spans)
    mid, half = (t0 + t1) / 2, max((t1 - t0) / 2, 1e-9)
    first = 0.0
    for s, e, n in spans:
        first += n * (max(0.0, min(e, mid) - s) / (e - s) if e > s else float(e <= mid))
    total = sum(n for _, _, n in spans)
    return round(first / half, 1), round((total - first) / half, 1)


def figures(makespan: float, outs: list[tuple[int, bool, bool]],
            spans: list[Span]) -> dict[str, Any]:
    tokens = sum(n for n, _, _ in outs)
    first, second = halves(spans)
    return {"makespan_s": round(makespan, 2), "output_tokens": tokens,
            "tok_s": round(tokens / makespan, 2) if makespan else 0.0,
            "valid": sum(1 for _, ok, _ in outs if ok),
            "at_max_tokens": sum(1 for _, _, length in outs if length), "n": len(outs),
            "first_half_tok_s": first, "second_half_tok_s": second}


def on_tokenq(settings: Settings, model: str, bodies: list[dict[str, Any]],
              slots: int, say: Console) -> dict[str, Any]:
    from openai import OpenAI

    with tempfile.TemporaryDirectory(prefix="tokenq-postcall-") as tmp:
        s = settings.model_copy(update={"redis_url": None, "state_dir": Path(tmp)})
        stack = Stack(s, models=[model], quiet=True).start()
        try:
            stack.wait_ready()
            client = OpenAI(base_url=f"{stack.url}/v1", api_key="tokenq", max_retries=2)
            with ThreadPoolExecutor(slots) as pool:  # warm-up, not timed
                list(pool.map(lambda b: client.chat.completions.create(**b),
                              bodies[:slots]))
            data = "".join(json.dumps({"custom_id": f"call-{i}", "method": "POST",
                                       "url": "/v1/chat/completions", "body": b}) + "\n"
                           for i, b in enumerate(bodies)).encode()
            t0 = time.monotonic()
            upload = client.files.create(file=("calls.jsonl", data), purpose="batch")
            batch = client.batches.create(input_file_id=upload.id, completion_window="24h",
                                          endpoint="/v1/chat/completions")
            while batch.status not in ("completed", "failed", "expired", "cancelled"):
                time.sleep(0.25)
                batch = client.batches.retrieve(batch.id)
            makespan = time.monotonic() - t0
            outs, job_ids = [], []
            if batch.output_file_id:
                for raw in client.files.content(batch.output_file_id).text.splitlines():
                    response = json.loads(raw)["response"]
                    body, choice = response["body"], response["body"]["choices"][0]
                    job_ids.append(response["request_id"])
                    outs.append((body["usage"]["completion_tokens"],
                                 *judge(choice["message"]["content"], choice["finish_reason"])))
            outs += [(0, False, False)] * (len(bodies) - len(outs))  # failed lines
            say.print(f"  tokenq: batch {batch.status} in {makespan:.1f}s")
            return figures(makespan, outs, job_spans(stack.url, job_ids))
        finally:
            stack.stop()


def job_spans(url: str, job_ids: list[str]) -> list[Span]:
    """Each line's lease to its end, from its job record (the worker's clock)."""
    spans = []
    with httpx.Client(base_url=url, timeout=30,
                      headers={"Authorization": "Bearer tokenq"}) as http:
        for job_id in job_ids:
            rec = http.get(f"/v1/jobs/{job_id}").raise_for_status().json()
            if rec.get("started_at") and rec.get("finished_at") and rec.get("usage"):
                spans.append((rec["started_at"], rec["finished_at"],
                              rec["usage"]["total_tokens"]))
    return spans


def on_llama_server(binary: str, settings: Settings, model: str,
                    bodies: list[dict[str, Any]], say: Console) -> dict[str, Any]:
    cfg = settings.models()[model]
    port = free_port()
    args = llama_server_args(binary, cfg, str(gguf_path(cfg, settings.state_dir)), port,
                             model)
    logs = settings.state_dir / "logs"
    logs.mkdir(parents=True, exist_ok=True)
    url = f"http://127.0.0.1:{port}"
    with peer_process(args, f"{url}/health", logs / "llama_server_postcall.log"), \
            httpx.Client(base_url=url, timeout=600) as http:

        def one(body: dict[str, Any]) -> tuple[tuple[int, bool, bool], Span]:
            start = time.monotonic()
            resp = http.post("/v1/chat/completions", json={**body, "cache_prompt": True})
            resp.raise_for_status()
            out = resp.json()
            choice = out["choices"][0]
            return ((out["usage"]["completion_tokens"],
                     *judge(choice["message"]["content"], choice["finish_reason"])),
                    (start, time.monotonic(), out["usage"]["total_tokens"]))

        with ThreadPoolExecutor(cfg.n_parallel) as pool:
            list(pool.map(one, bodies[:cfg.n_parallel]))  # warm-up, not timed
            t0 = time.monotonic()
            done = list(pool.map(one, bodies))
            makespan = time.monotonic() - t0
    say.print(f"  llama-server: {len(done)} requests in {makespan:.1f}s")
    return figures(makespan, [o for o, _ in done], [sp for _, sp in done])


def run_postcall(settings: Settings, model: str, calls: int, max_tokens: int, seed: int,
                 runs: int, peers: bool, say: Console) -> dict[str, Any]:
    cfg = settings.models()[model]
    bodies = requests(calls, seed, model, max_tokens)
    binary = llama_server_binary(say) if peers else None
    arms: dict[str, list[dict[str, Any]]] = {"tokenq": [], "llama-server": []}
    for i in range(runs):
        say.print(f"[bold]run {i + 1}/{runs}[/]: {calls} calls, {cfg.n_parallel} slots, "
                  f"max_tokens {max_tokens}")
        order = ["tokenq", "llama-server"] if i % 2 == 0 else ["llama-server", "tokenq"]
        for arm in order:
            if arm == "tokenq":
                arms[arm].append(on_tokenq(settings, model, bodies, cfg.n_parallel, say))
            elif binary is not None:
                arms[arm].append(on_llama_server(binary, settings, model, bodies, say))
    result: dict[str, Any] = {"model": model, "calls": calls, "max_tokens": max_tokens,
                              "slots": cfg.n_parallel, "seed": seed, "runs": arms}
    med = {arm: {k: statistics.median(r[k] for r in rs) for k in rs[0]}
           for arm, rs in arms.items() if rs}
    result["median"] = med
    if "llama-server" in med:
        t, p = med["tokenq"], med["llama-server"]
        result["ratio"] = {
            "makespan": round(p["makespan_s"] / t["makespan_s"], 3),  # >1: tokenq faster
            "tok_s": round(t["tok_s"] / p["tok_s"], 3) if p["tok_s"] else None,
            "valid": f"{t['valid']:g} vs {p['valid']:g} of {calls}"}
    say.print(table(arms))
    if "ratio" in result:
        say.print(f"tokenq vs llama-server (medians): makespan {result['ratio']['makespan']}x "
                  f"faster, output tok/s {result['ratio']['tok_s']}x, valid summaries "
                  f"{result['ratio']['valid']}")
    return result


def table(arms: dict[str, list[dict[str, Any]]]) -> Table:
    t = Table(title="post-call batch")
    for col in ("arm", "run", "makespan s", "output tok", "tok/s", "valid", "at max_tokens",
                "in+out tok/s, halves"):
        t.add_column(col)
    for arm, rs in arms.items():
        for i, r in enumerate(rs):
            t.add_row(arm, str(i + 1), f"{r['makespan_s']:.1f}", str(r["output_tokens"]),
                      f"{r['tok_s']:.1f}", f"{r['valid']}/{r['n']}", str(r["at_max_tokens"]),
                      f"{r['first_half_tok_s']:.1f} / {r['second_half_tok_s']:.1f}")
    return t

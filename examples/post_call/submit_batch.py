"""Post-call summaries as an OpenAI batch: runs unchanged against tokenq or api.openai.com.

    python examples/post_call/submit_batch.py --base-url http://127.0.0.1:8000/v1

Reads transcripts/*.txt, writes one JSONL line per call (chat completion with
a json_schema response_format), uploads it, creates the batch, shows a progress
bar while it runs, then prints each call's structured summary.
"""

from __future__ import annotations

import argparse
import json
import sys
import time
from pathlib import Path

from openai import OpenAI
from rich.console import Console
from rich.progress import BarColumn, MofNCompleteColumn, Progress, TimeElapsedColumn

HERE = Path(__file__).parent
SCHEMA = json.loads((HERE / "summary_schema.json").read_text())
SYSTEM = "You are a helpful assistant that writes call summaries."
INSTRUCTION = ("Summarise the call as JSON with: issue (the customer's problem), actions "
               "(what the agent did), outcome, follow_up (what happens next) and sentiment.")


def request_line(custom_id: str, transcript: str, model: str, max_tokens: int) -> dict[str, object]:
    return {"custom_id": custom_id, "method": "POST", "url": "/v1/chat/completions", "body": {
        "model": model, "max_tokens": max_tokens, "temperature": 0,
        "messages": [{"role": "system", "content": SYSTEM},
                     {"role": "user", "content": "Here is a customer service call transcript:"
                      f"\n\n{transcript}\n{INSTRUCTION}"}],
        "response_format": {"type": "json_schema",
                            "json_schema": {"name": "call_summary", "schema": SCHEMA}}}}


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--base-url", default="http://127.0.0.1:8000/v1")
    ap.add_argument("--api-key", default="tokenq")
    ap.add_argument("--model", default="smollm2-135m-instruct")
    ap.add_argument("--max-tokens", type=int, default=256)
    ap.add_argument("--copies", type=int, default=1, help="repeat each transcript N times")
    args = ap.parse_args()
    console = Console()
    client = OpenAI(base_url=args.base_url, api_key=args.api_key)

    calls = sorted((HERE / "transcripts").glob("*.txt"))
    lines = [request_line(f"{p.stem}#{i}", p.read_text(), args.model, args.max_tokens)
             for i in range(args.copies) for p in calls]
    data = "".join(json.dumps(x, ensure_ascii=False) + "\n" for x in lines).encode()
    upload = client.files.create(file=("post_call.jsonl", data), purpose="batch")
    batch = client.batches.create(input_file_id=upload.id, endpoint="/v1/chat/completions",
                                  completion_window="24h", metadata={"use_case": "post-call"})
    console.print(f"batch [bold]{batch.id}[/]: {len(lines)} calls")
    t0 = time.monotonic()
    with Progress("[progress.description]{task.description}", BarColumn(),
                  MofNCompleteColumn(), TimeElapsedColumn(), console=console) as bar:
        task = bar.add_task("validating", total=len(lines))
        while batch.status not in ("completed", "failed", "expired", "cancelled"):
            time.sleep(1)
            batch = client.batches.retrieve(batch.id)
            counts = batch.request_counts
            done = (counts.completed + counts.failed) if counts else 0
            bar.update(task, completed=done, description=batch.status)
    console.print(f"{batch.status} in {time.monotonic() - t0:.1f}s: {batch.request_counts}")
    if batch.status == "failed" and batch.errors:
        for err in batch.errors.data or []:
            console.print(f"  line {err.line}: {err.code}: {err.message}")
        return 1
    if batch.output_file_id:
        for raw in client.files.content(batch.output_file_id).text.splitlines():
            line = json.loads(raw)
            body = line["response"]["body"]
            content = body["choices"][0]["message"]["content"]
            try:
                summary: object = json.loads(content)
            except json.JSONDecodeError:
                summary = {"unparsed": content,
                           "finish_reason": body["choices"][0]["finish_reason"]}
            console.rule(line["custom_id"])
            console.print_json(data=summary)
    if batch.error_file_id:
        console.print(client.files.content(batch.error_file_id).text)
    return 0 if batch.status == "completed" else 1


if __name__ == "__main__":
    sys.exit(main())

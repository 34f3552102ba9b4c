"""`tokenq demo`: the main job on the embedded default, streamed to the terminal."""

from __future__ import annotations

import json
import time

import httpx
from rich.console import Console

from tokenq.cli.stack import Stack
from tokenq.cli.transcripts import RESPONSE_FORMAT, TRANSCRIPTS, summary_messages
from tokenq.client.sse import stream_events
from tokenq.shared.settings import Settings


def run_demo(settings: Settings, port: int, transcript: str, max_tokens: int) -> int:
    console = Console()
    stack = Stack(settings, port=port, workers=1, quiet=True)
    console.print("[bold]tokenq demo[/]: starting Redis, the API and one CPU worker "
                  f"({settings.default_model}) ...")
    t0 = time.monotonic()
    stack.start()
    try:
        stack.wait_ready()
        console.print(f"ready in {time.monotonic() - t0:.1f}s at {stack.url} "
                      f"(logs: {settings.state_dir / 'logs'})\n")
        console.print("[bold]Transcript[/]\n" + TRANSCRIPTS[transcript])
        with httpx.Client(base_url=stack.url, timeout=30) as client:
            body = {"model": settings.default_model,
                    "messages": summary_messages(TRANSCRIPTS[transcript]),
                    "max_tokens": max_tokens, "temperature": 0.0,
                    "response_format": RESPONSE_FORMAT,
                    "metadata": {"use_case": "post-call-summary"}}
            sent = time.monotonic()
            resp = client.post("/v1/jobs", json=body)
            resp.raise_for_status()
            job = resp.json()
            console.print(f"[dim]POST /v1/jobs -> 202 {job['id']}[/]")
            console.print("[bold]Summary[/] (streamed over SSE)")
            first = None
            text: list[str] = []
            for ev in stream_events(client, job["id"]):
                if ev.event == "token":
                    first = first or time.monotonic()
                    text.append(ev.data["text"])
                    console.print(ev.data["text"], end="", markup=False, highlight=False)
                elif ev.event == "done":
                    u = ev.data["usage"]
                    end = time.monotonic()
                    decode = max(1e-6, end - (first or end))
                    console.print(
                        f"\n\n[dim]done: finish_reason={ev.data['finish_reason']} "
                        f"prompt={u['prompt_tokens']} completion={u['completion_tokens']} "
                        f"TTFT={((first or end) - sent) * 1000:.0f} ms "
                        f"decode={max(0, u['completion_tokens'] - 1) / decode:.1f} tok/s[/]")
                elif ev.event in ("error", "cancelled"):
                    console.print(f"\n[red]{ev.event}: {ev.data}[/]")
                    return 1
        try:  # decoding was constrained to the schema: a finished summary always parses
            console.print_json(data=json.loads("".join(text)))
        except json.JSONDecodeError:
            console.print("[yellow](the summary hit max_tokens before the JSON closed)[/]")
        console.print("[dim](SmolLM2-135M is tiny: expect a rough summary; point the "
                      "registry at a bigger GGUF for real use)[/]")
        return 0
    finally:
        console.print("stopping the stack ...")
        stack.stop()

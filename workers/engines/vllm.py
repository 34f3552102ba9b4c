"""vLLM engine: one AsyncLLM (v1) on its own event loop thread; vLLM does the batching.

This module runs the loop; what it hands vLLM (engine arguments, sampling parameters, stat
logger) is built in vllm_args.py. Celery task threads call submit/cancel; both
hop onto the loop with call_soon_threadsafe. Each job is one asyncio task
iterating `AsyncLLM.generate()` with `RequestOutputKind.DELTA`; cancel cancels
that task, and generate() aborts the request in the engine on its way out.

Per-token semantics match the llama.cpp engine exactly (one TokenDelta per
generated token, indices from 0 without gaps, stop strings never leak, a
takeover resumes from `resume_token_ids`): the prompt is tokenized here and sent
as token ids (prompt + resumed tokens), and stop strings run through the same
TextStream as llama.cpp's instead of vLLM's, whose stop buffer releases held
text on a later token. Each step's text delta is attributed to the step's last
token id. The deltas of every job woken by one engine step are flushed to the
sink as one StepOutput (one Redis pipeline per step).

LoRA (enable_lora): each job with an adapter carries a LoRARequest whose
lora_int_id is the registry's version id (unique across names and versions, so a
new version is never served from vLLM's cache of an old one). Adapters are added
with AsyncLLM.add_lora when the registry loads them and removed with remove_lora
once unloaded and no job in flight uses them; vLLM batches jobs of different
adapters together (up to max_loras per batch).

Engine death (EngineDeadError, or the engine core process gone) emits nothing
for the jobs in flight: healthy() turns False and the worker hands them back
for another attempt (workers/tasks.py), which continues their streams.
"""

from __future__ import annotations

import asyncio
import json
import logging
import os
import threading
from concurrent.futures import Future
from pathlib import Path
from typing import Any

from tokenq.shared.chat import render_chat
from tokenq.shared.lora_registry import AdapterRef
from tokenq.shared.settings import ModelConfig, get_settings
from tokenq.shared.weights import has_nvidia_gpu
from tokenq.workers.engines.base import (
    EndReason,
    EngineRequest,
    EngineStats,
    Finished,
    Sink,
    StepOutput,
    TokenDelta,
)
from tokenq.workers.engines.detok import Released, TextStream
from tokenq.workers.engines.vllm_amx import keep_amx_out_if_it_faults
from tokenq.workers.engines.vllm_args import (
    SchedulerNumbers,
    engine_args,
    engine_env,
    logprob_entry,
    request_priority,
    sampling_params,
    stat_logger,
    stop_grace_s,
)
from tokenq.workers.engines.vllm_plugin import register as register_hook

log = logging.getLogger(__name__)

class VllmEngine:
    backend = "vllm"

    def __init__(self, cfg: ModelConfig, model_dir: Path):
        self.cfg = cfg
        self.model_dir = model_dir
        self.slots = cfg.max_num_seqs
        self._loop = asyncio.new_event_loop()
        self._thread: threading.Thread | None = None
        self._tasks: dict[str, asyncio.Task[None]] = {}
        self._pending = StepOutput()
        self._flush_scheduled = False
        self._dead = False
        self._stats = SchedulerNumbers()
        self._sink: Sink | None = None
        self.llm: Any = None
        self.extra_args: dict[str, Any] = {}  # more engine args (the embedding runner's)
        self.max_model_len = cfg.max_model_len or 0  # the engine's own value once started
        self._lora_users: dict[int, int] = {}  # version id -> jobs in flight using it
        self._lora_wanted: set[int] = set()  # versions the registry serves

    # -- public interface (any thread) -------------------------------------------------
    def start(self, sink: Sink) -> None:
        self._sink = sink
        for k, v in engine_env().items():
            os.environ.setdefault(k, v)
        state_dir = get_settings().state_dir
        register_hook(state_dir)  # before vLLM looks for its plugins
        if not has_nvidia_gpu():
            keep_amx_out_if_it_faults(state_dir)
        from transformers import AutoTokenizer

        self.tokenizer = AutoTokenizer.from_pretrained(str(self.model_dir))
        self.chat_template = self.cfg.chat_template or self.tokenizer.chat_template
        self.bos_text = self.tokenizer.bos_token or ""
        self.eos_text = self.tokenizer.eos_token or ""
        self._thread = threading.Thread(target=self._loop.run_forever, name="vllm-engine",
                                        daemon=True)
        self._thread.start()
        # Built on the loop so AsyncLLM starts its output handler there.
        self._call(self._build()).result()
        self.max_model_len = int(self.llm.model_config.max_model_len)
        log.info("vLLM engine up: %s, max_model_len %d, max_num_seqs %d", self.model_dir,
                 self.max_model_len, self.slots)

    def submit(self, request: EngineRequest) -> None:
        self._loop.call_soon_threadsafe(self._spawn, request)

    def cancel(self, job_id: str) -> None:
        def _cancel() -> None:
            task = self._tasks.get(job_id)
            if task is not None:
                task.cancel()

        self._loop.call_soon_threadsafe(_cancel)

    def load_adapter(self, ref: AdapterRef) -> int | None:
        if not self.cfg.enable_lora:
            raise RuntimeError("this model's vLLM engine runs without LoRA: set enable_lora "
                               "(and max_lora_rank) in its model config")
        config = Path(ref.path) / "adapter_config.json"
        if not config.is_file():
            raise FileNotFoundError(f"{ref.path} is not a PEFT adapter folder "
                                    "(no adapter_config.json)")
        rank = int(json.loads(config.read_text()).get("r", 0)) or None
        if rank is not None and rank > self.cfg.max_lora_rank:
            raise ValueError(f"adapter rank {rank} is over this engine's max_lora_rank "
                             f"{self.cfg.max_lora_rank}")
        self._call(self._add_lora(ref)).result(timeout=120)
        return rank

    def unload_adapter(self, ref: AdapterRef) -> None:
        def _unwant() -> None:
            self._lora_wanted.discard(ref.id)
            self._maybe_remove(ref.id)

        self._loop.call_soon_threadsafe(_unwant)

    def stats(self) -> EngineStats:
        s = self._stats
        # vLLM's own count of the requests it holds: a job whose abort was lost shows here.
        return EngineStats(running=self.in_flight(), waiting=s.waiting, slots=self.slots,
                           kv_cache_usage=s.kv_cache_usage,
                           prefix_hit_ratio=s.prefix_hits / max(1, s.prefix_queries))

    def in_flight(self) -> int:
        """Requests the engine itself still holds (0 once every job has ended or aborted)."""
        if self.llm is None or self._dead:
            return 0
        return int(self.llm.get_num_unfinished_requests())

    def healthy(self) -> bool:
        if self._dead or self._thread is None or not self._thread.is_alive():
            return False
        if self.llm is not None and self.llm.errored:
            self._dead = True
            log.error("vLLM engine is dead: %s", self.llm.dead_error)
        return not self._dead

    def close(self) -> None:
        if self._thread is None:
            return
        if self.llm is not None:
            try:
                self._call(self._shutdown()).result(timeout=30)
            except Exception:
                log.exception("vLLM shutdown failed")
        self._loop.call_soon_threadsafe(self._loop.stop)
        self._thread.join(timeout=10)
        self._thread = None

    # -- loop thread -------------------------------------------------------------------
    def _call(self, coro: Any) -> Future[Any]:
        return asyncio.run_coroutine_threadsafe(coro, self._loop)

    async def _build(self) -> None:
        from vllm.v1.engine.async_llm import AsyncLLM

        args = engine_args(self.cfg, self.model_dir, self.extra_args)
        self.llm = AsyncLLM.from_engine_args(args, stat_loggers=[stat_logger(self._stats)])

    async def _shutdown(self) -> None:
        for task in list(self._tasks.values()):
            task.cancel()
        if self._tasks:
            await asyncio.wait(list(self._tasks.values()), timeout=5)
        llm, self.llm = self.llm, None
        # here, not in AsyncLLM.__del__ at interpreter exit (too late)
        llm.shutdown(timeout=stop_grace_s())

    @staticmethod
    def _lora_request(ref: AdapterRef) -> Any:
        from vllm.lora.request import LoRARequest

        return LoRARequest(lora_name=ref.name, lora_int_id=ref.id, lora_path=ref.path)

    async def _add_lora(self, ref: AdapterRef) -> None:
        if not await self.llm.add_lora(self._lora_request(ref)):
            raise RuntimeError(f"vLLM could not load the adapter at {ref.path}")
        self._lora_wanted.add(ref.id)

    def _maybe_remove(self, vid: int) -> None:
        """Free a version neither the registry nor a job in flight uses (vLLM would keep it
        in its LRU cache otherwise, holding memory and a max_cpu_loras slot)."""
        if vid in self._lora_wanted or self._lora_users.get(vid, 0) > 0 or self.llm is None:
            return
        self._lora_users.pop(vid, None)
        self._loop.create_task(self.llm.remove_lora(vid))

    def _spawn(self, req: EngineRequest) -> None:
        self._tasks[req.job_id] = self._loop.create_task(self._run(req))

    def _emit(self, tokens: list[TokenDelta], finished: Finished | None = None) -> None:
        """Queue output; every job woken by the same engine step lands in one flush."""
        self._pending.tokens.extend(tokens)
        if finished is not None:
            self._pending.finished.append(finished)
        if not self._flush_scheduled:
            self._flush_scheduled = True
            self._loop.call_soon(self._flush)

    def _flush(self) -> None:
        out, self._pending, self._flush_scheduled = self._pending, StepOutput(), False
        if out and self._sink is not None:
            self._sink(out)

    def _prompt_ids(self, req: EngineRequest) -> list[int]:
        if req.messages is None:
            text = req.prompt or ""
        else:
            text = render_chat(self.chat_template, req.messages, self.bos_text, self.eos_text,
                               req.tools)
        # A template that writes the BOS text itself must not get a second BOS.
        special = not (self.bos_text and text.startswith(self.bos_text))
        return list(self.tokenizer.encode(text, add_special_tokens=special))

    async def _run(self, req: EngineRequest) -> None:
        from vllm.inputs import TokensPrompt
        from vllm.v1.engine.exceptions import EngineDeadError

        job, attempt = req.job_id, req.attempt
        resumed = len(req.resume_token_ids)
        n_prompt, emitted = 0, resumed
        stream = TextStream(req.params.stop, next_index=resumed)
        lora_counted = False

        lps: dict[int, dict[str, Any]] = {}  # token index -> logprobs entry, when asked

        def deltas(released: list[Released]) -> list[TokenDelta]:
            return [TokenDelta(job, attempt, r.index, r.text, r.token_id, lps.pop(r.index, None))
                    for r in released]

        def end(reason: EndReason, code: str | None = None, msg: str | None = None) -> None:
            self._emit([], Finished(job, attempt, reason, n_prompt, emitted, code, msg))

        try:
            prompt = self._prompt_ids(req)
            n_prompt = len(prompt)
            ids = prompt + req.resume_token_ids
            if len(ids) + 1 > self.max_model_len:
                if resumed:  # a takeover at the context's end just ends the job
                    return end("length")
                return end("error", "context_length_exceeded",
                           f"prompt has {n_prompt} tokens; this worker's context is "
                           f"{self.max_model_len}")
            # At most what is left of the job's budget and of the context: a job that
            # reaches the context's end finishes with "length", as on llama.cpp.
            budget = min(req.params.max_tokens - resumed, self.max_model_len - len(ids))
            if budget <= 0:
                return end("length")
            if req.adapter is not None:
                self._lora_users[req.adapter.id] = self._lora_users.get(req.adapter.id, 0) + 1
                lora_counted = True
            gen = self.llm.generate(TokensPrompt(prompt_token_ids=ids),
                                    sampling_params(req.params, budget),
                                    request_id=f"{job}:{attempt}",
                                    priority=request_priority(req.urgent, req.background),
                                    lora_request=(self._lora_request(req.adapter)
                                                  if req.adapter is not None else None))
            try:
                async for out in gen:
                    c = out.outputs[0]
                    new = list(c.token_ids)
                    # An EOS / stop token is not a token of the output (as in llama.cpp).
                    if c.finish_reason == "stop" and not isinstance(c.stop_reason, str) and new:
                        new.pop()
                    if req.params.logprobs is not None and c.logprobs:
                        for i, tok in enumerate(new):
                            lps[stream.next_index + i] = logprob_entry(tok, c.logprobs[i],
                                                                       req.params.logprobs)
                    released: list[Released] = []
                    for i, tok in enumerate(new):
                        piece = c.text if i == len(new) - 1 else ""
                        released += stream.push(tok, piece.encode())
                        if stream.stopped:
                            break
                    if stream.stopped or c.finish_reason is not None:
                        released += [] if stream.stopped else stream.finish()
                        emitted += len(released)
                        self._emit(deltas(released))
                        reason: EndReason = ("length" if c.finish_reason == "length"
                                             and not stream.stopped else "stop")
                        return end(reason)
                    emitted += len(released)
                    self._emit(deltas(released))
            finally:
                await gen.aclose()  # a stop string ended it early: abort it in the engine
        except asyncio.CancelledError:
            # Our own cancel (or close): the engine request was aborted by generate().
            return end("cancelled")
        except EngineDeadError:
            self._dead = True
            log.error("job %s: the vLLM engine died; the worker hands the job back", job)
        except Exception as exc:
            if self.llm is not None and self.llm.errored:
                self._dead = True
                log.exception("job %s: the vLLM engine failed", job)
                return None
            log.exception("job %s: vLLM rejected or failed the request", job)
            return end("error", "bad_request" if emitted == resumed else "engine_error",
                       f"{type(exc).__name__}: {exc}")
        finally:
            self._tasks.pop(job, None)
            if lora_counted and req.adapter is not None:
                self._lora_users[req.adapter.id] -= 1
                self._maybe_remove(req.adapter.id)
        return None


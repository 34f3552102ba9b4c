"""llama.cpp engine: continuous batching over one llama_batch, one sequence id per job.

The only engine module that imports llama_cpp, with its helpers: shared/vocab.py (backend
start-up, tokenizer; the API uses it too), llamacpp_sampling.py, llamacpp_lora.py
(adapters), llamacpp_slots.py (slots and their cached prefixes; llamacpp_ramcache.py
keeps them in host memory once their slot is reused), llamacpp_seq.py (a
job's sequence; a request's n choices sharing one prefill), llamacpp_context.py (the
context and batch) and llamacpp_inbox.py (messages from other threads).
One context with n_seq_max = slots (each sequence gets n_ctx / slots cells, as in
llama-server). Every step:
1. take new jobs and cancels from the inbox (a job joins at the next step) and
   give each a free slot (llamacpp_slots.py: the lowest, or a long cached prefix);
2. build one batch, rows in slot order: the next token of every decoding job, then
   prompts: short ones (`prefill_whole_tokens`) whole, all whole while as many jobs
   wait for their first token as decode, else chunks that keep the step within
   `prefill_itl_ratio` times a decode-only step (chunked prefill, budget.py); batch
   (low-priority) prompts only in chunks of at most that or `batch_prefill_tokens`, and
   batch streams sit out a step that takes another job's whole prompt (a job sits out
   steps after its grammar needed whole-vocabulary passes: llamacpp_seq.py);
3. llama_decode once (an interactive job may stop it under way: StepAbort); sample each
   sequence from its own row with its own sampler chain (JSON-schema grammar,
   penalties, top-k, top-p, temperature, seeded dist);
4. hand the sink one StepOutput; a finished job's slot keeps its KV cells
   for the next job with the same prefix.

LoRA adapters apply per context, so each step runs one adapter group (the jobs
with the same adapter version, or none) and groups take turns between steps;
see llamacpp_lora.py. Cached prefixes are reused only within the same version.
"""

from __future__ import annotations

import logging
import threading
import time
from concurrent.futures import Future
from pathlib import Path

import llama_cpp as ll

from tokenq.shared.lora_registry import AdapterRef
from tokenq.shared.schemas import SamplingParams
from tokenq.shared.settings import ModelConfig
from tokenq.shared.vocab import Vocab
from tokenq.workers.engines.base import (
    EndReason,
    EngineRequest,
    EngineStats,
    Finished,
    Sink,
    StepOutput,
    TokenDelta,
)
from tokenq.workers.engines.budget import PrefillBudget, Want
from tokenq.workers.engines.detok import Released, TextStream
from tokenq.workers.engines.llamacpp_context import StepAbort, create_context, fill, threads_of
from tokenq.workers.engines.llamacpp_inbox import Inbox
from tokenq.workers.engines.llamacpp_lora import LoraSet, pick_group
from tokenq.workers.engines.llamacpp_ramcache import RamCache
from tokenq.workers.engines.llamacpp_sampling import (
    Sampler,
    StepSampler,
    check_grammar,
    grammar_busy,
    row_logprobs,
)
from tokenq.workers.engines.llamacpp_seq import (
    Seq,
    awake,
    fork,
    rest_after_slow,
    share_prefill,
    undo,
)
from tokenq.workers.engines.llamacpp_slots import SlotPool, warm_slots

__all__ = ["LlamaCppEngine", "Vocab"]

log = logging.getLogger(__name__)


class LlamaCppEngine:
    backend = "llama"

    def __init__(self, cfg: ModelConfig, model_path: Path):
        self.cfg = cfg
        self.model_path = model_path
        self.slots = cfg.n_parallel
        self.n_ctx_seq = cfg.n_ctx // cfg.n_parallel
        self.max_model_len = self.n_ctx_seq
        self._inbox = Inbox()
        self._waiting: list[EngineRequest] = []
        self._active: dict[int, Seq] = {}
        self._last_group: int | None = None
        self.budget = PrefillBudget(self.slots, cfg.n_batch, cfg.prefill_itl_ratio,
                                    cfg.prefill_min_chunk, cfg.batch_prefill_tokens,
                                    cfg.prefill_burst_s)
        self.prompt_tokens_total = 0
        self.prefix_reused_tokens = 0
        self.stopped_steps = 0  # steps stopped under way for an interactive job
        self._thread: threading.Thread | None = None
        self._stop = threading.Event()
        self._sink: Sink | None = None
        self.sampling = StepSampler(split=threads_of(cfg) > 1)  # its thread starts on first use

    # -- public interface (any thread) -------------------------------------------------
    def start(self, sink: Sink) -> None:
        self._sink = sink
        self.vocab = Vocab(self.model_path, self.cfg, vocab_only=False,
                           n_gpu_layers=self.cfg.n_gpu_layers)
        ctx = create_context(self.vocab.model, self.cfg, self.slots)
        self.ctx = ctx
        self.abort = StepAbort(ctx)
        self.mem = ll.llama_get_memory(ctx)
        self.batch = ll.llama_batch_init(self.cfg.n_batch, 0, 1)
        self.lora = LoraSet(self.vocab.model, ctx)
        ram = self.cfg.prompt_cache_ram_mb
        self.pool = SlotPool(self.mem, self.slots, self.cfg.prefix_cache,
                             RamCache(ctx, ram << 20) if ram else None)
        warm: Future[None] = Future()
        self._thread = threading.Thread(target=self._loop, args=(warm,), name="llama-engine",
                                        daemon=True)
        self._thread.start()
        warm.result(timeout=300)

    def _warm_up(self) -> None:
        """The first llama_decode of a context is cold (graph allocation, weights paged in
        from the mmapped file): pay that here rather than in the first job's TTFT, and time
        one decode step for the prefill budget. On the engine thread, like every decode:
        llama.cpp's OpenMP team belongs to the thread that first computes, and decoding
        from another thread afterwards makes every step markedly slower."""
        tokens = self.vocab.tokenize("The call was about an invoice.")
        self._decode_seq0(tokens, 0)
        t0 = time.perf_counter()
        self._decode_seq0(tokens[-1:], len(tokens))
        self.budget.observe(1, 0, time.perf_counter() - t0)
        ll.llama_memory_seq_rm(self.mem, 0, -1, -1)
        if self.cfg.prefix_cache:  # each slot holds the chat template's opening
            warm_slots(self.vocab, self.ctx, self.batch, self.cfg.n_batch, self.pool)

    def _decode_seq0(self, tokens: list[int], pos0: int) -> None:
        n = fill(self.batch, 0, tokens, pos0, 0)
        self.batch.logits[n - 1] = 1
        self.batch.n_tokens = n
        if ll.llama_decode(self.ctx, self.batch) != 0:
            raise RuntimeError("llama.cpp could not decode the warm-up prompt")

    def submit(self, request: EngineRequest) -> None:
        """Take a job; an interactive one stops a step of batch rows alone (StepAbort)."""
        self._inbox.put("submit", request)  # first: the stopped step's loop must find it
        if request.urgent and getattr(self, "abort", None) is not None:
            self.abort.request(arrival=True)

    def hold(self, seconds: float) -> None:
        """A slot is being freed for a job on its way (workers/preempt.py): stop the step
        under way (its tokens are computed again next step), and once the cancels before
        this are done, start no step without that job for up to `seconds`, so it joins the
        next step without waiting for the batch's step to end."""
        self._inbox.put("hold", seconds)  # first: the stopped step's loop must find it
        if getattr(self, "abort", None) is not None:
            self.abort.request()

    def cancel(self, job_id: str) -> None:
        self._inbox.put("cancel", job_id)

    def check_grammar(self, params: SamplingParams) -> None:
        """Compile the job's grammar once on the caller's thread (workers/grammar_guard.py)."""
        if params.json_schema is not None:
            check_grammar(self.vocab.vocab, params.json_schema)

    def load_adapter(self, ref: AdapterRef) -> int | None:
        fut: Future[None] = Future()
        self._inbox.put("lora_load", (ref, fut))
        fut.result(timeout=120)
        return None  # a GGUF LoRA does not record its rank

    def unload_adapter(self, ref: AdapterRef) -> None:
        self._inbox.put("lora_unload", ref)

    def stats(self) -> EngineStats:
        used = sum(s.n_past for s in list(self._active.values()))
        return EngineStats(running=len(self._active), waiting=len(self._waiting),
                           slots=self.slots, kv_cache_usage=used / max(1, self.cfg.n_ctx),
                           prefix_hit_ratio=self.prefix_reused_tokens / max(
                               1, self.prompt_tokens_total),
                           stopped_steps=self.stopped_steps)

    def healthy(self) -> bool:
        return self._thread is not None and self._thread.is_alive()

    def grammar_busy(self) -> list[tuple[str, int, float]]:  # (the heartbeat's thread)
        return grammar_busy(list(self._active.values()))

    def close(self) -> None:
        self._stop.set()
        self._inbox.put("stop")
        if self._thread:
            self._thread.join(timeout=10)
        self.sampling.close()
        if getattr(self, "ctx", None):
            self.lora.close()
            ll.llama_batch_free(self.batch)
            ll.llama_free(self.ctx)
            self.ctx = None
            self.vocab.close()

    # -- engine thread -----------------------------------------------------------------
    def _loop(self, warm: Future[None]) -> None:
        try:
            self._warm_up()
        except Exception as exc:
            warm.set_exception(exc)
            return
        warm.set_result(None)
        while not self._stop.is_set():
            out = StepOutput()
            try:
                self._drain_inbox(out, block=not self._active and not self._waiting)
                if self._inbox.held and self._active:  # publish the cancels, then wait
                    if out and self._sink:
                        self._sink(out)
                    self._inbox.await_held()
                    out = StepOutput()
                    self._drain_inbox(out, block=False)
                self._admit(out)
                if self._active:
                    self._step(out)
            except Exception as exc:
                # Never let the loop die with jobs in it: fail them and keep serving.
                log.exception("engine step failed; failing %d in-flight jobs", len(self._active))
                for seq in list(self._active.values()):
                    self._finish(seq, "error", out, "engine_error", f"engine step failed: {exc}")
            if out and self._sink:
                self._sink(out)
                if out.first_token and self.cfg.first_token_flush_ms:
                    out.flushed.wait(self.cfg.first_token_flush_ms / 1000)

    def _drain_inbox(self, out: StepOutput, block: bool) -> None:
        for kind, arg in self._inbox.drain(block):
            if kind == "submit":
                self._waiting.append(arg)
            elif kind == "cancel":
                self._cancel(arg, out)
            elif kind == "lora_load":
                ref, fut = arg
                try:
                    self.lora.want(ref)
                    fut.set_result(None)
                except Exception as exc:
                    fut.set_exception(exc)
            elif kind == "lora_unload":
                self.lora.unwant(arg.id)

    def _cancel(self, job_id: str, out: StepOutput) -> None:
        for req in self._waiting:
            if req.job_id == job_id:
                self._waiting.remove(req)
                out.finished.append(Finished(job_id, req.attempt, "cancelled", 0, 0))
                return
        for seq in self._active.values():
            if seq.req.job_id == job_id:
                self._finish(seq, "cancelled", out)
                return

    def _admit(self, out: StepOutput) -> None:
        while self._waiting and self.pool.free:
            req = self._waiting.pop(0)
            try:
                prompt = self.vocab.tokenize(self.vocab.render(req.prompt, req.messages, req.tools))
                group = self.lora.acquire(req.adapter)
            except Exception as exc:
                log.exception("job %s: adapter could not be loaded", req.job_id)
                out.finished.append(Finished(req.job_id, req.attempt, "error", 0, 0,
                                             "adapter_load_failed", str(exc)))
                continue
            try:
                sampler = Sampler(self.vocab.vocab, self.vocab.n_vocab, req.params)
                sampler.replay(req.resume_token_ids)
            except Exception as exc:
                self.lora.release(group)
                log.exception("job %s: could not be admitted", req.job_id)
                out.finished.append(Finished(req.job_id, req.attempt, "error", 0, 0,
                                             "bad_request", f"could not prepare the job: {exc}"))
                continue
            tokens = prompt + req.resume_token_ids
            done = len(req.resume_token_ids) >= req.params.max_tokens  # stopped at its last token
            # no tokens at all (`prompt: ""`, no BOS; the API refuses it): nothing to decode
            if done or not tokens or len(tokens) + 1 > self.n_ctx_seq:
                sampler.free()
                self.lora.release(group)
                resumed = len(req.resume_token_ids)
                out.finished.append(  # a takeover at the context's end just ends the job
                    Finished(req.job_id, req.attempt, "length", len(prompt), resumed)
                    if resumed else Finished(
                        req.job_id, req.attempt, "error", len(prompt), 0,
                        "context_length_exceeded" if tokens else "bad_request",
                        f"prompt has {len(prompt)} tokens; this "
                        f"worker's context is {self.n_ctx_seq}"))
                continue
            # cache_prompt false: a fresh prefill (no cached prefix, no sibling's KV), so a
            # greedy job's text does not depend on what ran before it.
            fresh = not req.params.cache_prompt
            seq_id, reused = self.pool.take(tokens, group, fresh)
            leader = None
            if reused < len(tokens) // 2 and not fresh:  # n choices: one prefill, then a copy
                reused, leader = share_prefill(self.mem, self._active.values(), seq_id,
                                               tokens, group, reused)
            self.prompt_tokens_total += len(tokens)
            self.prefix_reused_tokens += reused
            self._active[seq_id] = Seq(
                req=req, seq_id=seq_id, tokens=tokens[reused:], n_past=reused,
                n_prompt=len(prompt),
                sampler=sampler, text=TextStream(req.params.stop,
                                                            next_index=len(req.resume_token_ids)),
                generated=len(req.resume_token_ids),
                emitted=len(req.resume_token_ids), history=list(tokens), group=group,
                leader=leader)

    def _step(self, out: StepOutput) -> None:
        batch, n = self.batch, 0
        rows: list[tuple[Seq, int]] = []
        # One adapter group per step (adapters apply to the whole context); groups rotate.
        group = pick_group((s.group for s in self._active.values()), self._last_group)
        self._last_group = group
        self.lora.apply(group)
        # Decoders first: one token each keeps every stream moving every step. Prompts
        # (oldest first) share what the prefill budget leaves (budget.py). An urgent
        # (interactive) prompt and a short one go first and whole; a background (batch)
        # prompt only ever in chunks, so no step grows long on work nobody waits for, and
        # the batch's decoders sit out a step that takes such a whole prompt (budget.py).
        def whole(s: Seq) -> bool:
            return not s.req.background and (
                s.req.urgent or len(s.tokens) <= self.cfg.prefill_whole_tokens)

        now = time.monotonic()
        order = sorted(awake((s for s in self._active.values()
                              if s.group == group and s.leader is None), now),
                       key=lambda s: (s.prefilling, not whole(s)))
        takes = self.budget.split([Want(len(s.tokens), s.prefilling, whole(s), s.req.background)
                                   for s in order])
        plan = [(s, s.tokens[:k]) for s, k in zip(order, takes, strict=True) if k]
        decoding = sum(1 for s, _ in plan if not s.prefilling)
        # a hold may stop this step unless it carries a prompt someone waits for; an
        # interactive arrival, only a step of batch rows alone
        for_hold = all(s.req.background or not s.prefilling for s, _ in plan)
        for_arrival = all(s.req.background for s, _ in plan)
        # Rows in sequence-id order: with a KV stream per slot, llama.cpp packs a step's
        # sequences into one ubatch only while their ids run consecutively upwards, and
        # splits the step at every other place (a graph pass per piece, each reading all
        # the weights again: an unordered 8-stream step took twice as long).
        for seq, take in sorted(plan, key=lambda p: p[0].seq_id):
            n = fill(self.batch, n, take, seq.n_past, seq.seq_id)
            seq.n_past += len(take)
            seq.tokens = seq.tokens[len(take):]
            if not seq.tokens:  # its whole input is in: sample from its last row
                batch.logits[n - 1] = 1
                rows.append((seq, n - 1))
        batch.n_tokens = n
        t0 = time.perf_counter()
        self.abort.running(for_hold=for_hold, for_arrival=for_arrival)
        rc = ll.llama_decode(self.ctx, batch)
        self.abort.done()
        if rc == 2:  # stopped for a job on its way or here: as if the step never ran
            undo(self.mem, plan)
            self.stopped_steps += 1
            return
        self.budget.observe(decoding, n - decoding, time.perf_counter() - t0)
        if rc != 0:
            log.error("llama_decode returned %d; failing %d jobs", rc, len(self._active))
            for seq in list(self._active.values()):
                self._finish(seq, "error", out, "engine_error", f"llama_decode returned {rc}")
            return
        forked = fork(self.mem, self._active.values(), rows)
        self.prefix_reused_tokens += sum(f.n_past for f, _ in forked)
        rows += forked
        toks = self.sampling.sample(self.ctx, [(seq.sampler, row) for seq, row in rows])
        rest_after_slow(list(self._active.values()), time.monotonic())
        for (seq, row), tok in zip(rows, toks, strict=True):
            if seq.req.params.logprobs is not None and not self.vocab.is_eog(tok):
                seq.logprobs[seq.generated] = row_logprobs(self.ctx, self.vocab, row, tok,
                                                           seq.req.params.logprobs)
            if self.vocab.is_eog(tok):
                self._finish(seq, "stop", out)
                continue
            seq.generated += 1
            seq.history.append(tok)
            self._emit(seq, seq.text.push(tok, self.vocab.piece(tok)), out)
            if seq.text.stopped:
                self._finish(seq, "stop", out)
            elif seq.generated >= seq.req.params.max_tokens or seq.n_past + 1 >= self.n_ctx_seq:
                self._finish(seq, "length", out)
            else:
                seq.tokens = [tok]

    def _emit(self, seq: Seq, released: list[Released], out: StepOutput) -> None:
        if released and seq.emitted == len(seq.req.resume_token_ids):
            out.first_token = True
        for r in released:
            out.tokens.append(TokenDelta(seq.req.job_id, seq.req.attempt, r.index, r.text,
                                         r.token_id, seq.logprobs.pop(r.index, None)))
        seq.emitted += len(released)

    def _finish(self, seq: Seq, reason: EndReason, out: StepOutput,
                code: str | None = None, message: str | None = None) -> None:
        if reason in ("stop", "length"):
            self._emit(seq, seq.text.finish(), out)
        # usage counts the token events clients saw (a cancel drops held-back tokens)
        out.finished.append(Finished(seq.req.job_id, seq.req.attempt, reason, seq.n_prompt,
                                     seq.emitted, code, message))
        # keep the cells for prefix reuse (positions [0, n_past) are valid), unless the
        # decode failed
        self.pool.give_back(seq.seq_id, seq.group,
                            None if reason == "error" else seq.history[:seq.n_past])
        for f in self._active.values():
            if f.leader is seq:  # it ended before its prefill was done: prefill alone
                f.leader = None
        seq.sampler.free()
        self.lora.release(seq.group)
        del self._active[seq.seq_id]

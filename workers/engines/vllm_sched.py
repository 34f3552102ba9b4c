"""Interactive prompts ahead of a batch's on the vLLM worker: the engine's scheduler.

vLLM's scheduler fills a step with its running requests first (decodes and prompts under
way, in admission order), then with waiting ones, up to the step's token budget; a
request cannot join a step under way. Beside a batch that is starting, a step on a CPU
then holds up to the whole budget of the batch's prompt tokens (2,048 by default: 8.5 s
on a 2-core VM), and an interactive job waits for that step and for the next, where the
batch's prompts under way still come first (docs/benchmarks.md). tokenq's llama.cpp
worker bounds a batch's prompt tokens per step; this does the same on vLLM. A job's
priority reaches vLLM as the request's priority (high 0, normal 1, low 2; the engine runs
vLLM's "priority" policy, so waiting requests are taken in that order), and each step:

- while a foreground request (priority high or normal) has prompt tokens to compute, the
  batch's (low) prompts under way sit the step out and no new one starts: the step holds
  the decodes and the foreground prompts, whole up to the budget;
- while a foreground request decodes, the step holds at most `beside` of the batch's
  prompt tokens; with the batch alone, at most `alone` (one batch prompt a step either
  way; 0: no bound). vLLM cannot stop a step under way (llama.cpp's worker can), so
  `alone` is what bounds the step a job arriving beside a batch waits for;
- otherwise (no batch on the engine, or no batch prompt) the step is vLLM's own.

The batch's decodes always run. Held-back requests keep their place, their KV blocks and
their slots: they are taken out of the scheduler's running list for the call (and its limit
on running requests lowered by as many) and put back after it, the way a request the
budget did not reach stays running without being scheduled.

Runs in vLLM's engine process, named by `scheduler_cls` (vllm_args.engine_args).
"""

from __future__ import annotations

from collections.abc import Iterable
from dataclasses import dataclass
from typing import Any, Protocol

from vllm.v1.core.sched.scheduler import Scheduler

from tokenq.workers.engines.vllm_args import BATCH_ALONE_KEY, BATCH_PREFILL_KEY, LOW


class Req(Protocol):
    """What the plan reads of a vLLM Request."""
    request_id: str
    priority: int
    num_computed_tokens: int

    @property
    def num_tokens(self) -> int: ...


def to_compute(r: Req) -> int:
    """Tokens the request still has to compute before it samples (1 for a decode)."""
    return max(1, r.num_tokens - r.num_computed_tokens)


def prompt_pending(r: Req) -> bool:
    """More than one token to compute: a prompt (or a preempted request's recompute)."""
    return r.num_computed_tokens + 1 < r.num_tokens


@dataclass
class StepPlan:
    running: list[Any]  # the running list the call sees, in the order it sees it
    held: list[Any]  # running requests that sit the step out
    budget: int  # the step's token budget for the call


def plan_step(running: list[Any], waiting: Iterable[Any], budget: int, beside: int,
              alone: int) -> StepPlan | None:
    """What one step of the scheduler sees, or None: vLLM's own step. One pass over each
    list: it runs before every engine step."""
    decodes: list[Any] = []
    fg_prompt: list[Any] = []
    bg_prompt: list[Any] = []
    fg_running = bg_any = False
    for r in running:
        fg = r.priority < LOW
        fg_running, bg_any = fg_running or fg, bg_any or not fg
        if not prompt_pending(r):
            decodes.append(r)
        elif fg:
            fg_prompt.append(r)
        else:
            bg_prompt.append(r)
    fg_waiting = bg_waiting = False
    fg_need = 0
    for r in waiting:
        if r.priority < LOW:
            fg_waiting, fg_need = True, fg_need + to_compute(r)
        else:
            bg_waiting = True
    if not (bg_any or bg_waiting):
        return None  # no batch on the engine: vLLM's own step, exactly
    if fg_prompt or fg_waiting:
        # Decodes first, then the foreground prompts; the batch's prompts sit it out, and
        # the budget ends where the foreground's needs do, so no new batch prompt starts.
        need = sum(to_compute(r) for r in decodes) + sum(to_compute(r) for r in fg_prompt)
        return StepPlan(decodes + fg_prompt, bg_prompt, max(1, min(budget, need + fg_need)))
    cap = beside if fg_running else alone
    if cap <= 0 or not (bg_prompt or bg_waiting):
        return None
    # One batch prompt, last in the order so the decodes before it get their token, and at
    # most `cap` of its tokens (or, if it needs fewer, of a new batch prompt's).
    need = sum(to_compute(r) for r in decodes)
    return StepPlan(decodes + bg_prompt[:1], bg_prompt[1:], max(1, min(budget, need + cap)))


def put_back(before: list[Any], after: list[Any], held: list[Any]) -> list[Any]:
    """The running list after a call that saw only part of it: the requests still running
    and the held ones in their order before the call, then those the call admitted."""
    kept = {r.request_id for r in after} | {r.request_id for r in held}
    known = {r.request_id for r in before}
    return ([r for r in before if r.request_id in kept]
            + [r for r in after if r.request_id not in known])


class TieredScheduler(Scheduler):
    def __init__(self, *args: Any, **kwargs: Any) -> None:
        super().__init__(*args, **kwargs)
        extra: Any = self.vllm_config.additional_config
        extra = extra if isinstance(extra, dict) else {}
        self.beside = int(extra.get(BATCH_PREFILL_KEY, 0))
        self.alone = int(extra.get(BATCH_ALONE_KEY, 0))

    def schedule(self, *args: Any, **kwargs: Any) -> Any:
        plan = plan_step(self.running, self.waiting, self.max_num_scheduled_tokens,
                         self.beside, self.alone)
        if plan is None:
            return super().schedule(*args, **kwargs)
        before, budget, active = self.running, self.max_num_scheduled_tokens, \
            self.max_num_active_reqs
        self.running = list(plan.running)
        self.max_num_scheduled_tokens = plan.budget
        self.max_num_active_reqs = active - len(plan.held)  # held ones keep their slots
        try:
            return super().schedule(*args, **kwargs)
        finally:
            self.running = put_back(before, self.running, plan.held)
            self.max_num_scheduled_tokens, self.max_num_active_reqs = budget, active

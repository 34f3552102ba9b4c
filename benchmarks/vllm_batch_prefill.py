"""What bounding a batch's prompt tokens per step costs a prompt-heavy batch on vLLM.

tokenq's vLLM scheduler (workers/engines/vllm_sched.py) lets a step hold at most
`alone` of a batch's (priority low) prompt tokens while the batch is alone on the engine
(`batch_alone_prefill_tokens`). This runs the post-call calls
(`tokenq bench postcall`'s transcripts: ~440 prompt tokens, greedy, `max_tokens` as given,
no schema) as low-priority requests on vLLM offline with tokenq's scheduler, the step
budget tokenq gives a CPU, and one such bound a process (0: none, vLLM's own steps):
    .venv/bin/python benchmarks/vllm_batch_prefill.py smollm2-135m-instruct 32
    .venv/bin/python benchmarks/vllm_batch_prefill.py smollm2-135m-instruct 0
Prints the batch's makespan and its output and prompt tokens a second.
"""

from __future__ import annotations

import os
import sys
import time


def run(folder: str, batch_prefill: int, calls: int, max_tokens: int) -> None:
    from transformers import AutoTokenizer
    from vllm import LLM, SamplingParams
    from vllm.inputs import TokensPrompt

    from tokenq.cli.bench.calls import requests
    from tokenq.workers.engines.vllm_args import (
        BATCH_ALONE_KEY,
        CPU_STEP_TOKENS,
        LOW,
        SCHEDULER,
        engine_dtype,
    )

    tok = AutoTokenizer.from_pretrained(folder)
    prompts = [TokensPrompt(prompt_token_ids=tok.encode(tok.apply_chat_template(
        r["messages"], add_generation_prompt=True, tokenize=False), add_special_tokens=False))
        for r in requests(calls, 0, "m", max_tokens)]
    llm = LLM(model=folder, dtype=engine_dtype("auto"), enforce_eager=True, max_num_seqs=16,
              max_model_len=2048, max_num_batched_tokens=CPU_STEP_TOKENS,
              scheduling_policy="priority", scheduler_cls=SCHEDULER,
              additional_config={BATCH_ALONE_KEY: batch_prefill})
    params = SamplingParams(max_tokens=max_tokens, temperature=0.0)
    llm.generate(prompts[:2], params, use_tqdm=False, priority=[LOW] * 2)  # warm-up
    t = time.perf_counter()
    outs = llm.generate(prompts, params, use_tqdm=False, priority=[LOW] * len(prompts))
    took = time.perf_counter() - t
    out = sum(len(o.outputs[0].token_ids) for o in outs)
    prompt = sum(len(o.prompt_token_ids or []) for o in outs)
    print(f"batch_alone_prefill={batch_prefill} calls={calls} makespan_s={took:.1f} "
          f"output_tok_s={out / took:.1f} prompt_tok_s={prompt / took:.1f}", flush=True)


def main() -> None:
    from tokenq.shared.settings import Settings
    from tokenq.shared.weights import hf_dir
    from tokenq.workers.engines.vllm_args import engine_env

    args = sys.argv[1:]
    name = args[0] if args else "smollm2-135m-instruct"
    batch_prefill = int(args[1]) if len(args) > 1 else 32
    calls = int(args[2]) if len(args) > 2 else 32
    max_tokens = int(args[3]) if len(args) > 3 else 128
    for k, v in engine_env().items():
        os.environ.setdefault(k, v)
    settings = Settings()
    run(str(hf_dir(name, settings.models()[name], settings.state_dir)), batch_prefill, calls,
        max_tokens)


if __name__ == "__main__":
    main()

"""vLLM's tokens a second on this CPU per dtype: why `dtype: auto` is float32 where the
CPU only emulates bf16 (workers/engines/vllm_args.engine_dtype, docs/vllm.md).

vLLM offline (eager, prefix caching on), 16 prompts of 64 tokens each at temperature 0.7
with a seed, after a 2-prompt warm-up. The model folder is the one `tokenq models convert`
(or `tokenq bench compare --vllm`) writes. One dtype a process:
    .venv/bin/python benchmarks/vllm_dtype.py smollm2-135m-instruct bfloat16
    .venv/bin/python benchmarks/vllm_dtype.py smollm2-135m-instruct float32
"""

from __future__ import annotations

import os
import sys
import time


def run(folder: str, dtype: str) -> None:
    from vllm import LLM, SamplingParams

    llm = LLM(model=folder, dtype=dtype, enforce_eager=True, max_num_seqs=16,
              max_model_len=2048)
    params = SamplingParams(max_tokens=64, temperature=0.7, seed=1, ignore_eos=True)
    prompts = [f"[{i}] Write a long story about the call center night shift number {i}."
               for i in range(16)]
    llm.generate(prompts[:2], params, use_tqdm=False)
    t = time.perf_counter()
    outs = llm.generate(prompts, params, use_tqdm=False)
    took = time.perf_counter() - t
    n = sum(len(o.outputs[0].token_ids) for o in outs)
    print(f"dtype={dtype} tokens={n} seconds={took:.2f} tok/s={n / took:.1f}", flush=True)


def main() -> None:
    from tokenq.shared.settings import Settings
    from tokenq.shared.weights import hf_dir
    from tokenq.workers.engines.vllm_args import engine_env

    args = sys.argv[1:]
    name = args[0] if args else "smollm2-135m-instruct"
    dtype = args[1] if len(args) > 1 else "float32"
    for k, v in engine_env().items():
        os.environ.setdefault(k, v)
    settings = Settings()
    run(str(hf_dir(name, settings.models()[name], settings.state_dir)), dtype)


if __name__ == "__main__":
    main()

"""Whether AMX tiles really run here, for the vLLM worker (the same care as
shared/llamacpp_dispatch.py gives llama.cpp's CPU variants).

A CPU may list `amx_tile` and Linux may grant the tile state while the instructions still
fault under a hypervisor. torch (oneDNN) and vLLM's CPU kernels would then die with SIGILL
on their first bf16 matmul. Before the engine starts, a child process asks for the tile
state and runs a bf16 matmul; if it dies, AMX is kept out: oneDNN is capped below AMX
(ONEDNN_MAX_CPU_ISA) and tokenq's hook in the engine processes does not request the tile
state. The verdict is cached per host in the state dir, as llama.cpp's is.
"""

from __future__ import annotations

import logging
import os
import subprocess
import sys
from pathlib import Path

from tokenq.shared.llamacpp_dispatch import VerdictCache
from tokenq.workers.engines.vllm_plugin import NO_AMX_ENV

log = logging.getLogger(__name__)

PROBE = ("import torch; torch.cpu._init_amx(); "
         "a = torch.randn(256, 256, dtype=torch.bfloat16); print(float((a @ a).sum()))")
CAP_ISA = "AVX512_CORE_BF16"


def cpu_lists_amx() -> bool:
    try:
        return " amx_tile" in Path("/proc/cpuinfo").read_text()
    except OSError:
        return False


def keep_amx_out_if_it_faults(state_dir: Path, timeout_s: float = 120.0) -> bool:
    """Probe (once per host) and keep AMX out of this process's children if it faults;
    True if AMX stays in use."""
    if not cpu_lists_amx():
        return True
    cache = VerdictCache(state_dir / "vllm-amx.json")
    key = Path(sys.executable)  # the verdict is per host and per Python (its torch)
    verdict = cache.get(key)
    if verdict is None:
        try:
            done = subprocess.run([sys.executable, "-c", PROBE], capture_output=True,
                                  timeout=timeout_s, check=False)
            verdict = "" if done.returncode == 0 else f"exit {done.returncode}"
        except subprocess.TimeoutExpired:
            verdict = "the probe hung"
        cache.put(key, verdict)
    if verdict == "":
        log.info("vLLM: AMX tiles run here (bf16 matmul probe)")
        return True
    os.environ[NO_AMX_ENV] = "1"
    os.environ.setdefault("ONEDNN_MAX_CPU_ISA", CAP_ISA)
    log.warning("vLLM: the CPU lists AMX but its tiles fault here (%s in the probe): "
                "AMX kept out (ONEDNN_MAX_CPU_ISA=%s)", verdict,
                os.environ["ONEDNN_MAX_CPU_ISA"])
    return False

"""A `vllm.general_plugins` entry point: vLLM calls it in every process it starts.

1. vLLM's CPU attention kernels use AMX tiles without first asking Linux for the
   permission (arch_prctl ARCH_REQ_XCOMP_PERM), which SIGILLs the engine process
   on CPUs with AMX (3 of 4 starts here). torch asks for it in `_init_amx()`;
   calling it before any kernel runs made every start clean. A no-op elsewhere.
2. An engine process must not outlive the process that started it. A worker
   killed with SIGKILL (the OOM killer, a supervisor's last resort) left its
   EngineCore and VLLM::Worker running here, holding the KV cache memory and the
   cores (on a GPU host: the GPU memory its replacement needs).
"""

from __future__ import annotations

import multiprocessing
import os
import signal

from shared.redis_server import die_with_parent


def init_amx() -> None:
    _die_with_parent()
    try:
        import torch

        torch.cpu._init_amx()
    except (ImportError, AttributeError, RuntimeError):  # no torch, older torch, no AMX
        pass


def _die_with_parent() -> None:
    """SIGTERM (vLLM's clean shutdown) when the parent goes; only in the processes vLLM
    starts, never in the worker itself (vLLM loads plugins there too)."""
    parent = multiprocessing.parent_process()
    if parent is None:
        return
    die_with_parent()
    if os.getppid() != parent.pid:  # the parent died before the signal was armed
        os.kill(os.getpid(), signal.SIGTERM)

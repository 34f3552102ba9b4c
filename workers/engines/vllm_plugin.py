"""A `vllm.general_plugins` entry point: vLLM calls it in every process it starts.

vLLM's CPU attention kernels use AMX tiles without first asking Linux for the
permission (arch_prctl ARCH_REQ_XCOMP_PERM), which SIGILLs the engine process
on CPUs with AMX (3 of 4 starts here). torch asks for it in `_init_amx()`;
calling it before any kernel runs made every start clean. A no-op elsewhere.
"""

from __future__ import annotations


def init_amx() -> None:
    try:
        import torch

        torch.cpu._init_amx()
    except (ImportError, AttributeError, RuntimeError):  # no torch, older torch, no AMX
        pass

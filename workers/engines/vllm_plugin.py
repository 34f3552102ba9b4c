"""tokenq's hook in the vLLM processes its worker starts, and nowhere else.

vLLM calls every `vllm.general_plugins` entry point it finds in each of its processes. An
entry point declared in tokenq's own package metadata would run in *every* vLLM process
of the environment, a plain `vllm serve` included. So tokenq declares none: the vLLM
worker writes a one-entry distribution (`register()`) into its state dir and puts it on
its own sys.path and on PYTHONPATH, which the engine processes it starts inherit.

What the hook does there (`init`):
1. vLLM's CPU attention kernels use AMX tiles without first asking Linux for the
   permission (arch_prctl ARCH_REQ_XCOMP_PERM), which SIGILLs the engine process on CPUs
   with AMX. torch asks for it in `_init_amx()`; calling it before any kernel runs made
   every start clean. A no-op elsewhere, and skipped where the worker's probe found that
   the tiles fault although Linux grants them (vllm_amx.py).
2. An engine process must not outlive the process that started it. A worker killed with
   SIGKILL (the OOM killer, a supervisor's last resort) left its EngineCore and
   VLLM::Worker running, holding the KV cache memory and the cores (on a GPU host: the
   GPU memory its replacement needs).
3. On the CPU, a request with a `seed` whose prompt a step splits killed the engine
   (vllm_seeds.py).
"""

from __future__ import annotations

import multiprocessing
import os
import signal
import sys
from pathlib import Path

from tokenq.shared.redis_server import die_with_parent

DIST = "tokenq_vllm_hook-1.0.dist-info"
NO_AMX_ENV = "TOKENQ_VLLM_NO_AMX"  # set by the worker where AMX tiles fault


def register(state_dir: Path) -> Path:
    """Make the hook visible to this process and the ones it starts; its folder."""
    root = state_dir / "vllm-plugin"
    dist = root / DIST
    dist.mkdir(parents=True, exist_ok=True)
    (dist / "METADATA").write_text(
        "Metadata-Version: 2.1\nName: tokenq-vllm-hook\nVersion: 1.0\n")
    (dist / "entry_points.txt").write_text(
        f"[vllm.general_plugins]\ntokenq = {__name__}:init\n")
    folder = str(root)
    if folder not in sys.path:
        sys.path.insert(0, folder)
    paths = [p for p in os.environ.get("PYTHONPATH", "").split(os.pathsep) if p]
    if folder not in paths:
        os.environ["PYTHONPATH"] = os.pathsep.join([folder, *paths])
    return root


def init() -> None:
    """The entry point: everything the hook does in a vLLM process."""
    init_amx()
    if multiprocessing.parent_process() is not None:  # the engine's processes, not the worker
        from tokenq.workers.engines.vllm_seeds import install

        install()


def init_amx() -> None:
    _die_with_parent()
    if os.environ.get(NO_AMX_ENV):
        return
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

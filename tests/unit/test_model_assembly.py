"""A bundled model assembled on first use is written once, whole, however many processes
ask for it at the same moment (a fresh stack: the API and a worker)."""

from __future__ import annotations

import multiprocessing
import time
from pathlib import Path

from tokenq.shared.weights import assemble_once

SIZE = 4 << 20


def slow_assemble(tmp: Path) -> None:
    with open(tmp, "wb") as f:
        for _ in range(16):
            f.write(b"x" * (SIZE // 16))
            f.flush()
            time.sleep(0.02)


def read_size(path: str, out: multiprocessing.Queue) -> None:  # type: ignore[type-arg]
    assemble_once(slow_assemble, Path(path))
    out.put(Path(path).stat().st_size)  # the file a loader would open right after


def test_concurrent_first_use_sees_only_the_whole_file(tmp_path: Path) -> None:
    target = tmp_path / "models" / "model.gguf"
    ctx = multiprocessing.get_context("spawn")
    sizes: multiprocessing.Queue = ctx.Queue()  # type: ignore[type-arg]
    procs = [ctx.Process(target=read_size, args=(str(target), sizes)) for _ in range(3)]
    for p in procs:
        p.start()
    for p in procs:
        p.join(60)
    assert [sizes.get(timeout=5) for _ in procs] == [SIZE] * 3
    assert [p.name for p in target.parent.iterdir() if p.name.endswith(".partial")] == []

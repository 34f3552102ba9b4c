"""Per-token log-probabilities in the shape the token events carry them.

A token event of a job that asked for logprobs holds `logprobs`: the sampled token's
text, bytes and log-probability under the model (raw logits, before sampling
penalties and temperature, as vLLM reports them) and its `top_logprobs` alternatives.
The API turns that into OpenAI's chat or completions shape.
"""

from __future__ import annotations

from typing import Any

import numpy as np


def entry(token: bytes, logprob: float, top: list[tuple[bytes, float]]) -> dict[str, Any]:
    return {"token": token.decode(errors="replace"), "bytes": list(token), "logprob": logprob,
            "top_logprobs": [{"token": t.decode(errors="replace"), "bytes": list(t),
                              "logprob": lp} for t, lp in top]}


def from_logits(logits: Any, tok: int, k: int) -> tuple[float, list[tuple[int, float]]]:
    """log-softmax of one row: the sampled token's logprob and the k most likely tokens."""
    row = np.asarray(logits, dtype=np.float32)
    m = float(row.max())
    lse = m + float(np.log(np.exp(row - m, dtype=np.float64).sum()))
    top: list[tuple[int, float]] = []
    if k > 0:
        idx = np.argpartition(-row, k - 1)[:k]
        idx = idx[np.argsort(-row[idx], kind="stable")]
        top = [(int(i), float(row[i]) - lse) for i in idx]
    return float(row[tok]) - lse, top

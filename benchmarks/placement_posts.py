"""POST /v1/jobs a second for a model served by two pools (docs/scheduling.md, "Order").

A replica places and creates one job of such a model at a time, so that its jobs reach
their lane in the order placement counted them (`api.placement_in_order`). This measures
what that costs a submitting client: a stack on the fake engine (two pools, one worker,
embedded Redis), `--posts` POSTs with `--concurrency` in flight, `--runs` times, with the
order kept (the default) or not (`--no-order`).

    python benchmarks/placement_posts.py [--no-order] [--posts 600] [--runs 3]
"""

from __future__ import annotations

import argparse
import json
import statistics
import tempfile
from pathlib import Path

from tokenq.cli.bench.scale_load import post_jobs
from tokenq.cli.stack import Stack
from tokenq.shared.settings import Settings

MODEL = "duo"
POOLS = {"fast": {"n_parallel": 16, "fake_tokens_per_s": 100.0},
         "slow": {"n_parallel": 4, "fake_tokens_per_s": 10.0}}


def post_all(url: str, posts: int, concurrency: int) -> tuple[float, dict[int | str, int]]:
    """(POSTs a second, status code -> count), with `tokenq bench scale`'s sender."""
    _, codes, wall = post_jobs(url, "placement-posts", MODEL, posts, concurrency, max_tokens=4)
    return posts / wall, {int(c) if c.isdigit() else c: n for c, n in codes.items()}


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--no-order", action="store_true",
                    help="api.placement_in_order off (creates in any order)")
    ap.add_argument("--posts", type=int, default=600)
    ap.add_argument("--concurrency", type=int, default=32)
    ap.add_argument("--runs", type=int, default=3)
    args = ap.parse_args()
    tmp = Path(tempfile.mkdtemp(prefix="tokenq-placement-posts-"))
    (tmp / "models.json").write_text(json.dumps({MODEL: {"backend": "fake", "pools": POOLS}}))
    room = str(10 * args.posts * args.runs)
    env = {"TOKENQ_API__QUEUE_LIMIT": room, "TOKENQ_API__TENANT_MAX_QUEUED": room,
           "TOKENQ_API__PLACEMENT_IN_ORDER": "false" if args.no_order else "true"}
    st = Stack(Settings(redis_url=None, state_dir=tmp, models_file=tmp / "models.json"),
               models=[MODEL], workers=1, quiet=True, drain_timeout_s=5, env=env)
    st.start_parts()
    try:
        st.wait_ready(timeout=180, models=[MODEL])
        rates = []
        for i in range(args.runs):
            rate, codes = post_all(st.url, args.posts, args.concurrency)
            rates.append(rate)
            print(f"run {i + 1}: {rate:.0f} POST/s {codes}", flush=True)
        print(f"placement_in_order={not args.no_order}: median {statistics.median(rates):.0f} "
              f"POST/s ({min(rates):.0f}-{max(rates):.0f}) over {args.runs} runs of "
              f"{args.posts}, {args.concurrency} in flight")
    finally:
        st.stop()


if __name__ == "__main__":
    main()

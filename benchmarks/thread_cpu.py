"""CPU per thread of tokenq's processes (and llama-server's) over a window, from /proc.

Run it while a load runs, e.g. in another shell:
    .venv/bin/tokenq bench run --model gemma3-270m --concurrency 8 --requests 40
    .venv/bin/python benchmarks/thread_cpu.py 15     # after ~45 s, for 15 s
Prints each thread over 0.3% of a core, then each process's total (100% = one core).
"""

from __future__ import annotations

import os
import sys
import time

WATCHED = ("celeryd", "tokenq.cli.main worker", "tokenq.api.server", "redis-server",
           "tokenq.cli.main bench", "tokenq bench", "llama-server")


def processes() -> dict[str, str]:
    found = {}
    for pid in filter(str.isdigit, os.listdir("/proc")):
        try:
            with open(f"/proc/{pid}/cmdline", "rb") as f:
                cmd = f.read().replace(b"\0", b" ").decode(errors="replace")
        except OSError:
            continue
        if any(w in cmd for w in WATCHED):
            found[pid] = cmd[:60]
    return found


def ticks(pids: dict[str, str]) -> dict[tuple[str, str], tuple[str, int]]:
    out = {}
    for pid in pids:
        try:
            tids = os.listdir(f"/proc/{pid}/task")
        except OSError:
            continue
        for tid in tids:
            try:
                with open(f"/proc/{pid}/task/{tid}/stat") as f:
                    stat = f.read()
            except OSError:
                continue
            name = stat[stat.index("(") + 1:stat.rindex(")")]
            fields = stat[stat.rindex(")") + 2:].split()
            out[(pid, tid)] = (name, int(fields[11]) + int(fields[12]))  # utime + stime
    return out


def main() -> None:
    window = float(sys.argv[1]) if len(sys.argv) > 1 else 15.0
    pids = processes()
    before = ticks(pids)
    time.sleep(window)
    after = ticks(pids)
    hz = os.sysconf("SC_CLK_TCK")
    totals: dict[str, float] = {}
    for key, (name, t) in sorted(after.items()):
        if key not in before:
            continue
        share = (t - before[key][1]) / hz / window
        totals[key[0]] = totals.get(key[0], 0.0) + share
        if share > 0.003:
            print(f"{pids[key[0]][:40]:40} {name:16} {share * 100:6.1f}%")
    for pid, share in totals.items():
        print(f"total {pids[pid]:60} {share * 100:6.1f}%")


if __name__ == "__main__":
    main()

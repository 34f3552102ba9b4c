"""CPU and wake-ups per thread of tokenq's processes (and llama-server's) over a window,
from /proc.

Run it while a load runs, e.g. in another shell:
    .venv/bin/tokenq bench run --model gemma3-270m --concurrency 8 --requests 40
    .venv/bin/python benchmarks/thread_cpu.py 15     # after ~45 s, for 15 s
or beside an idle stack (`tokenq up`, a minute after it is ready) to see what idling costs.
Prints each thread over 0.3% of a core or 1 wake-up a second (its voluntary context
switches: each is a sleep the thread woke from), then each process's totals (100% = one
core). Python threads carry their process's name here; `py-spy dump --pid <pid>` names
them by thread id.
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


def ticks(pids: dict[str, str]) -> dict[tuple[str, str], tuple[str, int, int]]:
    """(pid, tid) -> (thread name, CPU ticks, voluntary context switches) so far."""
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
                with open(f"/proc/{pid}/task/{tid}/status") as f:
                    status = f.read()
            except OSError:
                continue
            name = stat[stat.index("(") + 1:stat.rindex(")")]
            fields = stat[stat.rindex(")") + 2:].split()
            wakes = int(status.split("voluntary_ctxt_switches:")[1].split()[0])
            out[(pid, tid)] = (name, int(fields[11]) + int(fields[12]), wakes)  # utime + stime
    return out


def main() -> None:
    window = float(sys.argv[1]) if len(sys.argv) > 1 else 15.0
    pids = processes()
    before = ticks(pids)
    time.sleep(window)
    after = ticks(pids)
    hz = os.sysconf("SC_CLK_TCK")
    totals: dict[str, tuple[float, float]] = {}
    for key, (name, t, w) in sorted(after.items()):
        if key not in before:
            continue
        share = (t - before[key][1]) / hz / window
        wakes = (w - before[key][2]) / window
        cpu, woke = totals.get(key[0], (0.0, 0.0))
        totals[key[0]] = (cpu + share, woke + wakes)
        if share > 0.003 or wakes > 1:
            print(f"{pids[key[0]][:40]:40} {key[1]:>8} {name:16} {share * 100:6.1f}% "
                  f"{wakes:6.1f} wake-ups/s")
    for pid, (share, wakes) in totals.items():
        print(f"total {pids[pid]:60} {share * 100:6.1f}% {wakes:6.1f} wake-ups/s")


if __name__ == "__main__":
    main()

"""`tokenq bench`: a sub-app whose help lists one subcommand per benchmark, each with its own
options and their environment twins; the benchmarks/ scripts import what they share from
tokenq.cli.bench. Nothing here runs a benchmark."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

import pytest
import typer
import typer.main
from typer.testing import CliRunner

from tokenq.cli.bench.options import levels_of
from tokenq.cli.main import app

ROOT = Path(__file__).resolve().parents[2]
runner = CliRunner()
WIDE = {"COLUMNS": "200", "TERM": "dumb"}

# each subcommand and all its options, --help aside
SUBCOMMANDS = {
    "run": {"--url", "--model", "--concurrency", "--requests", "--prompt-words", "--max-tokens",
            "--budget", "--json", "--api-key"},
    "long-prompt": {"--url", "--model", "--json", "--api-key"},
    "compare": {"--model", "--concurrency", "--requests", "--prompt-words", "--max-tokens",
                "--budget", "--json", "--rounds", "--inprocess", "--vllm"},
    "paired": {"--pairs", "--model", "--prompt-words", "--json"},
    "mixed": {"--model", "--vllm", "--quick", "--batch-jobs", "--batch-tokens", "--arrivals",
              "--rate", "--group", "--every", "--peers", "--no-peers", "--json"},
    "scale": {"--quick", "--clients", "--token-rate", "--posts", "--backlog", "--relay",
              "--no-relay", "--json"},
    "fair": {"--tenants", "--heavy-factor", "--light-rate", "--seconds", "--window-s",
             "--workers", "--apis", "--token-rate", "--max-tokens", "--seed", "--seeds",
             "--json"},
    "postcall": {"--model", "--calls", "--max-tokens", "--seed", "--runs", "--peers",
                 "--no-peers", "--json"},
    "eta": {"--jobs", "--warmup", "--tenants", "--runs", "--json"},
    "placement": {"--fast-slots", "--fast-rate", "--slow-slots", "--slow-rate", "--burst",
                  "--max-tokens", "--runs", "--json"},
}


def test_bench_help_lists_every_subcommand() -> None:
    res = runner.invoke(app, ["bench", "--help"], env=WIDE)
    assert res.exit_code == 0, res.output
    for name in SUBCOMMANDS:
        assert f" {name} " in res.output, (name, res.output)


def test_each_subcommand_takes_only_its_own_options() -> None:
    bench = typer.main.get_command(app).commands["bench"]  # type: ignore[attr-defined]
    assert set(bench.commands) == set(SUBCOMMANDS)
    for name, command in bench.commands.items():
        got = {o for p in command.params for o in (*p.opts, *p.secondary_opts)} - {"--help"}
        assert got == SUBCOMMANDS[name], name


@pytest.mark.parametrize("name", list(SUBCOMMANDS))
def test_each_subcommand_help_runs(name: str) -> None:
    res = runner.invoke(app, ["bench", name, "--help"], env=WIDE)
    assert res.exit_code == 0, res.output
    for option in SUBCOMMANDS[name]:
        assert option in res.output, (option, res.output)
    twin = "TOKENQ_BENCH_" + name.upper().replace("-", "_") + "_"  # the environment twins
    assert twin in res.output, res.output


def test_bench_alone_prints_its_help() -> None:
    res = runner.invoke(app, ["bench"], env=WIDE)
    assert "run" in res.output and "compare" in res.output, res.output


def test_environment_twins_reach_the_options() -> None:
    """A bad level from TOKENQ_BENCH_RUN_CONCURRENCY is refused before anything starts."""
    res = runner.invoke(app, ["bench", "run"], env={**WIDE, "TOKENQ_BENCH_RUN_CONCURRENCY": "x"})
    assert res.exit_code == 2 and "--concurrency" in res.output, res.output


def test_rounds_are_refused_with_vllm() -> None:
    res = runner.invoke(app, ["bench", "compare", "--vllm", "--rounds", "3"], env=WIDE)
    assert res.exit_code == 2 and "--rounds" in res.output, res.output


def test_levels() -> None:
    assert levels_of("1, 4,8,") == [1, 4, 8]
    for bad in ("", "0,4", "a"):
        with pytest.raises(typer.BadParameter):
            levels_of(bad)


@pytest.mark.parametrize("script", ["burst.py", "mixed_waits.py"])
def test_benchmark_scripts_import_their_helpers_from_the_package(script: str) -> None:
    """The lab scripts stay runnable as scripts: their imports of tokenq.cli.bench resolve
    (argparse's --help runs after them and before any work)."""
    out = subprocess.run([sys.executable, f"benchmarks/{script}", "--help"], cwd=ROOT,
                         capture_output=True, text=True, timeout=120)
    assert out.returncode == 0 and "usage:" in out.stdout, out.stderr


def test_mixed_arrivals_in_groups_at_a_fixed_pace() -> None:
    """`bench mixed --group 2 --every 1.5`: the issue's pattern (two at a time, 1.5 s apart);
    one at a time stays the Poisson sequence the earlier figures used."""
    from tokenq.cli.bench.mixed import MixedConfig, arrival_times

    assert arrival_times(MixedConfig(arrivals=5, group=2, every_s=1.5)) == [
        0.0, 0.0, 1.5, 1.5, 3.0]
    poisson = arrival_times(MixedConfig(arrivals=4))
    assert poisson[0] == 0.0 and poisson == sorted(set(poisson))
    grouped = arrival_times(MixedConfig(arrivals=4, group=2))
    assert grouped[0] == grouped[1] == 0.0 and grouped[2] == grouped[3] == poisson[1]


def test_fair_figures_pooled_over_seeds() -> None:
    """`bench fair --seeds`: each seed's ratio, and each arm's p95 over every seed's light
    jobs (not a median of the runs' p95s)."""
    from tokenq.cli.bench.fair import pooled

    def run(seed: int, fair: list[float], absent: list[float]) -> dict[str, object]:
        arms = {"fair": fair, "fifo": [x * 10 for x in fair], "heavy_absent": absent}
        return {"config": {"seed": seed},
                "summary": {"fair_wait_ratio": fair[-1] / absent[-1], "fair_jain_min": 0.99},
                **{arm: {"light_waits_s": sorted(ws)} for arm, ws in arms.items()}}

    # 20 jobs a run; each run's own p95 (its 20th) is its one long wait
    runs = [run(1, [0.004] * 19 + [0.1], [0.002] * 19 + [0.01]),
            run(2, [0.004] * 20, [0.002] * 20)]
    got = pooled(runs)
    assert got["seeds"] == [1, 2] and got["fair_wait_ratios"] == [10.0, 2.0]
    # 40 jobs: the p95 is the 39th, not the one long wait
    assert got["pooled_fair_p95_s"] == 0.004 and got["pooled_absent_p95_s"] == 0.002
    assert got["pooled_fair_wait_ratio"] == 2.0 and got["pooled_fifo_wait_ratio"] == 20.0
    assert got["fair_jain_min"] == 0.99


def test_placement_counts_a_job_misplaced_from_the_records() -> None:
    """`bench placement`'s `misplaced`: a job's real finish against when the other pool
    would have finished it, from that pool's own records (its queue ahead of the job, its
    slots, its median run time), not against an estimate."""
    from tokenq.cli.bench.placement import misplaced

    def rec(pool: str, created: float, finished: float) -> dict[str, str]:
        return {"pool": f"m@{pool}", "created_at": repr(created), "finished_at": repr(finished)}

    fast = [rec("fast", 0.00, 1.0), rec("fast", 0.01, 1.0), rec("fast", 0.02, 2.0),
            rec("fast", 0.03, 2.0)]  # two waves on its 2 slots
    slow = [rec("slow", 0.04, 3.04),  # fast would have started it at 2.0 (4 ahead, 2
            # slots): done at 3.0 there, 3.04 here: not 20% later
            rec("slow", 0.05, 6.05)]  # waited behind the first here: 6 s, against 2.95 s
    late_fast = [rec("fast", 0.06, 5.0)]  # slow would have started it at 6.05: not misplaced
    recs = fast + slow + late_fast
    slots, run_s = {"fast": 2, "slow": 1}, {"fast": 1.0, "slow": 3.0}
    assert misplaced(recs, slots, run_s) == 1
    assert misplaced(recs, slots, {"fast": 1.0}) == 1  # slow's run time unknown: not judged
    assert misplaced(recs, slots, {"slow": 3.0}) == 0  # fast's unknown: the slow jobs aren't


def test_postcall_halves_show_a_run_that_slows() -> None:
    """`bench postcall`'s first- and second-half token rates: each request's tokens spread
    over its own span, so a steady run reads the same in both halves and one whose requests
    take longer as the batch goes on reads slower in the second."""
    from tokenq.cli.bench.postcall import halves

    # 2 slots, each running 10-token requests back to back for 10 s
    steady = [(float(t), t + 1.0, 10) for t in range(10) for _ in range(2)]
    assert halves(steady) == (20.0, 20.0)
    # one request straddles the middle: its tokens split by its time on each side
    assert halves([(0.0, 4.0, 40), (4.0, 10.0, 60)]) == (10.0, 10.0)
    # requests taking 1 s, then 2 s each for the same tokens: the second half is slower
    slowing = [(float(t), t + 1.0, 10) for t in range(4)] + [(4.0 + 2 * i, 6.0 + 2 * i, 10)
                                                              for i in range(4)]
    first, second = halves(slowing)
    assert second < first
    assert halves([]) == (0.0, 0.0)
    assert halves([(1.0, 1.0, 5), (1.0, 3.0, 10)]) == (10.0, 5.0)  # an instant one counts

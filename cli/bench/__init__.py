"""`tokenq bench`: the benchmarks the CLI runs, and the helpers benchmarks/ scripts share.

commands.py  the typer sub-app `bench_app`: one subcommand per benchmark, each with only
             its own options (options.py: the ones several share); the work is imported
             when a subcommand runs, so `tokenq --help` loads none of it
load.py      the streaming load generator (`run`), its prompts and figures, `long-prompt`
compare.py, compare_rounds.py, compare_vllm.py   `compare`: tokenq beside its peers
peers.py     the peer servers (C++ llama-server, ...) as child processes
inprocess.py tokenq's engine driven in-process: a peer of `compare`, and `paired`
mixed.py     `mixed`: interactive arrivals beside a low-priority batch
scale.py, scale_load.py, scale_sse.py            `scale`: the queue itself, no model
"""

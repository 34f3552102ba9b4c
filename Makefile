# The README's commands. `make demo` and `make test` each set everything up first.
.PHONY: setup demo up test test-fast check lint types

setup:
	@scripts/setup.sh

demo: setup
	.venv/bin/tokenq demo

up: setup
	.venv/bin/tokenq up

# `make test` runs everything, the real vLLM worker included (installed here if missing;
# TOKENQ_REQUIRE_VLLM=1 turns a missing vLLM into a failure instead of a skip).
test:
	@scripts/setup.sh --vllm
	TOKENQ_REQUIRE_VLLM=1 .venv/bin/pytest

test-fast: setup
	.venv/bin/pytest -m "not slow and not vllm"

lint:
	.venv/bin/ruff check .

types:
	.venv/bin/mypy

check: setup lint types test

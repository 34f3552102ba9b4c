# The README's commands. `make demo` and `make test` each set everything up first.
.PHONY: setup demo up test test-fast check lint types

setup:
	@scripts/setup.sh

demo: setup
	.venv/bin/tokenq demo

up: setup
	.venv/bin/tokenq up

test: setup
	.venv/bin/pytest

test-fast: setup
	.venv/bin/pytest -m "not slow"

lint:
	.venv/bin/ruff check .

types:
	.venv/bin/mypy

check: setup lint types test

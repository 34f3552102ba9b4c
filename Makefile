# The README's commands. `make demo` and `make test` each set everything up first.
.PHONY: setup demo up test test-fast test-cluster image check lint types

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

# The multi-host shape for real: compose/compose.yml on Docker (images built here from
# Debian's packages and a wheelhouse; no registry needed), driven through crashes,
# partitions and stalls (tests/cluster).
test-cluster: setup
	scripts/cluster_prereqs.sh
	scripts/base_image.sh
	TOKENQ_BASE_IMAGE=tokenq/debian-base:bookworm $(MAKE) image
	.venv/bin/pytest tests/cluster -v -p no:cacheprovider

# The production image tokenq:latest (compose/Dockerfile) from a wheelhouse made here.
# TOKENQ_BASE_IMAGE: any Debian bookworm image with Python 3.11 (default: the official one).
image:
	scripts/wheelhouse.sh
	docker build -f compose/Dockerfile -t tokenq:latest \
	  --build-arg BASE=$${TOKENQ_BASE_IMAGE:-python:3.11-slim-bookworm} .

test-fast: setup
	.venv/bin/pytest -m "not slow and not vllm"

lint:
	.venv/bin/ruff check .

types:
	.venv/bin/mypy

check: setup lint types test

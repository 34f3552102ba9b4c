"""The session's stack fixture hands its settings to its children only: the test process's
environment is as it was, so no later test reads them by accident."""

from __future__ import annotations

import os

from tests.conftest import STACK_ENV
from tokenq.cli.stack import Stack


def test_the_stack_fixture_leaves_this_process_environment_alone(stack: Stack) -> None:
    leaked = {k: v for k, v in STACK_ENV.items() if os.environ.get(k) == v}
    assert leaked == {}
    assert os.environ.get("TOKENQ_MODELS_FILE") != str(stack.settings.models_file)
    assert stack._env()["TOKENQ_WORKER__LEASE_TTL_S"] == "4"  # the children get them

"""A pickled Celery message injected into a worker's queue is refused: nothing is
unpickled, nothing runs, and the worker goes on serving."""

from __future__ import annotations

import base64
import pickle
import time
import uuid
from pathlib import Path
from typing import Any

import httpx
import redis

from tests.faults.harness import FAKE, FAKE_IDLE, check_exactly_once, submit, wait_terminal
from tokenq.cli.stack import Stack
from tokenq.shared import keys
from tokenq.shared.celery_app import GENERATE_TASK, create_celery
from tokenq.shared.jobs import dumps
from tokenq.shared.settings import Settings


class Touch:
    """Unpickling this creates a file: proof that a worker deserialized the payload."""

    def __init__(self, path: Path):
        self.path = str(path)

    def __reduce__(self) -> tuple[Any, ...]:
        return (open, (self.path, "w"))


def pickled_message(stack: Stack, args: tuple[Any, ...], kwargs: dict[str, Any]) -> str:
    app = create_celery(Settings(redis_url=stack.redis_url))
    queue = keys.queue(FAKE, "normal")
    task_id = str(uuid.uuid4())
    msg: Any = app.amqp.as_task_v2(task_id, GENERATE_TASK, args=args, kwargs=kwargs)
    body = base64.b64encode(pickle.dumps((args, kwargs, {}))).decode()
    props = dict(msg.properties, delivery_mode=2, priority=0, body_encoding="base64",
                 delivery_info={"exchange": "", "routing_key": queue},
                 delivery_tag=str(uuid.uuid4()))
    return dumps({"body": body, "content-encoding": "binary",
                  "content-type": "application/x-python-serialize",
                  "headers": msg.headers, "properties": props})


def test_pickled_message_is_rejected_and_runs_nothing(
        secure_stack: Stack, alpha: httpx.Client, secure_redis: redis.Redis,
        tmp_path: Path) -> None:
    # A real job that only the injected message could start (its own message waits in a
    # queue no worker consumes).
    victim = submit(alpha, 1, 3, model=FAKE_IDLE)[0]
    marker = tmp_path / "unpickled"
    queue = keys.queue(FAKE, "normal")
    secure_redis.lpush(queue, pickled_message(secure_stack, (victim,), {}))
    secure_redis.lpush(queue, pickled_message(secure_stack, (Touch(marker),), {}))
    deadline = time.monotonic() + 20
    while secure_redis.llen(queue) and time.monotonic() < deadline:
        time.sleep(0.1)
    assert secure_redis.llen(queue) == 0, "the worker never took the messages"
    # A JSON job queued behind them runs: the worker is alive and consuming.
    ok = submit(alpha, 1, 3)
    wait_terminal(secure_redis, ok, timeout=30)
    check_exactly_once(secure_redis, ok, 3)
    assert not marker.exists()
    h = secure_redis.hgetall(keys.job(victim))
    assert h["state"] == "queued" and h["attempts"] == "0", h
    # Refused, not parked for redelivery. The JSON job's own message is acked only after
    # its task returns, a moment after the terminal state the test waited for.
    deadline = time.monotonic() + 10
    while secure_redis.hlen(keys.KOMBU_UNACKED) and time.monotonic() < deadline:
        time.sleep(0.1)
    parked = secure_redis.hvals(keys.KOMBU_UNACKED)
    assert not [m for m in parked if "x-python-serialize" in m], parked
    assert not parked, parked
    log = (secure_stack.settings.state_dir / "logs" / f"worker-{FAKE}-0.log").read_text()
    # Celery said why, once per message.
    assert log.count("Received invalid task message: Refusing to deserialize untrusted "
                     "content of type pickle") == 2
    alpha.delete(f"/v1/jobs/{victim}")
    print("\n[faults] 2 pickled messages injected: both refused, nothing unpickled or run; "
          "the worker went on serving")

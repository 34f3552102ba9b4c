"""Queued work survives the move of every module under `tokenq.`: what a queue message and
a job's Redis keys name does not depend on where the code lives."""

from __future__ import annotations

import base64
import json

from tokenq.shared import keys
from tokenq.shared.celery_app import GENERATE_TASK, create_celery, task_message
from tokenq.shared.settings import Settings

# As the releases before the move wrote them (the task name is a fixed string, never a
# module path), so a message enqueued by an older API is run by a newer worker.
OLD_TASK_NAME = "tokenq.generate"


def test_the_task_name_is_the_one_older_releases_enqueued() -> None:
    assert GENERATE_TASK == OLD_TASK_NAME


def test_a_queue_message_names_no_module() -> None:
    app = create_celery(Settings(redis_url="redis://127.0.0.1:6379/0"))
    raw = json.loads(task_message(app, "job-1", "tokenq.smollm2"))
    assert raw["headers"]["task"] == OLD_TASK_NAME
    body = base64.b64decode(raw["body"]).decode()
    assert json.loads(body)[0] == ["job-1"]
    text = json.dumps(raw["headers"]) + body
    for old in ("api.", "shared.", "workers.", "cli."):
        assert f'"{old}' not in text and f"tokenq.{old}" not in text


def test_job_keys_keep_their_names() -> None:
    assert keys.job("abc") == "tokenq:job:abc"

"""The API's hand-built Celery message decodes the way a Celery worker reads it."""

from __future__ import annotations

import base64
import json

from tokenq.shared.celery_app import GENERATE_TASK, create_celery, task_message
from tokenq.shared.settings import Settings


def test_task_message_is_protocol_2_json() -> None:
    app = create_celery(Settings(redis_url="redis://127.0.0.1:1/0"))
    raw = json.loads(task_message(app, "job_abc", "tokenq.m.high"))
    assert raw["content-type"] == "application/json"
    assert raw["headers"]["task"] == GENERATE_TASK
    assert raw["properties"]["delivery_info"]["routing_key"] == "tokenq.m.high"
    args, kwargs, embed = json.loads(base64.b64decode(raw["body"]))
    assert args == ["job_abc"] and kwargs == {} and set(embed) >= {"callbacks", "chain"}


def test_celery_accepts_json_only() -> None:
    app = create_celery(Settings(redis_url="redis://127.0.0.1:1/0"))
    assert app.conf.accept_content == ["json"] and app.conf.task_serializer == "json"
    assert app.conf.task_acks_late and app.conf.task_reject_on_worker_lost
    assert app.conf.worker_prefetch_multiplier == 1

"""The Celery app factory, and the task message the API writes itself.

Celery carries only the job id; the request lives in the job record. The API
does not publish through kombu (a blocking client): it builds the same
protocol-2 message kombu's Redis transport would LPUSH and writes it in the
same Lua script as the job record, so a 202 means both are in Redis.
"""

from __future__ import annotations

import base64
import logging
import uuid
from typing import Any

from celery import Celery

from tokenq.shared import keys
from tokenq.shared.jobs import dumps
from tokenq.shared.redis_conn import celery_broker
from tokenq.shared.settings import Settings

GENERATE_TASK = "tokenq.generate"

log = logging.getLogger(__name__)


def tolerate_acks_after_connection_loss() -> None:
    """Worker side: survive kombu's cleanup of a lost broker connection (Redis restarted).

    With worker_cancel_long_running_tasks_on_connection_loss=False, tasks run on while
    the consumer reconnects; kombu closes the old channel (its delivered messages stay
    in the unacked hash or go back to the queue), and a task that ends afterwards acks
    on that closed channel. kombu 5.7 then raises AttributeError (its client is gone),
    which Celery treats as unrecoverable and the worker exits (seen in `tokenq soak`
    when Redis restarted under load). Skipping that ack is what the broker would do
    anyway: the message is redelivered later and ACQUIRE drops the copy (terminal)."""
    from kombu.transport import redis as kombu_redis

    qos: Any = kombu_redis.QoS
    if getattr(qos, "_tokenq_tolerant", False):
        return
    ack, reject = qos.ack, qos.reject

    def lost(channel: Any) -> bool:
        # Closed, or being closed: kombu drops the transport's client before `closed` is set.
        return bool(channel.closed or getattr(channel.connection, "client", None) is None)

    def safe_ack(self: Any, delivery_tag: str) -> None:
        try:
            if not lost(self.channel):
                ack(self, delivery_tag)
                return
        except AttributeError:  # the client went away between the check and the call
            pass
        log.warning("ack after the broker connection was lost: message %s will be "
                    "redelivered and dropped by its job's state", delivery_tag)

    def safe_reject(self: Any, delivery_tag: str, requeue: bool = False) -> None:
        try:
            if not lost(self.channel):
                reject(self, delivery_tag, requeue=requeue)
        except AttributeError:
            pass

    restore = qos.restore_unacked

    def safe_restore(self: Any, client: Any = None) -> None:
        # Celery closes the lost connection after kombu dropped its client, and closing
        # the channel restores its delivered messages through that client: AttributeError,
        # "Unrecoverable error", worker exit. Skipped, they stay in the unacked hash that
        # the visibility-timeout sweep restores (and their tasks run on here anyway).
        try:
            restore(self, client)
        except AttributeError:
            log.warning("broker connection lost: delivered messages left to the unacked sweep")

    qos.ack, qos.reject, qos.restore_unacked = safe_ack, safe_reject, safe_restore
    qos._tokenq_tolerant = True


def create_celery(settings: Settings) -> Celery:
    # Through Sentinel: kombu's sentinel:// URL, with master_name and sentinel_kwargs below.
    url, sentinel_options = celery_broker(settings)
    app = Celery("tokenq", broker=url, set_as_current=False)
    app.conf.update(
        task_serializer="json",
        accept_content=["json"],
        result_serializer="json",
        result_backend=None,
        task_ignore_result=True,
        task_acks_late=True,
        task_reject_on_worker_lost=True,
        worker_prefetch_multiplier=1,
        task_default_queue=keys.queue(settings.default_model, "normal"),
        task_create_missing_queues=True,
        broker_connection_retry_on_startup=True,
        # Broker connection lost (Redis restarted): keep running tasks. Their acks are lost
        # with the old channel (tolerate_acks_after_connection_loss), so kombu redelivers the
        # messages; the copies find the job terminal (or leased) and drop themselves.
        # Cancelling would throw away generation that the job record and lease keep safe.
        worker_cancel_long_running_tasks_on_connection_loss=False,
        worker_hijack_root_logger=False,
        worker_send_task_events=False,
        broker_transport_options={
            # Consume a model's queues strictly in the order given: high, normal, low.
            "queue_order_strategy": "priority",
            # A job that outlives this is redelivered; the lease makes the copy drop itself.
            "visibility_timeout": settings.visibility_timeout_s,
            "unacked_restore_interval": settings.unacked_restore_s,
            "unacked_restore_throttle": 1,
            **sentinel_options,
        },
    )
    return app


def task_message(app: Celery, job_id: str, queue: str) -> str:
    """The JSON kombu's Redis transport stores in the queue list for generate(job_id): a
    message that names its job (a takeover, a preempted job, a hand-back)."""
    return _message(app, (job_id,), queue)


def ticket_message(app: Celery, queue: str) -> str:
    """A ticket: generate("", queue), "one job of this lane is ready" (the worker's pick
    chooses which: docs/scheduling.md). One per job created, so the list length is still
    the backlog."""
    return _message(app, ("", queue), queue)


def ticket_mark(queue: str) -> str:
    """What every ticket of `queue` holds and no other message does: its `argsrepr` header,
    as _message writes it (a message naming a job has the job's id there). A direct take
    (shared/lua/pick.lua) looks for it."""
    return dumps(repr(("", queue)))


def _message(app: Celery, args: tuple[str, ...], queue: str) -> str:
    task_id = str(uuid.uuid4())
    msg: Any = app.amqp.as_task_v2(
        task_id, GENERATE_TASK, args=args, kwargs={}, argsrepr=repr(args),
        kwargsrepr="{}", origin="tokenq-api",
    )
    body = base64.b64encode(dumps(list(msg.body)).encode()).decode()
    properties = dict(msg.properties)
    properties.update(
        delivery_mode=2,
        delivery_info={"exchange": "", "routing_key": queue},
        priority=0,
        body_encoding="base64",
        delivery_tag=str(uuid.uuid4()),
    )
    return dumps(
        {
            "body": body,
            "content-encoding": "utf-8",
            "content-type": "application/json",
            "headers": msg.headers,
            "properties": properties,
        }
    )

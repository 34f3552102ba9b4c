"""tokenq's Python client: submit jobs, stream their tokens across dropped connections and
API replicas (resumed with Last-Event-ID, each token delivered once), run batches.

    from tokenq.client import Client

    with Client("http://127.0.0.1:8000") as tq:          # api_key= or TOKENQ_API_KEY
        job = tq.submit("smollm2-135m-instruct", "Say hi", max_tokens=32)
        for text in tq.tokens(job.id):
            print(text, end="", flush=True)
"""

from tokenq.client._core import APIError, StreamGaveUp, TokenqError
from tokenq.client.aio import AsyncClient
from tokenq.client.models import (
    Batch,
    CancelledEvent,
    DoneEvent,
    ErrorEvent,
    Event,
    FileObject,
    Job,
    JobList,
    QueuedEvent,
    StartedEvent,
    TokenEvent,
    Usage,
)
from tokenq.client.sync import Client

__all__ = [
    "APIError",
    "AsyncClient",
    "Batch",
    "CancelledEvent",
    "Client",
    "DoneEvent",
    "ErrorEvent",
    "Event",
    "FileObject",
    "Job",
    "JobList",
    "QueuedEvent",
    "StartedEvent",
    "StreamGaveUp",
    "TokenEvent",
    "TokenqError",
    "Usage",
]

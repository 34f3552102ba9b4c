"""Every Prometheus metric tokenq exports, defined once.

Two scrape targets, so nothing needs prometheus-client's multiprocess mode:
- the API's /metrics: the cluster view, read from Redis at scrape time (queues, workers);
- each worker's own port (advertised in its heartbeat): what its engine measured.
"""

from __future__ import annotations

from prometheus_client import CollectorRegistry, Counter, Gauge, Histogram

# Buckets for LLM latencies: tens of ms (one token) to an hour (a batch line that waited
# behind a backlog: it runs within the batch's window, not within minutes).
LATENCY_BUCKETS = (0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1.0, 2.5, 5.0, 10.0, 30.0, 60.0, 120.0,
                   300.0, 600.0, 1800.0, 3600.0)
TOKEN_BUCKETS = (0.005, 0.01, 0.02, 0.04, 0.06, 0.08, 0.1, 0.15, 0.2, 0.3, 0.5, 1.0)


class ClusterMetrics:
    """Gauges the API fills from Redis for one scrape: a fresh set per scrape, never
    shared, so scrapes that overlap each see a whole view."""

    def __init__(self) -> None:
        self.registry = CollectorRegistry()
        r = self.registry
        self.queue_depth = Gauge("tokenq_queue_depth", "Jobs waiting in a queue",
                                 ["model", "priority"], registry=r)
        self.queue_oldest_age = Gauge("tokenq_queue_oldest_age_seconds",
                                      "Age of the oldest job waiting in a queue",
                                      ["model", "priority"], registry=r)
        self.workers = Gauge("tokenq_workers", "Live workers", ["model", "backend"], registry=r)
        self.running = Gauge("tokenq_num_requests_running", "Jobs in engines", ["model"],
                             registry=r)
        self.waiting = Gauge("tokenq_num_requests_waiting",
                             "Jobs queued or waiting for an engine slot", ["model"], registry=r)
        self.free_slots = Gauge("tokenq_free_slots", "Engine slots free", ["model"], registry=r)
        self.kv_cache = Gauge("tokenq_kv_cache_usage_ratio", "KV cache in use (max over workers)",
                              ["model"], registry=r)


class WorkerMetrics:
    """What one worker's engine measured, on the worker's own port."""

    def __init__(self) -> None:
        self.registry = CollectorRegistry()
        r = self.registry
        self.jobs = Counter("tokenq_jobs_total", "Jobs that reached a state here",
                            ["model", "state"], registry=r)
        self.ttft = Histogram("tokenq_time_to_first_token_seconds",
                              "From job creation to its first token", ["model"],
                              buckets=LATENCY_BUCKETS, registry=r)
        self.tpot = Histogram("tokenq_time_per_output_token_seconds",
                              "Mean time per output token after the first", ["model"],
                              buckets=TOKEN_BUCKETS, registry=r)
        self.e2e = Histogram("tokenq_e2e_request_latency_seconds",
                             "From job creation to its terminal state", ["model"],
                             buckets=LATENCY_BUCKETS, registry=r)
        self.queue_time = Histogram("tokenq_queue_time_seconds",
                                    "From job creation to its start on this worker", ["model"],
                                    buckets=LATENCY_BUCKETS, registry=r)
        self.preemptions = Counter("tokenq_preemptions_total",
                                   "Running jobs handed back for a higher-priority job",
                                   ["model"], registry=r)
        self.steps_stopped = Counter("tokenq_engine_steps_stopped_total",
                                     "Engine steps stopped under way for an interactive job "
                                     "(their rows are computed again)", ["model"], registry=r)
        self.prompt_tokens = Counter("tokenq_prompt_tokens_total", "Prompt tokens prefilled",
                                     ["model"], registry=r)
        self.generation_tokens = Counter("tokenq_generation_tokens_total", "Tokens generated",
                                         ["model"], registry=r)
        self.kv_cache = Gauge("tokenq_kv_cache_usage_ratio", "KV cache in use", ["model"],
                              registry=r)
        self.prefix_hit = Gauge("tokenq_prefix_cache_hit_ratio",
                                "Prompt tokens reused from a slot's cache / all prompt tokens",
                                ["model"], registry=r)

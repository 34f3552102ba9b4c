"""Workers: a Celery worker that owns one engine and keeps many jobs in flight."""

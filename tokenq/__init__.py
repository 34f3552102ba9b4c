"""tokenq: queue-backed LLM serving. The Python client lives in `tokenq.client`."""

from __future__ import annotations

from importlib.metadata import PackageNotFoundError, version

try:
    __version__ = version("tokenq")
except PackageNotFoundError:  # running from a checkout that is not installed
    __version__ = "0.0.0+local"

__all__ = ["__version__"]

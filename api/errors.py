"""Every error leaves the API in OpenAI's envelope: {"error": {message, type, code, param}}."""

from __future__ import annotations

import logging
from typing import Any

from fastapi import FastAPI, Request
from fastapi.exceptions import RequestValidationError
from fastapi.responses import JSONResponse
from redis.exceptions import RedisError
from starlette.exceptions import HTTPException as StarletteHTTPException

from shared.errors import TokenqError

log = logging.getLogger(__name__)


def envelope(status: int, message: str, type_: str, code: str | None,
             param: str | None = None, headers: dict[str, str] | None = None) -> JSONResponse:
    body = {"error": {"message": message, "type": type_, "code": code, "param": param}}
    return JSONResponse(body, status_code=status, headers=headers)


def _param(loc: tuple[Any, ...]) -> str | None:
    parts = [str(p) for p in loc if p not in ("body", "query", "path", "header")]
    return ".".join(parts) or None


def install(app: FastAPI) -> None:
    @app.exception_handler(TokenqError)
    async def _domain(_: Request, exc: TokenqError) -> JSONResponse:
        retry_after = getattr(exc, "retry_after", None)
        headers = {"Retry-After": str(retry_after)} if retry_after is not None else {}
        if exc.should_retry is not None:
            headers["x-should-retry"] = "true" if exc.should_retry else "false"
        return envelope(exc.status, exc.message, exc.type, exc.code, exc.param, headers)

    @app.exception_handler(RequestValidationError)
    async def _validation(_: Request, exc: RequestValidationError) -> JSONResponse:
        errs = exc.errors()
        first = errs[0] if errs else {}
        loc = tuple(first.get("loc", ()))
        if first.get("type") == "json_invalid":
            return envelope(400, "the request body is not valid JSON", "invalid_request_error",
                            "invalid_json")
        msg = "; ".join(
            f"{_param(tuple(e.get('loc', ()))) or 'body'}: {e.get('msg')}" for e in errs[:5])
        return envelope(400, msg, "invalid_request_error", "invalid_request", _param(loc))

    @app.exception_handler(StarletteHTTPException)
    async def _http(_: Request, exc: StarletteHTTPException) -> JSONResponse:
        type_ = "invalid_request_error" if exc.status_code < 500 else "server_error"
        code = {404: "not_found", 405: "method_not_allowed"}.get(exc.status_code)
        return envelope(exc.status_code, str(exc.detail), type_, code)

    @app.exception_handler(RedisError)
    async def _redis(_: Request, exc: RedisError) -> JSONResponse:
        # Redis restarting or unreachable: a retryable 503, not a 500.
        log.warning("redis unavailable: %s", exc)
        return envelope(503, "the job store is unavailable for the moment; retry",
                        "service_unavailable", "unavailable", headers={"Retry-After": "1"})

    @app.exception_handler(Exception)
    async def _unexpected(_: Request, exc: Exception) -> JSONResponse:
        log.exception("unhandled error", exc_info=exc)
        return envelope(500, "internal error", "server_error", "internal_error")

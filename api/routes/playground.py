"""GET /playground: one static page (plain HTML + JS) to try models, stream a job with
token timing, cancel it, resume it after a reload, and watch a batch. The page holds no
secret: its API calls carry the key typed into it. Off with TOKENQ_API__PLAYGROUND=false."""

from __future__ import annotations

from functools import cache
from pathlib import Path

from fastapi import APIRouter
from fastapi.responses import HTMLResponse

router = APIRouter(include_in_schema=False)
PAGE = Path(__file__).resolve().parent.parent / "static" / "playground.html"


@cache
def page() -> str:
    return PAGE.read_text(encoding="utf-8")


@router.get("/playground", response_class=HTMLResponse)
async def playground() -> HTMLResponse:
    return HTMLResponse(page(), headers={"Cache-Control": "no-store"})

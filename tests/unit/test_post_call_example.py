"""The post-call example and the demo use one schema; the example's lines are valid requests."""

from __future__ import annotations

import json
import runpy
from pathlib import Path

import jsonschema

from tokenq.api.admission import json_schema_of
from tokenq.api.openai.protocol import ChatCompletionRequest
from tokenq.cli.transcripts import SUMMARY_SCHEMA

EXAMPLE = Path(__file__).parents[2] / "examples" / "post_call"


def test_demo_and_example_share_the_schema() -> None:
    assert json.loads((EXAMPLE / "summary_schema.json").read_text()) == SUMMARY_SCHEMA
    jsonschema.Draft202012Validator.check_schema(SUMMARY_SCHEMA)


def test_example_lines_parse_as_chat_requests() -> None:
    mod = runpy.run_path(str(EXAMPLE / "submit_batch.py"))
    transcripts = sorted((EXAMPLE / "transcripts").glob("*.txt"))
    assert {p.stem[:2] for p in transcripts} == {"en", "ko"}
    for p in transcripts:
        line = mod["request_line"](p.stem, p.read_text(), "smollm2-135m-instruct", 256)
        req = ChatCompletionRequest.model_validate(line["body"])
        assert json_schema_of(req.response_format) == SUMMARY_SCHEMA
        assert p.read_text().strip() in req.messages[-1].text()

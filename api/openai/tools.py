"""Tool calling: check a request's tools, decide how the model sees them and what decoding
is constrained to, and rewrite the history for templates without tool support.

Two formats (the model registry's `tool_call_parser`):

- `generic` (llama-server's handler for templates without tool support): the tools and
  the reply shape go into a system message; an assistant turn's calls and the tools'
  results in the history become JSON text the model can read.
- `hermes`: the template renders `tools` itself (Jinja), the history's `tool_calls` and
  `tool` messages go to it as they are, and the model writes
  `<tool_call>{"name": ..., "arguments": {...}}</tool_call>`.

Decoding, per `tool_choice` (vLLM's choices for required/named, on either format):
`required` is constrained to a JSON array `[{"name", "parameters"}]`, a named function to
its parameters' schema; `auto` on `generic` to `{"tool_calls": [...]}` or
`{"response": "..."}`, on `hermes` left free and parsed; `none` renders no tools and
parses nothing. `api/openai/tool_parsers.py` reads the text back into calls.
"""

from __future__ import annotations

import json
import re
from dataclasses import dataclass, field
from typing import Any, Literal

from jsonschema.exceptions import SchemaError

from tokenq.api import lora_admin
from tokenq.api.deps import AppState
from tokenq.api.errors import InvalidRequest
from tokenq.shared import schema_keywords, schema_meta
from tokenq.shared.chat import renders_tools
from tokenq.shared.schema_budget import GrammarBudget, SchemaOverBudget, estimate, nesting
from tokenq.shared.schema_keywords import SchemaRefused
from tokenq.shared.schemas import JobRequest, NamedToolChoice, ToolDef
from tokenq.shared.settings import ModelConfig

MAX_TOOLS = 128
NAME_RE = re.compile(r"^[a-zA-Z0-9_-]{1,64}$")
# Budgets for one tool's parameters schema: a grammar is compiled from it on every
# request, so its size and nesting are bounded.
MAX_SCHEMA_CHARS = 32_768
MAX_SCHEMA_DEPTH = 16
MAX_TOOLS_CHARS = 262_144  # all tools' JSON together

Mode = Literal["none", "auto", "required", "named"]
Format = Literal["generic", "hermes"]


def check_tool_schema(schema: Any, param: str, strict: bool = False) -> dict[str, Any]:
    """One function's `parameters`: an object schema, valid JSON Schema (2020-12 meta-schema),
    within the size and depth budgets. Raises InvalidRequest (400). The one place where a
    tool schema is checked: a grammar budget check belongs here."""
    if not isinstance(schema, dict):
        raise InvalidRequest("a function's parameters must be a JSON schema object", param=param)
    if schema.get("type", "object") != "object":
        raise InvalidRequest("a function's parameters must be an object schema "
                             '({"type": "object", ...})', param=param)
    if len(json.dumps(schema)) > MAX_SCHEMA_CHARS:
        raise InvalidRequest(f"a function's parameters schema is over {MAX_SCHEMA_CHARS} "
                             "characters", param=param)
    if nesting(schema) - 1 > MAX_SCHEMA_DEPTH:  # levels below the root object
        raise InvalidRequest(f"a function's parameters schema nests deeper than "
                             f"{MAX_SCHEMA_DEPTH} levels", param=param)
    try:
        schema_meta.check(schema)  # the walk, off the loop for a heavy request
    except SchemaError as exc:
        raise InvalidRequest(f"a function's parameters are not a valid JSON schema: "
                             f"{exc.message}", param=param) from exc
    try:
        schema_keywords.check(schema, strict)
    except SchemaRefused as exc:
        raise InvalidRequest(f"a function's parameters at {exc.path}: {exc}",
                             param=param) from exc
    return schema


def validate(req: JobRequest) -> None:
    """Every check on tools, tool_choice and the tool history (400s, nothing enqueued)."""
    tools = req.tools or []
    if req.tools is not None and req.messages is None:
        raise InvalidRequest("tools need 'messages' (a chat request)", param="tools")
    if len(tools) > MAX_TOOLS:
        raise InvalidRequest(f"at most {MAX_TOOLS} tools", param="tools")
    if tools and len(json.dumps([t.model_dump() for t in tools])) > MAX_TOOLS_CHARS:
        raise InvalidRequest(f"the tools are over {MAX_TOOLS_CHARS} characters", param="tools")
    names: set[str] = set()
    for i, t in enumerate(tools):
        name = t.function.name
        if not NAME_RE.fullmatch(name):
            raise InvalidRequest(f"tools[{i}].function.name {name[:80]!r}: use 1-64 of a-z, "
                                 "A-Z, 0-9, _ and -", param=f"tools[{i}].function.name")
        if name in names:
            raise InvalidRequest(f"tools[{i}]: the function name {name!r} is given twice",
                                 param=f"tools[{i}].function.name")
        names.add(name)
        if t.function.parameters is not None:
            check_tool_schema(t.function.parameters, f"tools[{i}].function.parameters",
                              strict=t.function.strict is True)
    choice = req.tool_choice
    if choice is not None and choice != "none" and not tools:
        raise InvalidRequest("tool_choice needs tools", param="tool_choice")
    if isinstance(choice, NamedToolChoice) and choice.function.name not in names:
        raise InvalidRequest(f"tool_choice names {choice.function.name!r}, which is not "
                             "one of the tools", param="tool_choice")
    if tools and req.response_format is not None and req.response_format.type != "text" \
            and choice != "none":
        raise InvalidRequest("response_format cannot be combined with tools (the tool "
                             "calls are the constrained output)", param="response_format")
    seen: set[str] = set()
    for i, m in enumerate(req.messages or []):
        for c in m.tool_calls or []:
            seen.add(c.id)
        if m.role == "tool" and m.tool_call_id not in seen:
            raise InvalidRequest(f"messages[{i}]: tool_call_id {m.tool_call_id!r} answers no "
                                 "earlier assistant tool call", param=f"messages[{i}]")


@dataclass(slots=True)
class Plan:
    """How one request's tools are handled; the same request and model give the same
    plan in the API's submit path and in its response path."""

    mode: Mode
    fmt: Format
    parallel: bool = True
    named: str | None = None
    tools: list[ToolDef] = field(default_factory=list)

    @property
    def parses(self) -> bool:
        return self.mode != "none"


def tool_format(cfg: ModelConfig, template: str | None) -> Format:
    if cfg.tool_call_parser is not None:
        fmt: Format = cfg.tool_call_parser
    else:
        fmt = "hermes" if "<tool_call>" in (template or "") else "generic"
    # A template that cannot render tools gets them in a system message instead.
    return fmt if fmt == "generic" or renders_tools(template) else "generic"


def uses_tools(req: JobRequest) -> bool:
    """Tools, or tool calls and results in the history: a request that needs a plan."""
    return bool(req.tools) or any(m.tool_calls or m.role == "tool" for m in req.messages or [])


def plan(req: JobRequest, cfg: ModelConfig, template: str | None) -> Plan | None:
    """None: a request without tools or tool history (nothing to do)."""
    if not uses_tools(req):
        return None
    choice = req.tool_choice or ("auto" if req.tools else "none")
    mode: Mode = "named" if isinstance(choice, NamedToolChoice) else choice
    named = choice.function.name if isinstance(choice, NamedToolChoice) else None
    return Plan(mode=mode, fmt=tool_format(cfg, template),
                parallel=req.parallel_tool_calls is not False, named=named,
                tools=list(req.tools or []))


def compact(p: Plan) -> str:
    """What reading the calls back out of a job's text needs of its plan (not the tools:
    the parsers take the names from the text), kept in the job's record (`tool_plan`)."""
    return json.dumps({"mode": p.mode, "fmt": p.fmt, "parallel": p.parallel,
                       "named": p.named})


def from_compact(raw: str | None) -> Plan | None:
    """A record's `tool_plan` (None: the job had no tools): a batch line's output is built
    from its record, without its request (which holds the tools, up to 256 KB a line)."""
    if not raw:
        return None
    d = json.loads(raw)
    return Plan(mode=d["mode"], fmt=d["fmt"], parallel=d["parallel"], named=d["named"])


def _params(t: ToolDef) -> dict[str, Any]:
    return t.function.parameters or {"type": "object", "properties": {}}


def _hoist_defs(tools: list[ToolDef]) -> tuple[list[dict[str, Any]], dict[str, Any]]:
    """Each tool's parameters without `$defs`, and those definitions merged for the root of
    a schema that nests the parameters (a `#/$defs/...` reference points at the root), as
    vLLM does; one name defined two ways is a 400."""
    params: list[dict[str, Any]] = []
    defs: dict[str, Any] = {}
    for t in tools:
        p = dict(_params(t))
        for name, d in (p.pop("$defs", None) or {}).items():
            if defs.get(name, d) != d:
                raise InvalidRequest(f"the tools define $defs/{name} in two different ways",
                                     param="tools")
            defs[name] = d
        params.append(p)
    return params, defs


def constraint(p: Plan) -> dict[str, Any] | None:
    """The JSON schema decoding is constrained to (None: free text)."""
    if p.mode == "named":
        return _params(next(t for t in p.tools if t.function.name == p.named))
    if p.mode == "required" or (p.mode == "auto" and p.fmt == "generic"):
        key = "parameters" if p.mode == "required" else "arguments"
        params, defs = _hoist_defs(p.tools)
        items = [{"type": "object", "properties": {"name": {"const": t.function.name},
                                                   key: ps},
                  "required": ["name", key], "additionalProperties": False}
                 for t, ps in zip(p.tools, params, strict=True)]
        calls: dict[str, Any] = {"type": "array", "minItems": 1,
                                 "items": items[0] if len(items) == 1 else {"anyOf": items}}
        if not p.parallel:
            calls["maxItems"] = 1
        root: dict[str, Any] = {"$defs": defs} if defs else {}
        if p.mode == "required":
            return {**calls, **root}
        return {**root, "anyOf": [
            {"type": "object", "properties": {"tool_calls": calls},
             "required": ["tool_calls"], "additionalProperties": False},
            {"type": "object", "properties": {"response": {"type": "string"}},
             "required": ["response"], "additionalProperties": False}]}
    return None


def checked_constraint(p: Plan, budget: GrammarBudget) -> dict[str, Any] | None:
    """constraint(p), within the grammar budgets (shared/schema_budget.py) that every
    schema decoding is constrained to must meet: over one, a 400 before anything is
    enqueued (a tool's `maxLength: 20000` would crash llama.cpp's grammar builder)."""
    schema = constraint(p)
    if schema is not None:
        try:
            estimate(schema, budget)
        except SchemaOverBudget as exc:
            raise InvalidRequest(f"the tools' parameter schemas are over this server's grammar "
                                 f"budget at {exc.path}: {exc}", param="tools",
                                 code="schema_too_complex") from exc
    return schema


def _instruction(p: Plan) -> str:
    lines = ["You can call the following tools (JSON Schema of each one's arguments):"]
    for t in p.tools:
        f = t.function
        lines.append(json.dumps({"name": f.name, "description": f.description or "",
                                 "parameters": _params(t)}))
    if p.mode == "named":
        lines.append(f"Call the tool `{p.named}`: reply with its arguments only, as one "
                     "JSON object.")
    elif p.mode == "required":
        lines.append('Reply with a JSON array of tool calls, e.g. [{"name": "<tool name>", '
                     '"parameters": {...}}].')
    else:
        lines.append("Respond in JSON format, either with `tool_calls` (a request to call "
                     "tools) or with `response` (your reply to the user), e.g. "
                     '{"tool_calls": [{"name": "<tool name>", "arguments": {...}}]} or '
                     '{"response": "<your reply>"}.')
    return "\n".join(lines)


def _arguments(text: Any) -> Any:
    if not isinstance(text, str):
        return text
    try:
        return json.loads(text)
    except ValueError:
        return text


def render(p: Plan, messages: list[dict[str, Any]]
           ) -> tuple[list[dict[str, Any]], list[dict[str, Any]] | None]:
    """(messages for the template, `tools` for the template or None)."""
    if p.fmt == "hermes":
        out = []
        for m in messages:
            m = {k: v for k, v in m.items() if v is not None}
            if m.get("tool_calls"):
                m["content"] = m.get("content") or ""
                m["tool_calls"] = [{**c, "function": {**c["function"], "arguments":
                                                      _arguments(c["function"]["arguments"])}}
                                   for c in m["tool_calls"]]
            out.append(m)
        tools = [t.model_dump(exclude_none=True) for t in p.tools] if p.mode != "none" else None
        return out, tools
    names = {c["id"]: c["function"]["name"] for m in messages for c in m.get("tool_calls") or []}
    out = []
    for m in messages:
        if m.get("tool_calls"):
            calls = [{"name": c["function"]["name"],
                      "arguments": _arguments(c["function"]["arguments"])}
                     for c in m["tool_calls"]]
            text = ((m.get("content") or "") + "\n").lstrip() + json.dumps({"tool_calls": calls})
            out.append({"role": "assistant", "content": text})
        elif m["role"] == "tool":
            out.append({"role": "user", "content": json.dumps({"tool_response": {
                "tool": names.get(m.get("tool_call_id") or "", m.get("name") or ""),
                "tool_call_id": m.get("tool_call_id"), "content": m.get("content")}})})
        else:
            out.append({"role": m["role"], "content": m.get("content") or ""})
    if p.mode != "none" and p.tools:
        text = _instruction(p)
        if out and out[0]["role"] == "system":
            out[0] = {"role": "system", "content": f"{out[0]['content']}\n\n{text}"}
        else:
            out.insert(0, {"role": "system", "content": text})
    return out, None


async def template_of(state: AppState, model: str, cfg: ModelConfig) -> str | None:
    """The model's chat template where this API host has its tokenizer (None: not here,
    so the generic format, which needs no template support)."""
    try:
        return (await state.counter.exact(model, cfg)).chat_template
    except LookupError:
        return None


async def plan_for(state: AppState, tenant: str, req: JobRequest) -> Plan | None:
    """The plan of a request whose model was already resolved by its submit."""
    if req.messages is None or not uses_tools(req):  # most requests: no lookups at all
        return None
    base, cfg = req.model, state.models.get(req.model)
    if cfg is None:
        found = await lora_admin.resolve(state, req.model, tenant)
        if found is None:
            return None
        base, cfg = found[0], state.models[found[0]]
    return plan(req, cfg, await template_of(state, base, cfg))

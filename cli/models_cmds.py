"""`tokenq models deploy|show|switch|retire`: the model catalogue over the API (an admin
key: --api-key or TOKENQ_API_KEY; --url or TOKENQ_BASE_URL). See docs/models.md."""

from __future__ import annotations

import json
from typing import Annotated, Any

import httpx
import typer

from tokenq.cli.client_cmds import JsonOpt, KeyOpt, UrlOpt, _errors
from tokenq.client import APIError, Client

SetOpt = Annotated[list[str] | None, typer.Option(
    "--set", help="a load-request field, KEY=VALUE (VALUE read as JSON when it parses: "
    "n_ctx=4096, temperature=0.2, stop='[\"\\n\"]'); repeatable")]


def _fields(pairs: list[str] | None) -> dict[str, Any]:
    out: dict[str, Any] = {}
    for pair in pairs or []:
        key, sep, value = pair.partition("=")
        if not sep or not key:
            raise typer.BadParameter(f"{pair!r}: expected KEY=VALUE", param_hint="--set")
        try:
            out[key] = json.loads(value)
        except ValueError:
            out[key] = value
    return out


def _call(url: str | None, api_key: str | None, method: str, path: str,
          **kw: Any) -> dict[str, Any]:
    with Client(url, api_key=api_key) as c:
        resp: httpx.Response = c._request(method, path, retry=method == "GET", **kw)
    if resp.status_code >= 400:
        raise APIError.from_response(resp)
    out: dict[str, Any] = resp.json()
    return out


def _print(model: dict[str, Any], as_json: bool) -> None:
    if as_json:
        typer.echo(json.dumps(model, indent=2))
        return
    if "version" not in model:  # OpenAI's model object: what a key without admin sees
        typer.echo(f"{model['id']}\tmax_model_len {model.get('max_model_len')}\t(state, "
                   "version and workers: an admin key)")
        return
    typer.echo(f"{model['id']}\tversion {model.get('version')}\t{model.get('state')}\t"
               f"{model.get('backend')}\tworkers: {len(model.get('workers') or [])}"
               + (f"\terror: {model['error']}" if model.get("error") else ""))


def register(app: typer.Typer) -> None:
    @app.command("deploy")
    def deploy(
        name: Annotated[str, typer.Argument(help="the name jobs will use as `model`")],
        model_path: Annotated[str, typer.Argument(
            help="a GGUF file (llama.cpp) or a Hugging Face folder (vLLM), as the workers "
            "see it")],
        backend: Annotated[str, typer.Option(help="auto | llama | vllm")] = "auto",
        embedding: Annotated[bool, typer.Option(
            "--embedding", help="server_type embedding")] = False,
        keep_alive: Annotated[float | None, typer.Option(
            "--keep-alive", help="seconds idle before it is unloaded (0: never)")] = None,
        fields: SetOpt = None, url: UrlOpt = None, api_key: KeyOpt = None,
        as_json: JsonOpt = False,
    ) -> None:
        """Add a model to the catalogue: it loads when its first job comes."""
        body = {"name": name, "model_path": model_path, "backend": backend,
                "server_type": "embedding" if embedding else "llm", **_fields(fields)}
        if keep_alive is not None:
            body["keep_alive_s"] = keep_alive
        with _errors(url):
            _print(_call(url, api_key, "POST", "/v1/models", json=body), as_json)

    @app.command("show")
    def show(name: str, url: UrlOpt = None, api_key: KeyOpt = None,
             as_json: JsonOpt = False) -> None:
        """A model's state, version, workers (and, for admin keys, its spec)."""
        with _errors(url):
            _print(_call(url, api_key, "GET", f"/v1/models/{name}"), as_json)

    @app.command("switch")
    def switch(
        name: str,
        backend: Annotated[str | None, typer.Option(help="auto | llama | vllm")] = None,
        model_path: Annotated[str | None, typer.Option("--model-path")] = None,
        keep_alive: Annotated[float | None, typer.Option("--keep-alive")] = None,
        fields: SetOpt = None, url: UrlOpt = None, api_key: KeyOpt = None,
        as_json: JsonOpt = False,
    ) -> None:
        """A new version of a model (PATCH): another backend, weights or knobs."""
        body = _fields(fields)
        for key, value in (("backend", backend), ("model_path", model_path),
                           ("keep_alive_s", keep_alive)):
            if value is not None:
                body[key] = value
        if not body:
            raise typer.BadParameter("nothing to change: give --backend, --model-path, "
                                     "--keep-alive or --set")
        with _errors(url):
            _print(_call(url, api_key, "PATCH", f"/v1/models/{name}", json=body), as_json)

    @app.command("retire")
    def retire(
        name: str,
        queued: Annotated[str, typer.Option(
            help="finish: queued jobs run first; fail: they end with model_retired")]
        = "finish",
        url: UrlOpt = None, api_key: KeyOpt = None, as_json: JsonOpt = False,
    ) -> None:
        """Take a model out of the catalogue: new jobs are refused at once."""
        with _errors(url):
            _print(_call(url, api_key, "DELETE", f"/v1/models/{name}",
                         params={"queued": queued}), as_json)

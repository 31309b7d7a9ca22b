"""The OpenAPI 3.1 document, built from the route table and the pydantic contract.

Each view says what it reads and answers with ``@operation(...)``; ``document(app)``
walks ``app.url_map`` and turns those declarations into paths and the models into
components, so the document follows the code. ``docs/openapi.json`` is a copy that a
test compares with the built one.
"""

from __future__ import annotations

import dataclasses
import importlib.metadata
import re
from collections.abc import Callable
from collections.abc import Mapping
from typing import Any
from typing import TypeVar

from flask import Flask
from pydantic import BaseModel
from pydantic import TypeAdapter
from pydantic.json_schema import JsonSchemaMode
from pydantic.json_schema import JsonSchemaValue
from pydantic.json_schema import models_json_schema
from werkzeug.routing import Rule

from collector.contract import ErrorResponse
from collector.contract import Identifier
from collector.credentials import READ_METHODS
from collector.guard import OPEN_PATHS
from collector.guard import open_paths

REF = "#/components/schemas/{model}"
# Media types, and the schemas of bodies that are not JSON.
JSON = "application/json"
BINARY = "application/octet-stream"
EVENT_STREAM = "text/event-stream"
RAW = {"type": "string", "format": "binary"}
SSE = {"type": "string", "description": "server-sent events: `job-event` frames, heartbeats and comments"}
PAGE = {"type": "string"}

# What every route may answer besides its own statuses, by what it does.
_DESCRIPTIONS = {
    400: "malformed request (bad JSON, short body)",
    401: "missing or wrong bearer token",
    403: "the credential's role or cluster scope does not allow the request",
    404: "no such job or file",
    409: "conflict: the job id is on several clusters, or bytes differ from those stored",
    413: "body over the 1 MiB limit",
    422: "a field, query parameter or path value is invalid",
    503: "database unavailable, or no stream slot free; retry",
}

Content = Mapping[str, Any]  # media type -> model class or JSON schema
# A model (and its mode) to its JSON schema ref, as models_json_schema answers; keyed by the model class.
Refs = Mapping[tuple[Any, JsonSchemaMode], JsonSchemaValue]
View = TypeVar("View", bound=Callable[..., object])


@dataclasses.dataclass(frozen=True)
class Operation:
    """What one view reads and answers."""

    responses: Mapping[int, type[BaseModel] | Content]
    query: type[BaseModel] | None = None
    body: Content | None = None
    errors: tuple[int, ...] = ()
    headers: Mapping[str, str] = dataclasses.field(default_factory=dict)


def served(app: Flask) -> dict[str, Any]:
    """The document of ``app``, built on first use (the route table is fixed by then)."""
    cached = app.extensions.get("collector.openapi")
    if cached is None:
        cached = app.extensions["collector.openapi"] = document(app)
    return cached


def operation(**declared: Any) -> Callable[[View], View]:
    """Declare a view's query model, body, responses and own error statuses."""

    def mark(view: View) -> View:
        # A function attribute, read back with getattr() by document() and _models().
        view.openapi = Operation(**declared)  # type: ignore[attr-defined]
        return view

    return mark


def document(app: Flask) -> dict[str, Any]:
    """The OpenAPI document of ``app``'s routes (every route must be declared)."""
    refs, top = models_json_schema(_models(app), ref_template=REF)
    components = top.get("$defs", {})
    settings = app.config.get("COLLECTOR_SETTINGS")
    # Which routes need no token depends on settings (COLLECTOR_METRICS_AUTH), as in the guard.
    builder = _Builder(refs, components, open_paths(settings) if settings else OPEN_PATHS)
    paths: dict[str, dict[str, Any]] = {}
    for rule in sorted(app.url_map.iter_rules(), key=lambda r: r.rule):
        view = app.view_functions[rule.endpoint]
        declared: Operation | None = getattr(view, "openapi", None)
        if declared is None:
            raise LookupError(f"route {rule.rule} ({rule.endpoint}) has no @operation declaration")
        path = re.sub(r"<(?:[^:>]+:)?([^>]+)>", r"{\1}", rule.rule)
        # Flask gives every rule its methods; None only for a bare werkzeug Rule.
        for method in sorted((rule.methods or set()) - {"HEAD", "OPTIONS"}):
            paths.setdefault(path, {})[method.lower()] = builder.operation(rule, method, view, declared)
    for name in builder.carriers:
        del components[name]
    return {
        "openapi": "3.1.0",
        "info": {
            "title": "collector",
            "version": importlib.metadata.version("collector"),
            "description": "The srtctl Status API v1 and its extensions; see docs/api.md.",
        },
        "paths": paths,
        "components": {
            "schemas": dict(sorted(components.items())),
            "securitySchemes": {"bearer": {"type": "http", "scheme": "bearer"}},
        },
        "security": [{"bearer": []}],
    }


def _models(app: Flask) -> list[tuple[type[BaseModel], JsonSchemaMode]]:
    seen: dict[tuple[type[BaseModel], JsonSchemaMode], None] = {(ErrorResponse, "serialization"): None}
    for view in app.view_functions.values():
        declared: Operation | None = getattr(view, "openapi", None)
        if declared is None:
            continue
        if declared.query is not None:
            seen[(declared.query, "validation")] = None
        for content in (declared.body or {}).values():
            if isinstance(content, type):
                seen[(content, "validation")] = None
        for answer in declared.responses.values():
            for content in (answer.values() if isinstance(answer, Mapping) else [answer]):
                for model in (content if isinstance(content, tuple) else (content,)):
                    if isinstance(model, type):
                        seen[(model, "serialization")] = None
    return list(seen)


class _Builder:
    """Turns declarations into OpenAPI objects, with refs into the shared components."""

    def __init__(self, refs: Refs, components: dict[str, Any], open_routes: frozenset[str] = OPEN_PATHS) -> None:
        self.open_routes = open_routes
        self.refs = refs
        self.components = components
        self.carriers: set[str] = set()

    def operation(self, rule: Rule, method: str, view: Callable[..., object], declared: Operation) -> dict[str, Any]:
        """The OpenAPI operation of ``view`` on ``rule`` for ``method``."""
        open_route = rule.rule in self.open_routes
        summary, _, description = _markdown(view.__doc__ or "").strip().partition("\n")
        # From method and path, not the endpoint: one view can serve several paths (the page).
        operation_id = "_".join([method.lower(), *(re.findall(r"[a-z0-9]+", rule.rule.lower()) or ["root"])])
        result: dict[str, Any] = {"operationId": operation_id, "summary": summary.strip()}
        if description.strip():
            result["description"] = description.strip()
        if open_route:
            result["security"] = []
        parameters = [_path_parameter(name) for name in sorted(rule.arguments)]
        if declared.query is not None:
            parameters += self.query_parameters(declared.query)
        parameters += [{"name": name, "in": "header", "required": False, "description": text,
                        "schema": {"type": "string"}} for name, text in declared.headers.items()]
        if parameters:
            result["parameters"] = parameters
        if declared.body is not None:
            result["requestBody"] = {"required": True, "content": {
                media: {"schema": self.schema(content, "validation")} for media, content in declared.body.items()}}
        responses = {str(status): self.response(answer) for status, answer in declared.responses.items()}
        errors = set(declared.errors) | {503}
        if parameters or declared.body is not None:
            errors.add(422)
        if declared.body is not None:
            errors |= {400, 413}
        if not open_route:
            errors.add(401)
            if method not in READ_METHODS:
                errors.add(403)
        envelope = {"application/json": {"schema": self.schema(ErrorResponse, "serialization")}}
        for status in sorted(errors - set(declared.responses)):
            responses[str(status)] = {"description": _DESCRIPTIONS[status], "content": envelope}
        result["responses"] = responses
        return result

    def query_parameters(self, model: type[BaseModel]) -> list[dict[str, Any]]:
        """One query parameter per field of ``model``."""
        # The query model is only a carrier of its fields, so it leaves the components.
        name = self.refs[(model, "validation")]["$ref"].rsplit("/", 1)[-1]
        self.carriers.add(name)
        schema = self.components[name]
        required = set(schema.get("required", ()))
        parameters = []
        for field, field_schema in schema.get("properties", {}).items():
            field_schema = _without_null(dict(field_schema))
            field_schema.pop("title", None)
            parameter = {"name": field, "in": "query", "required": field in required, "schema": field_schema}
            description = field_schema.pop("description", None)
            if description:
                parameter["description"] = description
            parameters.append(parameter)
        return parameters

    def schema(self, content: Any, mode: JsonSchemaMode) -> dict[str, Any]:
        """A model's ref, a oneOf for a tuple of models, or a literal schema."""
        if isinstance(content, type) and issubclass(content, BaseModel):
            return dict(self.refs[(content, mode)])
        if isinstance(content, tuple):
            return {"oneOf": [self.schema(item, mode) for item in content]}
        return dict(content)

    def response(self, answer: type[BaseModel] | Content) -> dict[str, Any]:
        """A success response: a model as JSON, or media types mapped to contents."""
        if isinstance(answer, Mapping):
            content = {media: {"schema": self.schema(item, "serialization")} for media, item in answer.items()}
            return {"description": "OK", "content": content}
        description = _markdown(answer.__doc__ or "OK").strip().splitlines()[0]
        schema = self.schema(answer, "serialization")
        return {"description": description, "content": {"application/json": {"schema": schema}}}


def _markdown(docstring: str) -> str:
    # Docstrings quote code the reStructuredText way; OpenAPI descriptions are Markdown.
    return docstring.replace("``", "`")


def _path_parameter(name: str) -> dict[str, Any]:
    schema = TypeAdapter(Identifier).json_schema() if name == "job_id" else {"type": "string"}
    if name == "webhook_id":
        schema = {"type": "integer", "minimum": 1}
    return {"name": name, "in": "path", "required": True, "schema": schema}


def _without_null(schema: dict[str, Any]) -> dict[str, Any]:
    # An absent parameter is the None of an optional field: a query string cannot carry null.
    options = schema.get("anyOf")
    if options:
        kept = [option for option in options if option.get("type") != "null"]
        del schema["anyOf"]
        if len(kept) == 1:
            schema.update(kept[0])
        else:
            schema["anyOf"] = kept
    if "default" in schema and schema["default"] is None:
        del schema["default"]
    return schema

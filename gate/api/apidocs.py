"""`/v1/docs`: the API described for people, rendered here from the app's own OpenAPI document.

FastAPI's docs page loads Swagger UI's script and style from a CDN: blank on an air-gapped
cluster (where GPU fleets often are), and a third party's script on the origin where the
pages' sessions live, without integrity or CSP. The one package that bundles Swagger UI for
pip (`swagger-ui-bundle` 1.1.0) ships Swagger UI 4.15.5 of 2022, and Swagger UI needs inline
script and, in places, `unsafe-eval` under a CSP (swagger-ui issues 5817, 7540). So the page
is plain HTML made by a template of our own (gate/web/templates/api_docs.html.j2), served as
the report pages are (gate.web.pages: the same CSP, no script at all), from the package's own
files. Tools read `/v1/openapi.json`. GATE_API_DOCS=false hides both (404).
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass, field
from typing import Any

from fastapi import APIRouter, Request
from fastapi.responses import Response

router = APIRouter(include_in_schema=False)

METHODS = ("get", "post", "put", "patch", "delete")
REF = "#/components/schemas/"


@dataclass(frozen=True)
class Param:
    name: str
    where: str
    required: bool
    type: str
    description: str


@dataclass(frozen=True)
class Operation:
    method: str
    path: str
    anchor: str
    summary: str
    description: str
    tag: str
    params: list[Param]
    body: str | None
    responses: list[tuple[str, str, str | None]]  # (status, description, type)


@dataclass(frozen=True)
class Schema:
    name: str
    description: str
    fields: list[Param] = field(default_factory=list)


def type_of(schema: Mapping[str, Any]) -> str:
    """A schema in a few words: `GateView`, `list of string`, `string or null`, `one of a, b`."""
    if "$ref" in schema:
        return str(schema["$ref"]).removeprefix(REF)
    if "enum" in schema:
        return "one of " + ", ".join(str(v) for v in schema["enum"])
    if "const" in schema:
        return f"'{schema['const']}'"
    for key in ("anyOf", "oneOf", "allOf"):
        if key in schema:
            return " or ".join(dict.fromkeys(type_of(s) for s in schema[key]))
    kind = schema.get("type")
    if kind == "array":
        return "list of " + type_of(schema.get("items", {}))
    if kind == "object" and isinstance(schema.get("additionalProperties"), Mapping):
        return "map of " + type_of(schema["additionalProperties"])
    if isinstance(kind, str):
        fmt = schema.get("format")
        return f"{kind} ({fmt})" if fmt else kind
    return "any"


def _schema_of(part: Mapping[str, Any]) -> Mapping[str, Any] | None:
    """The schema of a request body's or an answer's first content type, if it has one."""
    for media in part.get("content", {}).values():
        schema: Mapping[str, Any] | None = media.get("schema")
        return schema
    return None


def operations(doc: Mapping[str, Any]) -> list[Operation]:
    out: list[Operation] = []
    for path, item in doc.get("paths", {}).items():
        for method in METHODS:
            op = item.get(method)
            if op is None:
                continue
            body_schema = _schema_of(op.get("requestBody", {}))
            responses = []
            for status, resp in op.get("responses", {}).items():
                schema = _schema_of(resp)
                responses.append(
                    (
                        str(status),
                        str(resp.get("description", "")),
                        type_of(schema) if schema else None,
                    )
                )
            out.append(
                Operation(
                    method=method.upper(),
                    path=path,
                    anchor=f"{method}-{path}".replace("/", "-").strip("-"),
                    summary=str(op.get("summary", "")),
                    description=str(op.get("description", "")),
                    tag=str((op.get("tags") or ["other"])[0]),
                    params=[
                        Param(
                            name=str(p["name"]),
                            where=str(p.get("in", "")),
                            required=bool(p.get("required")),
                            type=type_of(p.get("schema", {})),
                            description=str(p.get("description", "")),
                        )
                        for p in op.get("parameters", [])
                    ],
                    body=type_of(body_schema) if body_schema else None,
                    responses=responses,
                )
            )
    return out


def schemas(doc: Mapping[str, Any]) -> list[Schema]:
    out = []
    for name, schema in sorted(doc.get("components", {}).get("schemas", {}).items()):
        required = set(schema.get("required", []))
        out.append(
            Schema(
                name=name,
                description=str(schema.get("description", "")),
                fields=[
                    Param(
                        name=prop,
                        where="",
                        required=prop in required,
                        type=type_of(sub),
                        description=str(sub.get("description", "")),
                    )
                    for prop, sub in schema.get("properties", {}).items()
                ],
            )
        )
    return out


@router.get("/docs")
def docs(request: Request) -> Response:
    """The docs page: every operation (method, path, parameters, body, answers) and every
    schema, linked by name; the same CSP and headers as the report pages."""
    from gate.web.pages import _page

    doc = request.app.openapi()
    ops = operations(doc)
    tags = list(dict.fromkeys(op.tag for op in ops))
    return _page(
        request,
        "api_docs.html.j2",
        title="API",
        info=doc.get("info", {}),
        tags=tags,
        operations=ops,
        schemas=schemas(doc),
        schema_names={s for s in doc.get("components", {}).get("schemas", {})},
    )

"""Reading request bodies with a ceiling: the forms' and the JSON API's.

A body is read in chunks and refused once past the limit, so a client
cannot make the server buffer more than the engine would ever accept as a
signal payload. Forms are plain URL-encoded (the pages send nothing else),
parsed with the standard library.
"""

from __future__ import annotations

import json
from typing import Any
from urllib.parse import parse_qs

from starlette.exceptions import HTTPException
from starlette.requests import Request

from celery_durable.web.problems import BadRequest

FORM_TYPE = "application/x-www-form-urlencoded"
JSON_TYPE = "application/json"
MAX_FORM_FIELDS = 32


async def read_body(request: Request, limit: int) -> bytes:
    declared = request.headers.get("content-length", "")
    if declared.isdigit() and int(declared) > limit:
        raise HTTPException(413, f"The request body is larger than {limit} bytes")
    chunks: list[bytes] = []
    size = 0
    async for chunk in request.stream():
        size += len(chunk)
        if size > limit:
            raise HTTPException(413, f"The request body is larger than {limit} bytes")
        chunks.append(chunk)
    return b"".join(chunks)


def media_type(request: Request) -> str:
    return request.headers.get("content-type", "").split(";", 1)[0].strip().lower()


async def read_form(request: Request, limit: int) -> dict[str, str]:
    """The form's fields, the first value of each."""
    fields = await read_form_lists(request, limit)
    return {name: values[0] for name, values in fields.items()}


async def read_form_lists(request: Request, limit: int, max_fields: int = MAX_FORM_FIELDS) -> dict[str, list[str]]:
    """The form's fields, every value of each (a bulk action's selected runs)."""
    if media_type(request) != FORM_TYPE:
        raise HTTPException(415, f"Forms must be sent as {FORM_TYPE}")
    body = await read_body(request, limit)
    try:
        return parse_qs(body.decode("utf-8"), keep_blank_values=True, max_num_fields=max_fields)
    except (UnicodeDecodeError, ValueError) as exc:
        raise BadRequest(f"The form could not be read: {exc}") from None


async def read_json(request: Request, limit: int) -> dict[str, Any]:
    """A JSON object body (``{}`` for an action without options).

    Only ``application/json`` is accepted, even for an empty body: a
    cross-site form cannot send that type without a CORS preflight, which
    this server never grants. A second wall behind the API's CSRF check
    (``api.act``), which a request passes before its body is read.
    """
    if media_type(request) != JSON_TYPE:
        raise HTTPException(415, f"The API's POSTs take {JSON_TYPE} bodies (send {{}} for no options)")
    body = await read_body(request, limit)
    try:
        data = json.loads(body) if body.strip() else {}
    except (UnicodeDecodeError, json.JSONDecodeError) as exc:
        raise BadRequest(f"The body is not valid JSON: {exc}") from None
    if not isinstance(data, dict):
        raise BadRequest("The body must be a JSON object")
    return data

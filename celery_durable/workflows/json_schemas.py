"""JSON Schemas the user gives (``args_schema``, ``ctx.agent``'s ``schema``): what
the metaschema check cannot see.

A schema can pass its metaschema and still hold a ``$ref`` that points
nowhere; jsonschema follows it only when an instance reaches it, so the
failure came late and in jsonschema's private referencing error: a
``start_workflow`` that raised it instead of a ``ValueError``, an agent task
that died on it every time. And a remote ``$ref`` made jsonschema fetch it
over HTTP. Refs are resolved here, within the schema and the metaschemas
only; nothing is fetched.
"""

from __future__ import annotations

import contextlib
from collections.abc import Mapping
from typing import Any

import jsonschema
import jsonschema.protocols
import jsonschema.validators
import referencing
import referencing.exceptions
import referencing.jsonschema
from jsonschema_specifications import REGISTRY as METASCHEMAS  # type: ignore[import-untyped]  # jsonschema's own dependency


def validator_for(schema: Mapping[str, Any]) -> type[jsonschema.protocols.Validator]:
    """The draft ``schema``'s own ``$schema`` declares; 2020-12 where it declares
    none. One rule for ``args_schema`` and for ``ctx.agent``'s ``schema``, at
    the call and in the agent task that checks the output."""
    return jsonschema.validators.validator_for(dict(schema), default=jsonschema.Draft202012Validator)


def unresolved_ref(validator: type[jsonschema.protocols.Validator], schema: Mapping[str, Any]) -> str | None:
    """The first ``$ref`` of ``schema``, read as ``validator``'s draft, that
    resolves neither within it nor to a metaschema; None when every one does."""
    dialect = validator.META_SCHEMA.get("$id") or validator.META_SCHEMA.get("id") or ""
    specification = referencing.jsonschema.specification_with(dialect, default=referencing.Specification.OPAQUE)
    root = specification.create_resource(dict(schema))
    uri = root.id() or ""
    registry = METASCHEMAS.with_resource(uri, root)
    # Crawled once: a registry not crawled crawls the whole schema again at
    # each lookup of an anchor or an embedded $id, quadratic in the schema.
    # An $id that is no URI stops it: the lookups that need it then fail, as jsonschema's would.
    with contextlib.suppress(ValueError):
        registry = registry.crawl()
    stack = [(registry.resolver(uri), root)]
    while stack:
        resolver, resource = stack.pop()
        ref = resource.contents.get("$ref") if isinstance(resource.contents, dict) else None
        if isinstance(ref, str):
            try:
                resolver.lookup(ref)
            # Not only Unresolvable: a pointer through a boolean schema or
            # into a string is referencing's own TypeError or ValueError.
            except (referencing.exceptions.Unresolvable, LookupError, TypeError, ValueError):
                return ref
        stack.extend((resolver.in_subresource(sub), sub) for sub in resource.subresources())
    return None

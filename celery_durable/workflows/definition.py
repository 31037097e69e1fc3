"""Defining a workflow: meta validated eagerly, an immutable handle (SPEC §2)."""

from __future__ import annotations

import hashlib
import inspect
import json
import marshal
import re
from collections.abc import Callable, Iterable, Mapping
from dataclasses import dataclass
from types import MappingProxyType
from typing import TYPE_CHECKING, Any

import jsonschema
import jsonschema.exceptions

from celery_durable.errors import WorkflowDefinitionError
from celery_durable.workflows.jsonvalue import short_repr
from celery_durable.workflows.limits import validate_limits

if TYPE_CHECKING:
    from celery_durable.workflows.context import WorkflowContext

RunFunction = Callable[["WorkflowContext"], Any]

NAME_PATTERN = re.compile(r"[A-Za-z0-9._-]{1,128}")
META_KEYS = ("name", "description", "phases", "limits", "args_schema")
PHASE_KEYS = ("title", "detail")


@dataclass(frozen=True, slots=True)
class Phase:
    phase_id: str
    title: str
    detail: str | None


@dataclass(frozen=True, slots=True, eq=False)
class Workflow:
    """A validated workflow: its meta, its ``run`` function and its code hash."""

    name: str
    description: str
    phases: tuple[Phase, ...]
    limits: Mapping[str, Any]
    args_schema: Mapping[str, Any] | None
    run: RunFunction
    code_hash: str

    def phase_named(self, title: str) -> Phase | None:
        for phase in self.phases:
            if phase.title == title:
                return phase
        return None

    def validate_args(self, args: Any) -> None:
        """Check ``args`` against ``args_schema``; the error names the failing path."""
        if self.args_schema is None:
            return
        validator = jsonschema.Draft202012Validator(dict(self.args_schema))
        error = jsonschema.exceptions.best_match(validator.iter_errors(args))
        if error is not None:
            path = "$" + "".join(f"[{part!r}]" for part in error.absolute_path)
            raise ValueError(f"Workflow {self.name!r} args do not match args_schema at {path}: {error.message}")

    def __repr__(self) -> str:
        return f"Workflow(name={self.name!r})"


def define_workflow(meta: Mapping[str, Any], run: RunFunction) -> Workflow:
    """Validate ``meta`` and return an immutable handle; ``run`` is stored as is."""
    if not isinstance(meta, Mapping):
        raise WorkflowDefinitionError(f"Workflow meta must be a dict, got {type(meta).__name__}")
    if not callable(run):
        raise WorkflowDefinitionError(f"Workflow run must be callable, got {type(run).__name__}")
    for key in meta:
        if key not in META_KEYS:
            raise WorkflowDefinitionError(f"Unknown key in workflow meta: {_key(key)}")
    name = _required_text(meta, "name")
    if not NAME_PATTERN.fullmatch(name):
        raise WorkflowDefinitionError(
            f"Workflow name must be at most 128 characters of [A-Za-z0-9._-]: {short_repr(name)}"
        )
    description = _required_text(meta, "description")
    if "phases" not in meta:
        raise WorkflowDefinitionError("Workflow meta is missing required key: phases")
    phases = _phases(meta["phases"])
    limits = validate_limits(meta.get("limits", {}), allow_none=False, where="limits")
    args_schema = _args_schema(meta.get("args_schema"))
    canonical = {
        "name": name,
        "description": description,
        "phases": [{"title": p.title, "detail": p.detail} for p in phases],
        "limits": limits,
        "args_schema": args_schema,
    }
    return Workflow(
        name=name,
        description=description,
        phases=phases,
        limits=MappingProxyType(limits),
        args_schema=MappingProxyType(args_schema) if args_schema is not None else None,
        run=run,
        code_hash=code_hash(run, canonical),
    )


def workflow(
    *,
    name: str,
    description: str,
    phases: Iterable[Mapping[str, Any]],
    limits: Mapping[str, Any] | None = None,
    args_schema: Mapping[str, Any] | None = None,
) -> Callable[[RunFunction], Workflow]:
    """Decorator form of ``define_workflow``: ``@workflow(name=..., ...)``."""
    meta: dict[str, Any] = {"name": name, "description": description, "phases": phases}
    if limits is not None:
        meta["limits"] = limits
    if args_schema is not None:
        meta["args_schema"] = args_schema

    def decorate(run: RunFunction) -> Workflow:
        return define_workflow(meta, run)

    return decorate


def check_unique_names(workflows: Iterable[Workflow]) -> dict[str, Workflow]:
    registry: dict[str, Workflow] = {}
    for item in workflows:
        if not isinstance(item, Workflow):
            raise WorkflowDefinitionError(f"Expected a Workflow handle, got {type(item).__name__}")
        if item.name in registry:
            raise WorkflowDefinitionError(f"Duplicate workflow name {item.name}")
        registry[item.name] = item
    return registry


def code_hash(run: RunFunction, canonical_meta: Mapping[str, Any]) -> str:
    """Hash of the run function's source (bytecode when there is no source) and meta."""
    digest = hashlib.sha256()
    try:
        digest.update(inspect.getsource(run).encode("utf-8"))
    except (OSError, TypeError):
        code = getattr(run, "__code__", None)
        digest.update(marshal.dumps(code) if code is not None else repr(run).encode())
    digest.update(json.dumps(canonical_meta, sort_keys=True).encode("utf-8"))
    return digest.hexdigest()[:16]


def _key(key: Any) -> str:
    """An unknown key as an error names it: verbatim when it is a short string."""
    return key[:80] if isinstance(key, str) else short_repr(key)


def _required_text(meta: Mapping[str, Any], key: str) -> str:
    if key not in meta:
        raise WorkflowDefinitionError(f"Workflow meta is missing required key: {key}")
    value = meta[key]
    if not isinstance(value, str):
        raise WorkflowDefinitionError(f"Workflow {key} must be a string, got {type(value).__name__}")
    if not value.strip():
        raise WorkflowDefinitionError(f"Workflow {key} must not be blank")
    return value


def _phases(raw: Any) -> tuple[Phase, ...]:
    if isinstance(raw, str | bytes | Mapping) or not isinstance(raw, Iterable):
        raise WorkflowDefinitionError(f"Workflow phases must be a list, got {type(raw).__name__}")
    phases: list[Phase] = []
    seen: set[str] = set()
    for index, item in enumerate(raw):
        if not isinstance(item, Mapping):
            raise WorkflowDefinitionError(f"Workflow phase {index} must be a dict, got {type(item).__name__}")
        for key in item:
            if key not in PHASE_KEYS:
                raise WorkflowDefinitionError(f"Unknown key in workflow phase {index}: {_key(key)}")
        title = item.get("title")
        if not isinstance(title, str) or not title.strip():
            raise WorkflowDefinitionError(f"Workflow phase {index} needs a non-blank title")
        if title in seen:
            raise WorkflowDefinitionError(f"Workflow phase title is declared more than once: {title[:200]}")
        detail = item.get("detail")
        if detail is not None and not isinstance(detail, str):
            raise WorkflowDefinitionError(f"Workflow phase {short_repr(title)} detail must be a string")
        seen.add(title)
        phases.append(Phase(phase_id=f"phase-{index + 1}", title=title, detail=detail))
    return tuple(phases)


def _args_schema(raw: Any) -> dict[str, Any] | None:
    if raw is None:
        return None
    if not isinstance(raw, Mapping):
        raise WorkflowDefinitionError(f"Workflow args_schema must be a dict, got {type(raw).__name__}")
    schema = dict(raw)
    try:
        jsonschema.Draft202012Validator.check_schema(schema)
    except jsonschema.exceptions.SchemaError as exc:
        raise WorkflowDefinitionError(f"Workflow args_schema is not a valid JSON Schema: {exc.message}") from None
    return schema

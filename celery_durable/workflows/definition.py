"""Defining a workflow: meta validated eagerly, an immutable handle (SPEC §2).

Meta is checked by the ``WorkflowMeta`` model; the handle keeps what the user
gave (limits and ``args_schema`` as copies of their mappings), so the code
hash of a workflow does not depend on how pydantic parses it.
"""

from __future__ import annotations

import copy
import hashlib
import importlib
import inspect
import json
import marshal
from collections.abc import Callable, Iterable, Mapping
from dataclasses import dataclass
from types import MappingProxyType
from typing import TYPE_CHECKING, Annotated, Any

import jsonschema
import jsonschema.exceptions
from pydantic import AfterValidator, BaseModel, ConfigDict, Field, StrictStr, ValidationError

from celery_durable.errors import WorkflowDefinitionError
from celery_durable.names import WORKFLOW_NAME_MAX, WORKFLOW_NAME_PATTERN, name_rule
from celery_durable.workflows.json_schemas import unresolved_ref, validator_for
from celery_durable.workflows.jsonvalue import json_problem, short_repr
from celery_durable.workflows.limits import Limits, limits_label
from celery_durable.workflows.validation import Loc, explain

if TYPE_CHECKING:
    from celery_durable.workflows.context import WorkflowContext

RunFunction = Callable[["WorkflowContext"], Any]

VERSION_MAX = 64
"""The longest meta ``version`` (SPEC §2)."""
NAME_PATTERN = WORKFLOW_NAME_PATTERN
"""Read here by the task messages (tasks/messages.py) and the fuzz tests; defined in ``names``."""


def _not_blank(text: str) -> str:
    if not text.strip():
        raise ValueError("must not be blank")
    return text


def _plain_name(name: str) -> str:
    if not NAME_PATTERN.match(name):
        raise ValueError(f"must be {name_rule(WORKFLOW_NAME_MAX)}: {short_repr(name)}")
    return name


def _short_version(version: str) -> str:
    if len(version) > VERSION_MAX:
        raise ValueError(f"must be at most {VERSION_MAX} characters, got {len(version)}")
    return version


def _json_schema(schema: Mapping[str, Any]) -> Mapping[str, Any]:
    problem = json_problem(dict(schema))
    if problem is not None:
        # It is hashed as JSON (code_hash): a set in it was a TypeError from json.dumps.
        raise ValueError(f"must be a JSON value: {problem}")
    validator = validator_for(schema)
    try:
        validator.check_schema(dict(schema))
    except jsonschema.exceptions.SchemaError as exc:
        raise ValueError(f"is not a valid JSON Schema: {exc.message}") from None
    unresolved = unresolved_ref(validator, schema)
    if unresolved is not None:
        raise ValueError(f"has a $ref that does not resolve within it: {short_repr(unresolved)}")
    return schema


Text = Annotated[StrictStr, AfterValidator(_not_blank)]


class PhaseMeta(BaseModel):
    """One declared phase. Lax as a model, so any mapping may declare it; strict in its fields."""

    model_config = ConfigDict(extra="forbid", frozen=True)

    title: Text
    detail: StrictStr | None = None


class WorkflowMeta(BaseModel):
    """The meta of SPEC §2; unknown keys are refused by name."""

    model_config = ConfigDict(extra="forbid", strict=True, frozen=True)

    name: Annotated[Text, AfterValidator(_plain_name)]
    description: Text
    # Lax: a tuple or a generator of phases declares them as well as a list.
    phases: list[PhaseMeta] = Field(strict=False)
    limits: Limits = Field(default_factory=Limits)
    args_schema: Annotated[Mapping[str, Any], Field(strict=False), AfterValidator(_json_schema)] | None = None
    version: Annotated[Text, AfterValidator(_short_version)] | None = None


META_KEYS = tuple(WorkflowMeta.model_fields)


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
    version: str | None = None
    """The meta's ``version``: part of ``code_hash``, for what the hash of
    ``run``'s own source cannot see (the functions it calls)."""

    def phase_named(self, title: str) -> Phase | None:
        for phase in self.phases:
            if phase.title == title:
                return phase
        return None

    def validate_args(self, args: Any) -> None:
        """Check ``args`` against ``args_schema``; the error names the failing path."""
        if self.args_schema is None:
            return
        validator = validator_for(self.args_schema)(dict(self.args_schema))
        error = jsonschema.exceptions.best_match(validator.iter_errors(args))
        if error is not None:
            path = "$" + "".join(f"[{part!r}]" for part in error.absolute_path)
            raise ValueError(f"Workflow {self.name!r} args do not match args_schema at {path}: {error.message}")

    def __repr__(self) -> str:
        return f"Workflow(name={self.name!r})"


def define_workflow(meta: Mapping[str, Any], run: RunFunction) -> Workflow:
    """Validate ``meta`` and return an immutable handle; ``run`` is stored as is."""
    checked = check_meta(meta)
    if not callable(run):
        raise WorkflowDefinitionError(f"Workflow run must be callable, got {type(run).__name__}")
    phases = tuple(
        Phase(phase_id=f"phase-{index}", title=phase.title, detail=phase.detail)
        for index, phase in enumerate(checked.phases, start=1)
    )
    # The mappings as given, not as parsed: the code hash must not depend on pydantic.
    limits = dict(meta.get("limits", {}))
    raw_schema = meta.get("args_schema")
    # A deep copy: the caller's nested dicts, changed later, changed what the
    # handle validated while its code hash stayed the same.
    args_schema = copy.deepcopy(dict(raw_schema)) if raw_schema is not None else None
    canonical = {
        "name": checked.name,
        "description": checked.description,
        "phases": [{"title": p.title, "detail": p.detail} for p in phases],
        "limits": limits,
        "args_schema": args_schema,
    }
    if checked.version is not None:
        # Only when declared: the hash of a workflow without one stays what it was.
        canonical["version"] = checked.version
    return Workflow(
        name=checked.name,
        description=checked.description,
        phases=phases,
        limits=MappingProxyType(limits),
        args_schema=MappingProxyType(args_schema) if args_schema is not None else None,
        run=run,
        code_hash=code_hash(run, canonical),
        version=checked.version,
    )


def check_meta(meta: Any) -> WorkflowMeta:
    """``meta`` as the model; the first problem as a ``WorkflowDefinitionError``."""
    try:
        checked = WorkflowMeta.model_validate(dict(meta) if isinstance(meta, Mapping) else meta)
    except ValidationError as exc:
        raise WorkflowDefinitionError(explain(exc, _meta_label)) from None
    seen: set[str] = set()
    for phase in checked.phases:
        if phase.title in seen:
            raise WorkflowDefinitionError(f"Workflow phase title is declared more than once: {phase.title}")
        seen.add(phase.title)
    return checked


def workflow(**meta: Any) -> Callable[[RunFunction], Workflow]:
    """Decorator form of ``define_workflow``: ``@workflow(name=..., ...)``.

    Every keyword is meta, checked when the function is decorated, so a key
    that is missing, unknown or invalid is a ``WorkflowDefinitionError``
    naming it, as in ``define_workflow``, never a ``TypeError`` about this
    function's signature.
    """

    def decorate(run: RunFunction) -> Workflow:
        return define_workflow(meta, run)

    return decorate


def in_modules(workflows: Iterable[Workflow], modules: Iterable[str]) -> list[Workflow]:
    """``workflows`` and every handle at the top level of ``modules``, imported
    here: the ``workflows`` setting (SPEC §10), so a worker's or a client's
    engine learns its workflows from its settings alone. A handle both given
    and found counts once."""
    found = list(workflows)
    for name in modules:
        try:
            module = importlib.import_module(name)
        except ImportError as exc:
            raise WorkflowDefinitionError(
                f"Settings.workflows names {name!r}, which cannot be imported: {exc}"
            ) from None
        for value in vars(module).values():
            if isinstance(value, Workflow) and value not in found:
                found.append(value)
    return found


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
    """Hash of the run function's source (bytecode when there is no source) and meta.

    The source of ``run`` alone: a change in a function it calls does not
    change the hash, which is what the meta's ``version`` is for (SPEC §8a).
    """
    digest = hashlib.sha256()
    try:
        digest.update(inspect.getsource(run).encode("utf-8"))
    except (OSError, TypeError):
        code = getattr(run, "__code__", None)
        digest.update(marshal.dumps(code) if code is not None else repr(run).encode())
    digest.update(json.dumps(canonical_meta, sort_keys=True).encode("utf-8"))
    return digest.hexdigest()[:16]


def _meta_label(loc: Loc) -> str:
    """How a message names the field at ``loc``: "Workflow name", "Workflow phase 2 title", "limits.timeout_seconds"."""
    match loc:
        case ():
            return "Workflow meta"
        case ("phases", int(index), *rest):
            return " ".join([f"Workflow phase {index}", *map(str, rest)])
        case ("limits", *rest):
            return limits_label("limits", tuple(rest))
        case _:
            return "Workflow " + ".".join(map(str, loc))


def registered_workflow(workflows: Mapping[str, Workflow], name_or_handle: Any) -> Workflow:
    """The registered workflow a name or handle names (a client's start, a
    child's): a ``ValueError`` for one the engine does not know."""
    if isinstance(name_or_handle, Workflow):
        registered = workflows.get(name_or_handle.name)
        known = registered is not None and registered.code_hash == name_or_handle.code_hash
        if registered is not name_or_handle and not known:
            raise ValueError(f"Workflow {name_or_handle.name!r} is not registered with this engine")
        return name_or_handle
    if not isinstance(name_or_handle, str):
        raise ValueError(f"Expected a workflow name or handle, got {type(name_or_handle).__name__}")
    definition = workflows.get(name_or_handle)
    if definition is None:
        raise ValueError(f"Unknown workflow: {short_repr(name_or_handle)}")
    return definition

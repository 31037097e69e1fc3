"""Turning the ``agent_runner`` setting into a runner object (SPEC §9).

Workers and clients read the same settings, so naming the runner by import
path lets them agree on it without code changes. The path is trusted input:
it comes from settings or code, never from a task message, because importing
a module runs its code.
"""

from __future__ import annotations

import importlib
import inspect
import re
from typing import Any, cast

from celery_durable.agents.types import AgentRunner

_PATH = re.compile(r"^(?P<module>[A-Za-z_]\w*(?:\.[A-Za-z_]\w*)*):(?P<attr>[A-Za-z_]\w*(?:\.[A-Za-z_]\w*)*)$")


def load_runner(path: str) -> AgentRunner:
    """Import ``"package.module:attribute"`` and return the runner it names.

    The attribute (which may be dotted, ``module:Class.attr``) is either a
    runner, an object with a ``run`` method, or a zero-argument factory of
    one, such as a class or a function that reads its own configuration.
    Raises ``ValueError`` with the path in the message when the path is
    malformed, its module or attribute does not exist, or it does not lead to
    a runner. Errors raised while the module itself imports (a missing
    dependency, a bug) propagate unchanged so they are not mistaken for a
    typo in the setting.
    """
    match = _PATH.match(path) if isinstance(path, str) else None
    if match is None:
        raise ValueError(f"Agent runner path must look like 'package.module:attribute', got {path!r}")
    target = _resolve(path, match["module"], match["attr"])
    if _is_runner(target):
        return cast(AgentRunner, target)
    if not callable(target):
        raise ValueError(f"Agent runner {path!r} is neither a runner (an object with .run) nor a factory of one")
    _check_no_arguments(path, target)
    runner = target()
    if not _is_runner(runner):
        raise ValueError(
            f"Agent runner factory {path!r} returned {type(runner).__name__}, not a runner (an object with .run)"
        )
    return cast(AgentRunner, runner)


def _resolve(path: str, module_name: str, attr_path: str) -> Any:
    try:
        module = importlib.import_module(module_name)
    except ModuleNotFoundError as exc:
        # Only a missing module named by the path itself is a bad path; a
        # missing dependency of an existing module is the module's problem.
        if exc.name is None or not _is_prefix(exc.name, module_name):
            raise
        raise ValueError(f"Agent runner {path!r}: cannot import module {module_name!r}") from None
    target: Any = module
    for part in attr_path.split("."):
        try:
            target = getattr(target, part)
        except AttributeError:
            raise ValueError(f"Agent runner {path!r}: {module_name!r} has no attribute {attr_path!r}") from None
    return target


def _is_prefix(missing: str, module_name: str) -> bool:
    return module_name == missing or module_name.startswith(missing + ".")


def _is_runner(obj: Any) -> bool:
    # A class with a run method is a factory, not a runner: its run is unbound.
    return not isinstance(obj, type) and callable(getattr(obj, "run", None))


def _check_no_arguments(path: str, factory: Any) -> None:
    # Binding the signature up front tells "needs arguments" apart from a
    # TypeError raised inside a factory that does take none.
    try:
        signature = inspect.signature(factory)
    except (TypeError, ValueError):
        return  # Builtins without a signature: let the call decide.
    try:
        signature.bind()
    except TypeError:
        raise ValueError(
            f"Agent runner factory {path!r} must take no arguments, but its signature is {signature}"
        ) from None

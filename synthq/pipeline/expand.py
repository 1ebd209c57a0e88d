"""Expanding one ``stages:`` entry of a pipeline file: a stage per value of its ``sweep:``, ``{var}``
replaced by its value, ``@stage`` (or a glob, ``@ret-*``) by earlier stages' output directories."""

from __future__ import annotations

import fnmatch
import itertools
import re
from pathlib import Path
from typing import Any

from synthq.runtime.errors import SynthqError

_VARIABLE = re.compile(r"\{([A-Za-z_][A-Za-z0-9_]*)\}")


def substitute(value: Any, variables: dict[str, Any]) -> Any:
    """Replace ``{var}`` in strings (recursively); a string that is exactly one variable keeps
    the variable's type."""
    if isinstance(value, str):
        whole = _VARIABLE.fullmatch(value)
        if whole and whole.group(1) in variables:
            return variables[whole.group(1)]
        return _VARIABLE.sub(lambda m: str(variables.get(m.group(1), m.group(0))), value)
    if isinstance(value, dict):
        return {k: substitute(v, variables) for k, v in value.items()}
    if isinstance(value, list):
        return [substitute(v, variables) for v in value]
    return value


def unknown_variables(value: Any, variables: dict[str, Any]) -> list[str]:
    """The ``{name}`` placeholders in ``value``'s strings (recursively) that ``variables`` does not
    define: a misspelt ``{lrr}`` would otherwise reach the stage's config as text."""
    if isinstance(value, str):
        return [name for name in _VARIABLE.findall(value) if name not in variables]
    if isinstance(value, dict):
        return [name for item in value.values() for name in unknown_variables(item, variables)]
    if isinstance(value, list):
        return [name for item in value for name in unknown_variables(item, variables)]
    return []


def resolve_references(value: Any, known: dict[str, Path], where: str, used: list[str]) -> Any:
    """Replace ``@name`` (recursively) by that earlier stage's directory, and a glob ``@ret-*`` by
    the list of every match (spliced into an enclosing list); the names used are appended to
    ``used``. A reference that matches no stage of ``known`` is an error."""
    if isinstance(value, str) and value.startswith("@"):
        pattern = value[1:]
        matches = [name for name in known if fnmatch.fnmatchcase(name, pattern)]
        if not matches:
            raise SynthqError(
                f"{where}: reference {value!r} names no earlier stage (known: {', '.join(known)})"
            )
        used.extend(matches)
        if any(ch in pattern for ch in "*?["):
            return [str(known[name]) for name in matches]
        return str(known[matches[0]])
    if isinstance(value, dict):
        return {k: resolve_references(v, known, where, used) for k, v in value.items()}
    if isinstance(value, list):
        resolved = []
        for item in value:
            result = resolve_references(item, known, where, used)
            is_glob = isinstance(item, str) and item.startswith("@") and any(ch in item for ch in "*?[")
            resolved.extend(result if is_glob else [result])
        return resolved
    return value


def expand_sweep(entry: dict, variables: dict[str, Any]) -> list[tuple[dict, dict[str, Any]]]:
    """``(entry, variables)`` once per combination of the entry's ``sweep:`` values (their
    product), the swept values added to ``variables``."""
    sweep = entry.get("sweep") or {}
    if not isinstance(sweep, dict):
        raise SynthqError(f"stage {entry.get('name')!r}: sweep must be a mapping of variable -> list")
    keys = list(sweep)
    values = [v if isinstance(v, list) else [v] for v in sweep.values()]
    empty = [key for key, value in zip(keys, values, strict=True) if not value]
    if empty:  # the product would be empty: the stage, and every stage after it, silently gone
        raise SynthqError(f"stage {entry.get('name')!r}: sweep {', '.join(empty)} lists no values")
    return [
        (entry, {**variables, **dict(zip(keys, combo, strict=True))}) for combo in itertools.product(*values)
    ]

"""Reading configs: YAML files, ``a.b.c=value`` overrides, and pydantic errors as one line."""

from __future__ import annotations

import copy
from pathlib import Path
from typing import Any

import yaml
from pydantic import ValidationError

from synthq.runtime.errors import SynthqError


def validation_message(error: ValidationError, flags: dict[str, str] | None = None) -> str:
    """One line for a pydantic error: ``option: message`` per problem, ``; ``-joined.

    ``flags`` maps field names to what the user typed them as (``--clip-norm``); by default a
    field is named as in YAML."""
    problems = []
    for item in error.errors():
        loc = [str(part) for part in item["loc"]]
        name = (flags or {}).get(loc[0], loc[0]) if loc else "value"
        message = item["msg"].removeprefix("Value error, ").replace("Input should be", "must be")
        message = {"extra_forbidden": "unknown option", "missing": "required"}.get(item["type"], message)
        if not loc:  # a check of the whole config names its options itself
            problems.append(message)
            continue
        problems.append(f"{name}{''.join(f'[{part}]' for part in loc[1:])}: {message}")
    return "; ".join(problems)


def load_yaml(path: str | Path) -> dict:
    """Read a YAML mapping, with errors that name the file."""
    path = Path(path)
    if not path.is_file():
        raise SynthqError(f"{path}: no such config file")
    try:
        data = yaml.safe_load(path.read_text(encoding="utf-8"))
    except yaml.YAMLError as error:
        raise SynthqError(f"{path}: invalid YAML ({error})") from error
    if not isinstance(data, dict):
        raise SynthqError(f"{path}: expected a mapping at the top level")
    return data


def apply_overrides(data: dict, overrides: list[str]) -> dict:
    """Apply ``a.b.c=value`` overrides (values parsed as YAML scalars) to a nested mapping.

    Numeric parts index into lists (``stages.2.config.epochs=1``); missing mappings are created.
    The input is not modified."""
    result = copy.deepcopy(data)
    for item in overrides:
        if "=" not in item:
            raise SynthqError(f"override {item!r} is not of the form key=value")
        key, raw = item.split("=", 1)
        value = yaml.safe_load(raw) if raw else None
        node: Any = result
        parts = key.strip().split(".")
        for part in parts[:-1]:
            if isinstance(node, list):
                node = node[_list_index(node, part, item)]
                continue
            if not isinstance(node.get(part), dict | list):
                node[part] = {}
            node = node[part]
        if isinstance(node, list):
            node[_list_index(node, parts[-1], item)] = value
        else:
            node[parts[-1]] = value
    return result


def _list_index(items: list, part: str, item: str) -> int:
    if not part.isdigit() or int(part) >= len(items):
        raise SynthqError(f"override {item!r}: {part!r} is not an index of a list of {len(items)}")
    return int(part)

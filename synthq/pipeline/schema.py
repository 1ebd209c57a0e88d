"""``synthq run --schema``: the JSON Schema of a pipeline file, generated from the stage config models."""

from __future__ import annotations

from typing import Any

from pydantic import AliasChoices

from synthq.config.registry import STAGES


def pipeline_schema() -> dict:
    """The JSON Schema of a pipeline file (``synthq run --schema``), generated from the stage
    config models, so an editor validates a pipeline as it is typed (``# yaml-language-server:
    $schema=...``) with the same names and ranges the command line uses."""
    definitions: dict = {}
    stage_items = []
    defaults = {}
    for name, entry in STAGES.items():
        config = _lenient(entry.config_type())
        definitions.update(config.pop("$defs", {}))
        reference = f"config-{name}"
        definitions[reference] = config
        defaults[name] = {"$ref": f"#/$defs/{reference}"}
        stage_items.append(
            {
                "type": "object",
                "required": ["name", "stage"],
                "additionalProperties": False,
                "properties": {
                    "name": {"type": "string", "description": "An identifier; {var} from sweep allowed."},
                    "stage": {"const": name},
                    "sweep": {"type": "object", "additionalProperties": {"type": "array"}},
                    "expect_seconds": {"type": "number", "minimum": 0},
                    "config": {"$ref": f"#/$defs/{reference}"},
                },
            }
        )
    number = {"type": "number"}
    return {
        "$schema": "https://json-schema.org/draft/2020-12/schema",
        "title": "synthq pipeline",
        "type": "object",
        "required": ["stages"],
        "additionalProperties": False,
        "properties": {
            "name": {"type": "string"},
            "out": {"type": "string", "description": "Every stage writes <out>/<stage name>."},
            "vars": {"type": "object", "description": "{name} is substituted in every string."},
            "defaults": {"type": "object", "properties": defaults, "additionalProperties": False},
            "stages": {"type": "array", "items": {"oneOf": stage_items}},
            "expected": {
                "type": "array",
                "items": {
                    "type": "object",
                    "required": ["stage", "metric"],
                    "additionalProperties": False,
                    "properties": {
                        "stage": {"type": "string"},
                        "metric": {
                            "anyOf": [{"type": "string"}, {"type": "array", "items": {"type": "string"}}]
                        },
                        "value": number,
                        "tolerance": number,
                        "min": number,
                        "max": number,
                    },
                },
            },
            "paper": {"description": "Free-form figures shared by YAML anchors."},
        },
        "$defs": definitions,
    }


def _or_string(node: Any) -> Any:
    """``node`` (a JSON Schema) where every typed value may also be a string: a pipeline file
    writes ``{var}``, ``@stage`` and ``inf`` where numbers go, and they are substituted or parsed
    before the stage's model validates the config."""
    if isinstance(node, list):
        return [_or_string(item) for item in node]
    if not isinstance(node, dict):
        return node
    walked = {key: _or_string(value) for key, value in node.items()}
    if walked.get("type") not in (None, "string"):
        return {"anyOf": [walked, {"type": "string"}]}
    return walked


def _lenient(model: type) -> dict:
    """A stage config's JSON Schema as a pipeline file may write it: every field optional
    (``defaults:`` and the stage's own defaults fill them), under its name or an alias the model
    accepts (``batch_size``), any value possibly a string (:func:`_or_string`)."""
    schema = model.model_json_schema(ref_template="#/$defs/{model}")
    properties = {}
    for name, declared in schema.get("properties", {}).items():
        lenient = {"anyOf": [_or_string(declared), {"type": "string"}]}
        if "description" in declared:
            lenient["description"] = declared["description"]
        properties[name] = lenient
        alias = model.model_fields[name].validation_alias if name in model.model_fields else None
        for other in alias.choices if isinstance(alias, AliasChoices) else []:
            properties.setdefault(str(other), lenient)
    out = {"type": "object", "properties": properties, "additionalProperties": False}
    if "$defs" in schema:
        out["$defs"] = _or_string(schema["$defs"])
    return out

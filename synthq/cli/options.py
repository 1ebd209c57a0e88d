"""Command-line options derived from the config models, so each option is written down once.

A stage command is a function registered with :func:`stage_command` (any command with a config
model, such as ``synthq search``, with :func:`config_command`); its options are the fields of the
command's pydantic config (:mod:`synthq.config`): the option name (``--clip-norm`` for
``clip_norm``), help text (the field's description), default, allowed values (``Literal``
types become choices) and valid range (checked by the model before any work starts) all come
from the field. A new config field is a new option with no code here. Per-field command-line
settings (an option's name, old names kept as aliases, a positional argument) live beside the
field, in ``Field(json_schema_extra=cli(...))``.

Every value reaches the config as the user typed it (only a ``Literal``'s choices are checked
by the command line itself), so the model alone parses and range-checks it; its complaints come
back as one line naming the option (``--top-p: must be less than or equal to 1``).
"""

from __future__ import annotations

import functools
import inspect
import types
import typing
from collections.abc import Callable
from pathlib import Path
from typing import Any

import typer
from pydantic import BaseModel, ValidationError
from pydantic.fields import FieldInfo

from synthq.artifacts.process_state import writes_so_far, written_here
from synthq.config.loading import apply_overrides, validation_message
from synthq.config.registry import stage_entry
from synthq.runtime.console import result
from synthq.runtime.errors import SynthqError


class OptionError(SynthqError):
    """An option value that the stage's config refuses (exit status 2)."""


class PlainArgument(typer.core.TyperArgument):
    """A positional argument written the way Unix usage lines write it: ``DIR...`` for several,
    ``[DIR]`` when optional, and in the help list its name alone (typer 0.29 writes
    ``{DIR}...`` in the usage and ``DIR <list[Path]>`` in the list). Installed for every
    command by :func:`plain_arguments`."""

    def _usage_display_name(self) -> str:
        name = self.display_name_raw if self.required else f"[{self.display_name_raw}]"
        return name + ("..." if self.nargs != 1 else "")

    def _rich_display_name(self) -> str:
        return self.display_name_raw + ("..." if self.nargs != 1 else "")

    def display_type_rich(self, ctx) -> None:
        return None


def plain_arguments() -> None:
    """Let typer build positional arguments as :class:`PlainArgument` (it looks the class up in
    ``typer.main`` each time a command is built)."""
    import typer.main

    typer.main.TyperArgument = PlainArgument


class Interrupted(SynthqError):
    """Ctrl-C during a command; carries what to do next (exit status 130)."""


def _settings(field: FieldInfo) -> dict:
    extra = field.json_schema_extra
    return dict(extra.get("cli", {})) if isinstance(extra, dict) else {}


def _unwrap(annotation: Any) -> Any:
    """The type without ``| None`` and ``Annotated[...]``."""
    while True:
        origin = typing.get_origin(annotation)
        if origin is typing.Annotated:
            annotation = typing.get_args(annotation)[0]
        elif origin in (typing.Union, types.UnionType):
            members = [a for a in typing.get_args(annotation) if a is not type(None)]
            if len(members) != 1:
                return annotation
            annotation = members[0]
        else:
            return annotation


def _metavar(annotation: Any) -> str:
    if annotation in (int, float):
        return annotation.__name__.upper()
    if annotation is Path:
        return "PATH"
    return "TEXT"


def flag_name(name: str, field: FieldInfo) -> str:
    """The option a field is set with on the command line (``--clip-norm``)."""
    return _settings(field).get("flag") or "--" + name.replace("_", "-")


def _default_text(field: FieldInfo) -> str | None:
    """The field's default as the user would type it (None: no default to show or pass)."""
    if field.is_required():
        return None
    value = field.get_default(call_default_factory=True)
    if value is None or value == [] or value == {}:
        return None
    if isinstance(value, list):
        return ",".join(str(v) for v in value)
    return str(value)


_BOUNDS = (("gt", ">"), ("ge", "≥"), ("lt", "<"), ("le", "≤"))


def range_text(field: FieldInfo) -> str | None:
    """A field's valid range in words, from its constraints: ``> 0``, ``≥ 1``, ``> 0 and < 1``."""
    parts = []
    for constraint in field.metadata:
        for attribute, symbol in _BOUNDS:
            bound = getattr(constraint, attribute, None)
            if bound is not None:
                parts.append(f"{symbol} {bound:g}" if isinstance(bound, float) else f"{symbol} {bound}")
    return " and ".join(parts) or None


def _parameter(name: str, field: FieldInfo) -> inspect.Parameter | None:
    """The typer parameter for one config field, or None for a field the command line hides."""
    settings = _settings(field)
    if settings.get("hidden"):
        return None
    annotation = _unwrap(field.annotation)
    origin = typing.get_origin(annotation)
    # A required argument is refused by the command line itself, which says so in the help.
    required_argument = bool(settings.get("argument") and settings.get("required"))
    help_text = field.description or name.replace("_", " ")
    if field.is_required() and not required_argument:
        help_text += "  [required]"
    if (valid := range_text(field)) is not None:
        help_text += f"  [range: {valid}]"
    declarations = [flag_name(name, field), *settings.get("aliases", [])]

    def parameter(info: Any, kind: Any) -> inspect.Parameter:
        return inspect.Parameter(name, inspect.Parameter.KEYWORD_ONLY, default=info, annotation=kind)

    if settings.get("argument"):
        default = ... if required_argument else None
        metavar = settings.get("metavar") or name.upper()
        return parameter(
            typer.Argument(default, help=help_text, metavar=metavar, show_default=False), list[str]
        )
    if annotation is bool:
        on = bool(field.get_default(call_default_factory=True))
        if on:
            declarations = [f"{declarations[0]}/--no-{declarations[0][2:]}"]
            help_text += "  [default: on]"
        return parameter(typer.Option(on, *declarations, help=help_text, show_default=False), bool)
    default, extra = _default_text(field), {}
    if origin in (list, dict) or annotation in (list, dict):
        kind: Any = list[str]
        default = None if default is None else [default]
        if origin is dict or annotation is dict:
            extra["metavar"] = "KEY=VALUE"
        else:
            item = _unwrap(typing.get_args(annotation)[0]) if typing.get_args(annotation) else str
            choices = typing.get_args(item) if typing.get_origin(item) is typing.Literal else ()
            extra["metavar"] = ("|".join(map(str, choices)) if choices else _metavar(item)) + (
                ",..." if settings.get("commas", True) else ""
            )
    elif origin is typing.Literal:
        kind = annotation | None  # typer offers a Literal's values as choices
    else:
        kind = str | None  # the config model parses and range-checks the text
        extra["metavar"] = settings.get("metavar") or _metavar(annotation)
    return parameter(typer.Option(default, *declarations, help=help_text, show_default=True, **extra), kind)


def config_parameters(config_class: type[BaseModel], skip: set[str] = frozenset()) -> list[inspect.Parameter]:
    """Typer parameters for every visible field of ``config_class`` (except ``skip``)."""
    parameters = []
    for name, field in config_class.model_fields.items():
        if name not in skip and (parameter := _parameter(name, field)) is not None:
            parameters.append(parameter)
    return parameters


def _value(field: FieldInfo, value: Any) -> Any:
    """What the command line gave, in the form the config model parses: a list option's
    values split on commas, a mapping option's ``key=value`` items as a dict."""
    if not isinstance(value, list | tuple):
        return value
    annotation = _unwrap(field.annotation)
    if typing.get_origin(annotation) is dict or annotation is dict:
        return apply_overrides({}, list(value))
    if typing.get_origin(annotation) is list and _settings(field).get("commas", True):
        return [part.strip() for item in value for part in item.split(",") if part.strip()]
    return list(value)


def flags(config_class: type[BaseModel]) -> dict[str, str]:
    """Field name -> option name, for error messages (aliases included)."""
    names = {name: flag_name(name, field) for name, field in config_class.model_fields.items()}
    for name, field in config_class.model_fields.items():
        alias = field.validation_alias
        for choice in getattr(alias, "choices", []):
            names.setdefault(str(choice), names[name])
    return names


def build(config_class: type[BaseModel], options: dict) -> Any:
    """``config_class(**options)``, its validation errors as one :class:`OptionError` line."""
    try:
        return config_class(**options)
    except ValidationError as error:
        raise OptionError(validation_message(error, flags(config_class))) from None


_CONTEXT = "synthq_typer_context"


def _given(context: typer.Context, name: str) -> bool:
    """Whether the user gave option ``name`` (command line or environment), not its default:
    a default is the config model's to apply, so ``model_fields_set`` holds only what was typed."""
    source = context.get_parameter_source(name)
    return source is None or source.name not in ("DEFAULT", "DEFAULT_MAP")


class ConfigOptions(dict):
    """The config fields given on the command line (field name -> value as typed), plus
    :meth:`config`, which parses them into the command's config model."""

    def __init__(self, config_class: type[BaseModel], values: dict):
        super().__init__(values)
        self.config_class = config_class

    def config(self) -> Any:
        return build(self.config_class, dict(self))


def config_command(
    app: typer.Typer,
    name: str,
    config_class: type[BaseModel],
    report: Callable | None = None,
    interrupted: str | None = None,
    help_text: str | None = None,
) -> Callable:
    """Register ``function(options, **own_options)`` as the command ``name`` of ``app`` (its help:
    ``help_text``, else the function's docstring).

    The command's options are one per field of ``config_class`` followed by ``function``'s own
    parameters (command-line-only switches such as ``--merge``). ``function`` gets ``options`` (a
    :class:`ConfigOptions`; ``options.config()`` is the validated config) and returns an artifact,
    whose result line is printed here (or by ``report(artifact, mark)``), or None. Ctrl-C becomes
    :class:`Interrupted` with the message ``interrupted`` (None: left to the entry point).
    """

    def decorate(function: Callable) -> Callable:
        hints = typing.get_type_hints(function)
        own = [
            p.replace(annotation=hints.get(p.name, p.annotation))
            for p in inspect.signature(function).parameters.values()
            if p.name != "options"
        ]
        own_names = {p.name for p in own}
        derived = config_parameters(config_class, skip=own_names)
        fields = config_class.model_fields

        @functools.wraps(function)
        def command(**kwargs: Any) -> None:
            context = kwargs.pop(_CONTEXT)
            options = ConfigOptions(
                config_class,
                {
                    key: _value(fields[key], value)
                    for key, value in kwargs.items()
                    if key not in own_names and _given(context, key) and value not in (None, [], ())
                },
            )
            mark = writes_so_far()
            try:
                artifact = function(options, **{k: kwargs[k] for k in own_names})
            except KeyboardInterrupt:
                if interrupted is None:
                    raise
                raise Interrupted(interrupted) from None
            except ValidationError as error:
                raise OptionError(validation_message(error, flags(config_class))) from None
            if artifact is not None:
                (report or print_result)(artifact, mark)

        own_kw = [p.replace(kind=inspect.Parameter.KEYWORD_ONLY) for p in own]
        own_kw.append(inspect.Parameter(_CONTEXT, inspect.Parameter.KEYWORD_ONLY, annotation=typer.Context))
        command.__signature__ = inspect.Signature(derived + own_kw)  # type: ignore[attr-defined]
        command.__annotations__ = {p.name: p.annotation for p in derived + own_kw}
        del command.__wrapped__  # typer must read the signature above, not the function's
        app.command(name, help=help_text)(command)
        return function

    return decorate


def stage_command(app: typer.Typer, name: str, report: Callable | None = None) -> Callable:
    """Register ``function(options, **own_options)`` as the command of the stage ``name``:
    :func:`config_command` with the stage's config model (from the stage registry,
    :mod:`synthq.config.registry`) and, on Ctrl-C, the stage's resume hint."""
    entry = stage_entry(name)
    config_class = entry.config_type()
    resumable = "resume" in config_class.model_fields and not _settings(
        config_class.model_fields["resume"]
    ).get("hidden")
    hint = "rerun with --resume to continue" if resumable else "nothing was written; rerun to start again"
    return config_command(
        app, name, config_class, report, interrupted=f"interrupted; {hint}", help_text=entry.summary or None
    )


def print_result(artifact: Any, since: int = 0) -> None:
    """The one result line of a stage command: where the artifact is and its guarantee
    (``written to`` only if the command wrote it after the mark ``since``)."""
    from synthq.bookkeeping.inputs import assumed_public_models

    what = "written to" if written_here(artifact.path, since) else "up to date (pass --force to redo):"
    guarantee = artifact.privacy
    # the ε printed rests on a starting model being public: said here, not only in the ledger
    assumed = "".join(f"; assuming {assumption}" for assumption in assumed_public_models(guarantee))
    result(f"{artifact.stage} {what} {artifact.path}: {guarantee.describe()}{assumed}")

"""Options generated from config fields (:mod:`synthq.cli.options`): names, help, defaults,
choices and ranges come from the field; only what the user typed reaches the config."""

from __future__ import annotations

import re
from typing import Any, Literal

import pytest
import typer
from pydantic import AliasChoices, BaseModel, ConfigDict, Field
from typer.testing import CliRunner

from synthq.cli.options import (
    ConfigOptions,
    Interrupted,
    OptionError,
    config_command,
    flag_name,
    flags,
    plain_arguments,
    range_text,
    stage_command,
)
from synthq.config.fields import cli

runner = CliRunner()


class ToyConfig(BaseModel):
    model_config = ConfigDict(extra="forbid")

    name: str = Field(description="A name.")
    rate: float = Field(0.5, gt=0, le=1, description="A rate.")
    count: int = Field(3, ge=1, description="A count.", json_schema_extra=cli(metavar="N"))
    mode: Literal["fast", "slow"] = Field("fast", description="A mode.")
    verbose: bool = Field(False, description="Say more.")
    checked: bool = Field(True, description="Check the result.")
    tags: list[str] = Field(default_factory=list, description="Tags.")
    phrases: list[str] = Field(
        default_factory=list, description="Phrases.", json_schema_extra=cli(commas=False)
    )
    extra: dict[str, Any] = Field(default_factory=dict, description="More settings.")
    secret: int = Field(0, description="Not on the command line.", json_schema_extra=cli(hidden=True))
    size: int = Field(
        2,
        ge=1,
        validation_alias=AliasChoices("size", "batch_size"),
        description="A size.",
        json_schema_extra=cli(aliases=["--batch-size"]),
    )
    kind: str = Field("plain", description="A kind.", json_schema_extra=cli(flag="--type"))
    files: list[str] = Field(default_factory=list, description="Files.", json_schema_extra=cli(argument=True))


class QueryConfig(BaseModel):
    model_config = ConfigDict(extra="forbid")

    query: list[str] = Field(
        min_length=1, description="Words.", json_schema_extra=cli(argument=True, required=True, commas=False)
    )


def toy_app(config_class: type[BaseModel] = ToyConfig, interrupted: str | None = None, raises=None):
    """An app with one command ``toy`` whose options are ``config_class``'s; what the command got
    is left in the returned dict."""
    plain_arguments()
    app = typer.Typer(pretty_exceptions_enable=False, rich_markup_mode=None)
    seen: dict = {}

    @app.callback()
    def _group() -> None:
        """Keeps ``toy`` a subcommand."""

    def toy(options: ConfigOptions, loud: bool = typer.Option(False, "--loud", help="Own switch.")):
        seen.update(options=dict(options), loud=loud)
        if raises is not None:
            raise raises
        seen["config"] = options.config()

    config_command(app, "toy", config_class, interrupted=interrupted)(toy)
    return app, seen


def option_lines(app: typer.Typer) -> dict[str, str]:
    """``toy --help``'s options, each with its (unwrapped) help: first declaration -> line."""
    result = runner.invoke(app, ["toy", "--help"], terminal_width=250)
    assert result.exit_code == 0, result.output
    text = result.output.split("\nOptions:\n")[1]
    lines = {}
    for entry in ("\n" + text).split("\n  -")[1:]:
        line = " ".join(("-" + entry).split())
        lines[re.split(r"[ ,/]", line)[0]] = line
    return lines


def test_each_visible_field_is_one_option_named_after_it():
    lines = option_lines(toy_app()[0])
    expected = ["--name", "--rate", "--count", "--mode", "--verbose", "--checked", "--tags", "--phrases",
                "--extra", "--size", "--type", "--loud", "--help"]  # fmt: skip
    assert list(lines) == expected  # field order, own parameters after, the hidden field left out
    assert "--secret" not in " ".join(lines.values())
    assert lines["--size"].startswith("--size, --batch-size INT")  # the old name kept as an alias
    assert flag_name("kind", ToyConfig.model_fields["kind"]) == "--type"


def test_help_shows_description_default_range_and_metavar():
    lines = option_lines(toy_app()[0])
    assert lines["--name"] == "--name TEXT A name. [required]"
    assert lines["--rate"] == "--rate FLOAT A rate. [range: > 0 and ≤ 1] [default: 0.5]"
    assert lines["--count"] == "--count N A count. [range: ≥ 1] [default: 3]"
    assert lines["--verbose"] == "--verbose Say more."
    assert lines["--checked"] == "--checked / --no-checked Check the result. [default: on]"
    assert lines["--tags"].startswith("--tags TEXT,... Tags.")
    assert lines["--phrases"].startswith("--phrases TEXT Phrases.")  # not split on commas: no ",..."
    assert lines["--extra"].startswith("--extra KEY=VALUE More settings.")


def test_a_literal_is_a_choice_checked_by_the_command_line():
    app, seen = toy_app()
    assert "fast|slow" in option_lines(app)["--mode"]
    result = runner.invoke(app, ["toy", "--name", "n", "--mode", "medium"])
    assert result.exit_code == 2 and "medium" in result.output and "options" not in seen


def test_range_text_from_constraints():
    assert range_text(ToyConfig.model_fields["rate"]) == "> 0 and ≤ 1"
    assert range_text(ToyConfig.model_fields["count"]) == "≥ 1"
    assert range_text(ToyConfig.model_fields["name"]) is None


def test_only_given_options_reach_the_config():
    app, seen = toy_app()
    result = runner.invoke(app, ["toy", "--name", "n", "--rate", "0.5"])
    assert result.exit_code == 0, result.output
    # as typed (text): the model parses it; a default the user did not type is not passed on,
    # even when the same value is typed (rate) it counts as given
    assert seen["options"] == {"name": "n", "rate": "0.5"}
    assert seen["config"].model_fields_set == {"name", "rate"}
    assert seen["config"].count == 3 and seen["config"].checked is True and seen["loud"] is False


def test_values_are_parsed_by_the_model():
    app, seen = toy_app()
    argv = ["toy", "--name", "n", "--count", "7", "--no-checked", "--verbose", "--tags", "a,b", "--tags", "c",
            "--phrases", "x, y", "--phrases", "z", "--extra", "k=1", "--extra", "j=text", "--batch-size", "5",
            "--type", "odd", "--loud", "f1", "f2"]  # fmt: skip
    result = runner.invoke(app, argv)
    assert result.exit_code == 0, result.output
    config = seen["config"]
    assert config.count == 7 and config.checked is False and config.verbose is True
    assert config.tags == ["a", "b", "c"] and config.phrases == ["x, y", "z"]
    assert config.extra == {"k": 1, "j": "text"}
    assert config.size == 5 and config.kind == "odd" and config.files == ["f1", "f2"]
    assert seen["loud"] is True and "loud" not in seen["options"]  # the command's own switch


def test_a_refused_value_is_one_line_naming_the_option():
    app, _ = toy_app()
    result = runner.invoke(app, ["toy", "--name", "n", "--rate", "1.5"])
    assert isinstance(result.exception, OptionError)
    assert str(result.exception) == "--rate: must be less than or equal to 1"
    result = runner.invoke(app, ["toy", "--batch-size", "0"])
    assert isinstance(result.exception, OptionError)
    assert "--name: required" in str(result.exception) and "--size: must be greater" in str(result.exception)
    assert flags(ToyConfig)["batch_size"] == "--size"


def test_required_argument_is_refused_by_the_command_line():
    app, seen = toy_app(QueryConfig)
    usage = runner.invoke(app, ["toy", "--help"], terminal_width=200).output.strip().splitlines()[0]
    assert usage.endswith("[OPTIONS] QUERY...")
    result = runner.invoke(app, ["toy"])
    assert result.exit_code == 2 and "Missing argument" in result.output and "options" not in seen
    assert runner.invoke(app, ["toy", "two words, one comma"]).exit_code == 0
    assert seen["config"].query == ["two words, one comma"]
    optional = runner.invoke(toy_app()[0], ["toy", "--help"], terminal_width=200).output.splitlines()[0]
    assert optional.endswith("[FILES]...")


def test_ctrl_c_becomes_the_commands_hint_or_is_left_to_main():
    app, _ = toy_app(interrupted="interrupted; try again", raises=KeyboardInterrupt())
    with pytest.raises(Interrupted, match="^interrupted; try again$"):
        app(["toy", "--name", "n"], standalone_mode=False)
    app, _ = toy_app(raises=KeyboardInterrupt())
    # not turned into Interrupted: typer's own handling, exit status 130, as for any plain command
    assert app(["toy", "--name", "n"], standalone_mode=False) == 130


@pytest.mark.parametrize(
    ("stage", "hint"),
    [("generate", "rerun with --resume to continue"), ("eval", "nothing was written; rerun to start again")],
)
def test_a_stage_command_says_whether_it_can_resume(stage, hint):
    app = typer.Typer(pretty_exceptions_enable=False)

    @app.callback()
    def _group() -> None:
        """Keeps the stage a subcommand."""

    def interrupted(options: ConfigOptions):
        raise KeyboardInterrupt

    stage_command(app, stage)(interrupted)
    with pytest.raises(Interrupted, match=f"^interrupted; {hint}$"):
        app([stage], standalone_mode=False)


def test_a_returned_artifact_is_reported():
    app = typer.Typer(pretty_exceptions_enable=False)
    reported = []

    @app.callback()
    def _group() -> None:
        """Keeps ``toy`` a subcommand."""

    def toy(options: ConfigOptions):
        return "the artifact"

    config_command(app, "toy", ToyConfig, report=lambda artifact, mark: reported.append(artifact))(toy)
    app(["toy", "--name", "n"], standalone_mode=False)
    assert reported == ["the artifact"]

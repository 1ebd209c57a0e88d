"""The ``synthq`` Typer app: global options (``-v``, ``-q``, ``--version``, ``--threads``) and
every command, registered in the order ``synthq --help`` lists them.

The commands live beside this module: :mod:`synthq.cli.inspect_commands` (info, ledger, key,
export, data), :mod:`synthq.cli.stage_commands` (one per stage), :mod:`synthq.cli.search_command`
and :mod:`synthq.cli.run_command`. Nothing here imports torch: commands import what they run.
"""

from __future__ import annotations

import os

import typer

from synthq._version import __version__
from synthq.cli.inspect_commands import data_app, export_command, info_command, key_command, ledger_command
from synthq.cli.options import config_command, plain_arguments, stage_command
from synthq.cli.plan_command import plan_command
from synthq.cli.run_command import run_command
from synthq.cli.search_command import search_command
from synthq.cli.stage_commands import stage_commands
from synthq.config.plan import PlanConfig
from synthq.config.search import SearchConfig
from synthq.runtime.console import progress_interval, set_verbosity

plain_arguments()
app = typer.Typer(
    name="synthq",
    help=(
        "Private synthetic-query retrieval: fine-tune a query generator with differential "
        "privacy, generate synthetic queries, train and evaluate dual encoders, audit leakage."
    ),
    no_args_is_help=True,
    rich_markup_mode=None,
    add_completion=False,
    pretty_exceptions_enable=False,
)


def _version(value: bool) -> None:
    if value:
        typer.echo(f"synthq {__version__}")
        raise typer.Exit()


@app.callback()
def _main(
    verbose: bool = typer.Option(False, "--verbose", "-v", help="Print more detail."),
    quiet: bool = typer.Option(
        False,
        "--quiet",
        "-q",
        help="Hide progress and info lines (results, warnings and errors still print).",
    ),
    version: bool = typer.Option(
        False, "--version", callback=_version, is_eager=True, help="Show the version."
    ),
    threads: int | None = typer.Option(
        None,
        "--threads",
        min=1,
        help="Torch CPU threads per process (default: this process' share of the free cores; "
        "same as SYNTHQ_THREADS).",
    ),
) -> None:
    set_verbosity(0 if quiet else 2 if verbose else 1)
    progress_interval()  # an impossible SYNTHQ_PROGRESS_INTERVAL is refused before any work
    if threads is not None:  # read by synthq.runtime.threads when a stage sets up its device
        os.environ["SYNTHQ_THREADS"] = str(threads)
    if not verbose:
        _quiet_libraries()


def _quiet_libraries() -> None:
    """No progress bars or advice from Hugging Face libraries: synthq reports progress itself."""
    from synthq.runtime.quiet import quiet_process

    quiet_process()


def _add_commands(app: typer.Typer) -> None:
    """Every command, in the order ``synthq --help`` lists them (command groups come last)."""
    app.command("info")(info_command)
    app.command("ledger")(ledger_command)
    app.command("key")(key_command)
    app.command("export")(export_command)
    for stage, command, report in stage_commands():
        stage_command(app, stage, report=report)(command)
    config_command(app, "search", SearchConfig)(search_command)
    config_command(app, "plan", PlanConfig)(plan_command)
    app.command("run")(run_command)
    app.add_typer(data_app, name="data")


_add_commands(app)

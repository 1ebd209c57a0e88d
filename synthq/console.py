"""The shared rich console and progress bars, so every stage reports the same way."""

from __future__ import annotations

from rich.console import Console
from rich.progress import (
    BarColumn,
    MofNCompleteColumn,
    Progress,
    TextColumn,
    TimeElapsedColumn,
    TimeRemainingColumn,
)

console = Console(stderr=True, soft_wrap=True)
_state = {"verbosity": 1}


def set_verbosity(level: int) -> None:
    """0 = quiet (errors only), 1 = normal, 2 = verbose."""
    _state["verbosity"] = level
    console.quiet = level == 0


def follow_main_process() -> None:
    """On torchrun ranks other than 0: no progress bars or info lines (rank 0 shows them);
    warnings and errors still print."""
    _state["verbosity"] = 0


def verbosity() -> int:
    return _state["verbosity"]


def progress(*extra_columns) -> Progress:
    """A progress bar with count, elapsed and remaining time, plus any stage-specific columns
    (for example ``TextColumn("loss {task.fields[loss]:.3f}")``)."""
    return Progress(
        TextColumn("[bold]{task.description}"),
        BarColumn(),
        MofNCompleteColumn(),
        *extra_columns,
        TimeElapsedColumn(),
        TextColumn("eta"),
        TimeRemainingColumn(),
        console=console,
        disable=verbosity() == 0,
        transient=False,
    )


def warn(message: str) -> None:
    console.print(f"[bold yellow]warning:[/] {message}")


def info(message: str) -> None:
    if verbosity() >= 1:
        console.print(message)


def debug(message: str) -> None:
    if verbosity() >= 2:
        console.print(f"[dim]{message}[/]")

"""The shared rich console and progress bars, so every stage reports the same way.

Results go to **stdout** (:data:`output`: each command's result line, the tables of ``eval``,
``report``, ``similarity``, ``info``, ``ledger``, ``data info``, ``search``), so that
``synthq eval ... > results.txt`` or ``| tee`` captures what the command found and nothing else.
Progress, info lines, warnings and errors go to **stderr** (:data:`console`). ``-q`` hides progress
and info lines only, never warnings, errors or results. When stderr is not a terminal (a
log file, SLURM, CI, ``| tee``) the progress bar becomes a plain line every
:data:`LOG_INTERVAL_SECONDS` (``SYNTHQ_PROGRESS_INTERVAL``) with step/total, the stage's own
fields (loss, ε, ...), rate and ETA; :class:`StepFraction` moves a task through a long step part
by part (finetune-lm's micro-batches), so the first line and the ETA come within that interval.
"""

from __future__ import annotations

import math
import os
import time
from typing import Any

from rich.console import Console
from rich.markup import escape
from rich.progress import (
    BarColumn,
    MofNCompleteColumn,
    Progress,
    TaskID,
    TextColumn,
    TimeElapsedColumn,
    TimeRemainingColumn,
)

from synthq.runtime.errors import SettingError

# emoji=False: a source and split such as ``embedded:train:`` is text, not rich's :train: emoji
console = Console(stderr=True, soft_wrap=True, emoji=False)
# Piped or redirected, rich would fold tables to 80 columns; a file gets them whole.
output = Console(soft_wrap=True, width=None if os.isatty(1) else 200, emoji=False)
_state = {"verbosity": 1, "follower": False}
LOG_INTERVAL_SECONDS = 30.0


def set_verbosity(level: int) -> None:
    """0 = quiet (results, warnings and errors only), 1 = normal, 2 = verbose."""
    _state["verbosity"] = level


def follow_main_process() -> None:
    """On torchrun ranks other than 0: no progress bars, info or result lines (rank 0 shows
    them); warnings and errors still print."""
    _state["verbosity"] = 0
    _state["follower"] = True


def verbosity() -> int:
    return _state["verbosity"]


def _duration(seconds: float) -> str:
    if not math.isfinite(seconds):
        return "?"
    seconds = int(round(seconds))
    hours, rest = divmod(seconds, 3600)
    minutes, seconds = divmod(rest, 60)
    return f"{hours}h{minutes:02d}m{seconds:02d}s" if hours else f"{minutes}m{seconds:02d}s"


def _count(value: float) -> str:
    """A task's progress: whole steps as they are, a step part-way through with two decimals."""
    return f"{value:g}" if float(value).is_integer() else f"{value:.2f}"


class LoggedProgress(Progress):
    """A progress display for non-terminals: a plain line per task every ``interval`` seconds
    (and when a task finishes), instead of a bar that only shows up when the stage ends."""

    def __init__(self, *columns, interval: float, **kwargs):
        super().__init__(*columns, disable=True, **kwargs)
        self.interval = interval
        self._logged: dict[TaskID, tuple[float, float]] = {}  # task -> (time, completed) logged

    def line(self, task_id: TaskID) -> str:
        task = self._tasks[task_id]
        total = task.total or 0
        elapsed = task.elapsed or 0.0
        start = task.fields.get("_start", 0.0)
        rate = (task.completed - start) / elapsed if elapsed > 0 else math.nan
        eta = (total - task.completed) / rate if rate and rate > 0 and total else math.inf
        fields = " ".join(
            f"{key}={value:.4g}" if isinstance(value, float) else f"{key}={value}"
            for key, value in task.fields.items()
            if not key.startswith("_")
        )
        share = f" ({100 * task.completed / total:.0f}%)" if total else ""
        return (
            f"{task.description}: {_count(task.completed)}/{total:g}{share} {fields} | "
            f"{rate:.3g}/s elapsed={_duration(elapsed)} eta={_duration(eta)}"
        ).replace("  ", " ")

    def _maybe_log(self, task_id: TaskID, final: bool = False) -> None:
        now = time.monotonic()
        task = self._tasks[task_id]
        last_time, last_completed = self._logged.get(task_id, (task.start_time or now, math.nan))
        due = final or now - last_time >= self.interval or (task.total and task.completed >= task.total)
        if due and task.completed != last_completed:
            console.print(escape(self.line(task_id)), highlight=False)
            self._logged[task_id] = (now, task.completed)

    def add_task(self, description: str, *args, **kwargs) -> TaskID:
        task_id = super().add_task(description, *args, **kwargs)
        self._tasks[task_id].fields["_start"] = self._tasks[task_id].completed
        self._logged[task_id] = (time.monotonic(), self._tasks[task_id].completed)
        return task_id

    def update(self, task_id: TaskID, *args, **kwargs) -> None:
        super().update(task_id, *args, **kwargs)
        self._maybe_log(task_id)

    def advance(self, task_id: TaskID, advance: float = 1) -> None:
        super().advance(task_id, advance)
        self._maybe_log(task_id)

    def stop(self) -> None:
        for task_id in list(self._tasks):
            self._maybe_log(task_id, final=True)
        super().stop()


def progress_interval() -> float:
    """Seconds between plain progress lines: ``SYNTHQ_PROGRESS_INTERVAL``, else
    :data:`LOG_INTERVAL_SECONDS` (0: a line at every update); anything but a finite number ≥ 0 is a
    one-line error."""
    value = os.environ.get("SYNTHQ_PROGRESS_INTERVAL", "").strip()
    if not value:
        return LOG_INTERVAL_SECONDS
    try:
        seconds = float(value)
    except ValueError:
        seconds = math.nan
    if not (math.isfinite(seconds) and seconds >= 0):
        raise SettingError(f"SYNTHQ_PROGRESS_INTERVAL must be a number of seconds ≥ 0, not {value!r}")
    return seconds


def progress(*extra_columns) -> Progress:
    """A progress bar with count, elapsed and remaining time, plus any stage-specific columns
    (for example ``TextColumn("loss {task.fields[loss]:.3f}")``); plain periodic lines when the
    output is not a terminal; nothing under ``-q``."""
    if verbosity() > 0 and not console.is_terminal:
        interval = progress_interval()
        return LoggedProgress(console=console, interval=interval)
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


class StepFraction:
    """Moves a progress task through a step by fractions, as the step's parts finish (a DP step's
    micro-batches, minutes on a CPU): call it with ``(done, total)`` after each part and
    :meth:`finish` when the step ends (the task then stands exactly on the next whole step). The
    bar, the plain lines (every :data:`LOG_INTERVAL_SECONDS`) and the ETA move from the first part
    on, not only when a whole step is done. Only the share of the step is shown (two decimals in
    the plain lines), on the console: a DP step's size is that of a secret sample."""

    def __init__(self, bar: Progress, task: TaskID):
        self.bar, self.task = bar, task
        self.base = next(t.completed for t in bar.tasks if t.id == task)

    # A step's parts take it at most this far: only finish() completes it, after the stage has
    # updated the task's fields (ε, loss), so the line that completes a step shows them.
    PART_WAY = 0.99

    def __call__(self, done: int, total: int) -> None:
        share = min(self.PART_WAY, done / total) if total else self.PART_WAY
        self.bar.update(self.task, completed=self.base + share)

    def finish(self) -> None:
        self.base += 1
        self.bar.update(self.task, completed=self.base)


def result(message: Any, markup: bool = True) -> None:
    """A command's result (a line or a rich table) on stdout: printed even under ``-q`` (not on
    torchrun followers, whose rank 0 prints it)."""
    if not _state["follower"]:
        output.print(message, highlight=False, markup=markup)


def warn(message: str) -> None:
    console.print(f"[bold yellow]warning:[/] {message}")


def info(message: str) -> None:
    if verbosity() >= 1:
        console.print(message)


def debug(message: str) -> None:
    if verbosity() >= 2:
        console.print(f"[dim]{message}[/]")

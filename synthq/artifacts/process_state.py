"""The artifact layer's process-global state: the outputs this process saw, is writing, finished, failed.

The one place holding mutable state of :mod:`synthq.artifacts`, in :data:`this_process`.
:func:`synthq.artifacts.freshness.existing_result` notes what it saw at an output it lets a stage
write; :func:`synthq.artifacts.create.create_artifact` notes what it is writing, has finished or
has failed. The command line reads it through :func:`writes_so_far`, :func:`written_here` and
:func:`output_in_trouble`.
"""

from __future__ import annotations

from collections.abc import Iterator
from contextlib import contextmanager
from contextvars import ContextVar
from dataclasses import dataclass, field
from pathlib import Path


@dataclass
class ProcessRecord:
    """What this process has done with artifacts so far (one instance: :data:`this_process`)."""

    # What existing_result saw at each output it let a stage write (the manifest's identity, or
    # None), so that create_artifact can tell when another process finished that output in
    # between: the lock is taken only when the stage starts writing, after its inputs are read.
    seen: dict[Path, tuple[int, int] | None] = field(default_factory=dict)
    written: list[Path] = field(default_factory=list)  # artifacts finished by this process, in order
    writing: list[Path] = field(default_factory=list)  # outputs this process is writing now, innermost last
    failed: list[Path] = field(default_factory=list)  # outputs whose write failed, last last


this_process = ProcessRecord()


# Outputs a running pipeline owns (the stage it is running now): reused when up to date for the
# stage's inputs as they are now, replaced when not, without the user's --force. A context
# variable, not process state: another thread's direct stage call on the same path is not owned.
_pipeline_owned: ContextVar[frozenset[Path]] = ContextVar("synthq_pipeline_owned", default=frozenset())


@contextmanager
def owned_by_pipeline(*outs: str | Path) -> Iterator[None]:
    """While a pipeline runs the stage writing ``outs`` (in this thread or task): a stale
    artifact there may be replaced (the pipeline owns its outputs); one up to date for the
    stage's current inputs is reused."""
    token = _pipeline_owned.set(_pipeline_owned.get() | {Path(out).resolve() for out in outs})
    try:
        yield
    finally:
        _pipeline_owned.reset(token)


def may_replace(out: str | Path, force: bool) -> bool:
    """Whether an existing, out-of-date artifact at ``out`` may be replaced: with the user's
    ``--force``, or when a running pipeline owns ``out``."""
    return force or Path(out).resolve() in _pipeline_owned.get()


def writes_so_far() -> int:
    """A mark for :func:`written_here`: how many artifacts this process has finished."""
    return len(this_process.written)


def written_here(path: str | Path, since: int = 0) -> bool:
    """Whether this process finished the artifact at ``path`` after the mark ``since`` (rather
    than finding it up to date)."""
    return Path(path).resolve() in this_process.written[since:]


def output_in_trouble() -> Path | None:
    """The artifact this process is writing (innermost) or, once the error has left it, the one
    whose write failed last: for errors that carry no file name (a full disk reported by a
    library) and are reported after the stage has unwound."""
    if this_process.writing:
        return this_process.writing[-1]
    return this_process.failed[-1] if this_process.failed else None

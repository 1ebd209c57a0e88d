"""The entry point, :func:`main`: each failure a user can cause as one line and an exit status.

Exit status: 0 success, 1 a file-system problem (permission, full disk), 2 a usage or input
error (one line, no traceback), 130 interrupted (Ctrl-C), 143 terminated (SIGTERM, handled as
Ctrl-C: the lock released, a resumable stage's checkpoint kept, one line). A bug keeps its
traceback.
"""

from __future__ import annotations

import errno
import os
import shutil
import signal
import sys
import warnings
from pathlib import Path

import typer
from rich.markup import escape

from synthq.cli.app import app
from synthq.cli.options import Interrupted
from synthq.runtime.console import console
from synthq.runtime.errors import SynthqError, os_error_behind
from synthq.runtime.quiet import one_line_warning

_DISK_ADVICE = {
    errno.ENOSPC: "free some space or choose an --out on another disk, then rerun",
    errno.EDQUOT: "free some of your quota or choose an --out elsewhere, then rerun",
    errno.EACCES: "choose a writable --out (or fix the directory's permissions)",
    errno.EPERM: "choose a writable --out (or fix the directory's permissions)",
    errno.EROFS: "the file system is read-only; choose an --out elsewhere",
}


_FULL = (errno.ENOSPC, errno.EDQUOT)


def _os_error_line(error: OSError) -> str:
    from synthq.artifacts.freshness import interrupted_checkpoint
    from synthq.artifacts.process_state import output_in_trouble

    trouble = output_in_trouble()
    where = error.filename or (f"while writing {trouble}" if trouble is not None else None)
    advice = _DISK_ADVICE.get(error.errno, "check the path and rerun")
    setting = _setting_holding(error.filename)
    if setting is None and not error.filename and error.errno in _FULL:  # the library named no file
        setting = _full_setting_elsewhere(trouble)
    if setting is not None and error.errno in _DISK_ADVICE:  # not an --out: the setting names it
        variable, root = setting
        advice = f"point {variable} at a writable directory with space (now {root}), then rerun"
    elif where is None and error.errno in _FULL:  # no output and no file named: the cache is written
        from synthq.runtime.paths import cache_root

        advice = f"free some space, or point SYNTHQ_CACHE (now {cache_root()}) at another disk, then rerun"
    if trouble is not None and error.errno in _FULL and (kept := interrupted_checkpoint(trouble)) is not None:
        advice += (
            f"; the checkpoint in {kept.parent} is kept: rerun with --resume to continue from it, or "
            "delete it to free its space"
        )
    text = f"{error.strerror or error}; {advice}"
    return f"{where}: {text}" if where else text


def _disk(path: Path) -> tuple[int, int, int] | None:
    """``(device, free bytes, total bytes)`` of the file system holding ``path`` (or its nearest
    existing parent)."""
    for candidate in (path, *path.parents):
        try:
            device = candidate.stat().st_dev
            usage = shutil.disk_usage(candidate)
        except OSError:
            continue
        return device, usage.free, usage.total
    return None


def _full_setting_elsewhere(trouble: Path | None) -> tuple[str, Path] | None:
    """``(variable, directory)`` of synthq's cache or state directory when it lies on a full disk
    other than the ``--out``'s: a full disk that a library reports without a file name is then
    theirs, not the output's (a full cache used to be blamed on ``--out``)."""
    from synthq.privacy.keys import state_root
    from synthq.runtime.paths import cache_root

    out_disk = _disk(Path(os.path.abspath(trouble)).parent) if trouble is not None else None
    for variable, root in (("SYNTHQ_CACHE", cache_root()), ("SYNTHQ_STATE", state_root())):
        disk = _disk(Path(os.path.abspath(root)))
        if disk is None or (out_disk is not None and disk[0] == out_disk[0]):
            continue
        device, free, total = disk
        if free < max(64 * 2**20, total // 100):
            return variable, Path(root)
    return None


def _setting_holding(filename) -> tuple[str, Path] | None:
    """``(variable, directory)`` when ``filename`` lies in synthq's state or cache directory."""
    from synthq.privacy.keys import state_root
    from synthq.runtime.paths import cache_root

    if not filename:
        return None
    path = Path(os.path.abspath(filename))
    for variable, root in (("SYNTHQ_STATE", state_root()), ("SYNTHQ_CACHE", cache_root())):
        root = Path(os.path.abspath(root))
        if path == root or root in path.parents:
            return variable, root
    return None


class _Terminated:
    """SIGTERM received: raised as a KeyboardInterrupt, so that everything Ctrl-C cleans up
    (output locks, partial artifacts, process groups) is cleaned up the same way."""

    received = False

    @classmethod
    def handler(cls, signum, frame) -> None:
        if not cls.received:  # a second SIGTERM during the clean-up does not interrupt it
            cls.received = True
            raise KeyboardInterrupt


def _handle_sigterm():
    """Install the SIGTERM handler; the previous handler (None off the main thread, where
    signals cannot be handled)."""
    _Terminated.received = False
    try:
        return signal.signal(signal.SIGTERM, _Terminated.handler)
    except ValueError:
        return None


def _interrupted(message: str) -> None:
    """Ctrl-C (130) or SIGTERM (143): one line, the command's own advice on what to do next."""
    if _Terminated.received:
        _fail(f"terminated (SIGTERM){message.removeprefix('interrupted')}", 128 + signal.SIGTERM)
    _fail(message, 130)


def _fail(message: str, status: int) -> None:
    console.print(f"[bold red]synthq:[/] {escape(message)}", highlight=False)
    sys.exit(status)


GLOBAL_FLAGS = ("-q", "--quiet", "-v", "--verbose")


def global_flags_first(argv: list[str]) -> list[str]:
    """``synthq eval ... -q`` read as ``synthq -q eval ...``: the global flags work wherever they
    are typed (no command has options of those names); nothing after ``--`` moves."""
    end = argv.index("--") if "--" in argv else len(argv)
    head = argv[:end]
    return [a for a in head if a in GLOBAL_FLAGS] + [a for a in head if a not in GLOBAL_FLAGS] + argv[end:]


def _run_app():
    """The app, then the process group left (if a stage joined one) while the interpreter lives."""
    from synthq.runtime import distributed

    try:
        status = app(args=global_flags_first(sys.argv[1:]), standalone_mode=False, prog_name="synthq")
    except BaseException:
        distributed.leave(completed=False)
        raise
    distributed.leave(completed=True)
    return status


def main() -> None:
    """Console entry point: every failure a user can cause prints one line, no traceback.

    Exit status 2 for a usage or input error, 1 for a file-system problem, 130 for Ctrl-C, 143
    for SIGTERM."""
    warnings.showwarning = one_line_warning
    previous = _handle_sigterm()
    try:
        _main()
    finally:
        if previous is not None:
            signal.signal(signal.SIGTERM, previous)


def _main() -> None:
    from pydantic import ValidationError

    from synthq.config.loading import validation_message

    try:
        status = _run_app()
    except Interrupted as error:
        _interrupted(str(error))
    except (KeyboardInterrupt, typer.Abort):
        _interrupted("interrupted; rerun the command to start again")
    except SynthqError as error:
        _fail(str(error), 2)
    except ValidationError as error:
        _fail(validation_message(error), 2)
    except typer.Exit as exit_:
        sys.exit(exit_.exit_code)
    except OSError as error:
        _fail(_os_error_line(error), 1)
    except Exception as error:
        if (behind := os_error_behind(error)) is not None:  # a full disk inside torch / safetensors
            _fail(_os_error_line(behind), 1)
        if not (hasattr(error, "format_message") and hasattr(error, "exit_code")):
            raise  # a bug: keep the traceback
        # (typer's vendored) click usage errors: unknown option, missing argument, bad choice
        context = getattr(error, "ctx", None)
        command = context.command_path if context is not None else "synthq"
        message = error.format_message().replace("Value error, ", "")
        subcommand = command.removeprefix("synthq").strip()  # one "synthq:" prefix per line
        where = f"{subcommand}: " if subcommand else ""
        _fail(f"{where}{message} (see {command} --help)", error.exit_code)
    if isinstance(status, int) and status:
        sys.exit(status)

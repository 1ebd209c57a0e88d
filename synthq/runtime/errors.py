"""Errors a user can act on. The CLI prints their message without a traceback."""

from __future__ import annotations


class SynthqError(Exception):
    """Base class: a problem with the user's input, files or environment (not a bug)."""


class DataError(SynthqError):
    """Malformed or inconsistent data. Carries the file and line when known."""

    def __init__(self, message: str, path: object | None = None, line: int | None = None):
        self.path = None if path is None else str(path)
        self.line = line
        where = ""
        if self.path is not None:
            where = f"{self.path}:{line}: " if line is not None else f"{self.path}: "
        super().__init__(f"{where}{message}")


class ArtifactError(SynthqError):
    """An artifact directory is missing, of the wrong stage, unknown schema, or altered."""


class PrivacyError(SynthqError):
    """An impossible privacy budget or accountant request."""


class SettingError(SynthqError, ValueError):
    """An option or environment variable with a value that cannot work (``SYNTHQ_THREADS=abc``,
    ``SYNTHQ_PROGRESS_INTERVAL=-5``)."""


class ModelResolutionError(SynthqError):
    """A model spec could not be resolved to weights on this machine."""


def os_error_behind(error: BaseException) -> OSError | None:
    """The file-system error behind a library's own exception, if any: an ``OSError`` in its
    cause/context chain (``torch.save`` to an open file wraps one in a RuntimeError), or a Rust
    I/O error spelt ``(os error N)`` in the message (safetensors' ``SafetensorError``)."""
    import errno
    import os
    import re

    seen: set[int] = set()
    current: BaseException | None = error
    while current is not None and id(current) not in seen:
        seen.add(id(current))
        if isinstance(current, OSError) and current.errno is not None:
            return current
        match = re.search(r"\(os error (\d+)\)", str(current))
        if match and int(match.group(1)) in errno.errorcode:
            number = int(match.group(1))
            return OSError(number, os.strerror(number))
        current = current.__cause__ or current.__context__
    return None

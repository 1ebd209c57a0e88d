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


class ModelResolutionError(SynthqError):
    """A model spec could not be resolved to weights on this machine."""

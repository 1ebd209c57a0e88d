"""The accountant's answers remembered across commands, so that opening an artifact is instant.

Every artifact's ε is *recomputed* from the mechanism parameters it records each time it is opened
(:func:`synthq.privacy.accounting.recomputed_epsilon`). The accountant lives in Opacus, whose import
pulls in torch and scipy (about 4 s): ``synthq info`` and ``synthq ledger`` would spend it on every
call. This module remembers each answer the accountant gave, keyed by everything the answer depends
on (accountant, σ, δ, q, steps, Opacus' version), in synthq's state directory.

It is a memo, not a record: an entry is the accountant's own output for exactly those inputs,
so using it is recomputing. Each entry carries ``HMAC(key, inputs, answer)`` with the owner's
key (:mod:`synthq.privacy.keys`); an entry that does not verify (edited, or written under another key) is
ignored and recomputed. The file is never part of an artifact.
"""

from __future__ import annotations

import hashlib
import hmac
import json
import os
import tempfile
from collections.abc import Callable
from importlib import metadata
from pathlib import Path

from synthq.privacy.keys import owner_key, state_dir

MEMO_FILE = "accountant-memo.json"
# Entries beyond this are dropped oldest first (a few hundred bytes each).
MAX_ENTRIES = 4096

_loaded: dict[str, dict[str, dict]] = {}  # memo file -> its entries, read once per process


def _opacus_version() -> str:
    try:
        return metadata.version("opacus")
    except metadata.PackageNotFoundError:
        return "absent"


def _mac(entry_key: str, value: float) -> str:
    return hmac.new(
        owner_key(), f"accountant\x1f{entry_key}\x1f{value!r}".encode(), hashlib.sha256
    ).hexdigest()


def _path() -> Path:
    return state_dir() / MEMO_FILE


def _entries(path: Path) -> dict[str, dict]:
    if str(path) not in _loaded:
        try:
            data = json.loads(path.read_text())
        except (OSError, ValueError):
            data = {}
        _loaded[str(path)] = data if isinstance(data, dict) else {}
    return _loaded[str(path)]


def _save(path: Path, entries: dict[str, dict]) -> None:
    if len(entries) > MAX_ENTRIES:
        for stale in list(entries)[: len(entries) - MAX_ENTRIES]:
            del entries[stale]
    try:
        descriptor, temporary = tempfile.mkstemp(dir=path.parent, prefix=".memo-")
        with os.fdopen(descriptor, "w") as handle:
            json.dump(entries, handle)
        os.replace(temporary, path)
    except OSError:  # a read-only state directory costs speed, never correctness
        return


def remembered(
    compute: Callable[[float, float, float, int, str], float],
    noise_multiplier: float,
    delta: float,
    sample_rate: float,
    steps: int,
    accountant: str,
) -> float:
    """``compute(noise_multiplier, delta, sample_rate, steps, accountant)``, from the memo when
    this installation computed it before with the same Opacus version (and the entry verifies)."""
    entry_key = json.dumps([accountant, noise_multiplier, delta, sample_rate, steps, _opacus_version()])
    path = _path()
    entries = _entries(path)
    entry = entries.get(entry_key)
    if isinstance(entry, dict):
        value = entry.get("epsilon")
        if isinstance(value, int | float) and hmac.compare_digest(
            _mac(entry_key, float(value)), str(entry.get("mac"))
        ):
            return float(value)
    value = float(compute(noise_multiplier, delta, sample_rate, steps, accountant))
    entries[entry_key] = {"epsilon": value, "mac": _mac(entry_key, value)}
    _save(path, entries)
    return value

"""The data owner's secret key: keyed identifiers of private data and the seal of every manifest.

Two things synthq writes must not be testable by someone without the owner's secret:

* **identifiers of private data** — a plain sha256 of a private dataset lets anyone holding
  candidate datasets test which one was used (a membership oracle at ε = ∞). synthq records
  ``HMAC(key, sha256(content))`` instead (:func:`keyed_digest`): stable for the owner (resume,
  up-to-date checks, the ledger), meaningless without the key;
* **the guarantee itself** — every manifest carries ``seal = HMAC(key, manifest)``
  (:func:`seal`); an edit to any field (ε, δ, mechanism, the releases, a private flag) is
  refused when the owner opens it (:func:`check_seal`). A manifest sealed under another key
  (a colleague's, or a downloaded release) can be read but not verified: synthq says so beside
  its ε.

The key is 32 random bytes created on first use in synthq's *state* directory
(``$SYNTHQ_STATE``, else ``$XDG_STATE_HOME/synthq``, else ``~/.local/state/synthq``), mode 0600,
never inside an artifact and never in a cache that users clear. ``synthq key`` shows where it is
and exports or imports it, so a team can share one.
"""

from __future__ import annotations

import errno
import functools
import hashlib
import hmac
import json
import os
import secrets
import tempfile
from pathlib import Path
from typing import Any

from synthq.runtime.errors import ArtifactError, SynthqError

KEY_FILE = "owner.key"
KEY_BYTES = 32
SEAL_FIELD = "seal"


def state_root() -> Path:
    """Where synthq's state lives (not created): ``$SYNTHQ_STATE``, else the XDG state home."""
    root = os.environ.get("SYNTHQ_STATE")
    if not root:
        xdg = os.environ.get("XDG_STATE_HOME")
        root = str(Path(xdg) / "synthq") if xdg else str(Path.home() / ".local" / "state" / "synthq")
    return Path(root).expanduser()


def state_dir(*parts: str) -> Path:
    """synthq's state directory (the key, private unit sets, the accountant memo)."""
    path = state_root().joinpath(*parts)
    path.mkdir(parents=True, exist_ok=True, mode=0o700)
    return path


def key_path() -> Path:
    return state_dir() / KEY_FILE


def _write_whole(file: Path, data: bytes, place=None) -> None:
    """Write ``data`` to a hidden file beside ``file`` (mode 0600) and hand it to ``place``
    (default ``_place``: the first key wins; ``os.replace`` to install one over another): ``file``
    appears whole or not at all. A failed write (a full disk) removes the hidden copy and raises
    the OSError with ``file`` as its filename, so the message names the state directory."""
    descriptor, staged = tempfile.mkstemp(prefix=f".{file.name}.", suffix=".tmp", dir=file.parent)
    try:
        with os.fdopen(descriptor, "wb") as handle:
            handle.write(data)
            handle.flush()
            os.fsync(handle.fileno())
        (place or _place)(Path(staged), file)
    except OSError as error:
        if error.filename or isinstance(error, FileExistsError):
            raise
        raise OSError(error.errno, error.strerror or str(error), str(file)) from error
    finally:
        Path(staged).unlink(missing_ok=True)


def _place(staged: Path, file: Path) -> None:
    """The first key wins: a hard link never replaces a key another process placed meanwhile."""
    try:
        os.link(staged, file)
    except FileExistsError:  # another process created it meanwhile: use theirs
        pass
    except OSError as error:  # a file system without hard links
        if error.errno not in (errno.EPERM, errno.ENOTSUP, errno.EOPNOTSUPP, errno.EMLINK, errno.ENOSYS):
            raise
        if not file.exists():
            os.replace(staged, file)


@functools.lru_cache(maxsize=8)
def _load_key(path: str) -> bytes:
    file = Path(path)
    if not file.exists():
        _write_whole(file, secrets.token_bytes(KEY_BYTES))
    data = file.read_bytes()
    if not data:  # left by an older synthq, which wrote the key in place, on a full disk
        raise SynthqError(
            f"{file}: an empty owner key (a first write cut off, e.g. by a full disk): nothing was ever "
            f"sealed with it; remove it (rm {file}) and rerun to create a new one"
        )
    if len(data) != KEY_BYTES:
        raise SynthqError(f"{file}: not a synthq key ({len(data)} bytes, expected {KEY_BYTES})")
    mode = file.stat().st_mode & 0o777
    if mode & 0o077:  # as ssh refuses an unprotected private key
        raise SynthqError(
            f"{file}: the owner key is open to other users (mode {mode:03o}): whoever reads it can "
            f"match the keyed unit sets and seal manifests as you; run chmod 600 {file} (on a file "
            "system without permissions, point SYNTHQ_STATE at one that has them)"
        )
    return data


def owner_key() -> bytes:
    """This installation's secret key (created on first use)."""
    return _load_key(str(key_path()))


def key_id(key: bytes | None = None) -> str:
    """A public name for a key (reveals nothing about it): which key sealed a manifest."""
    return hmac.new(key or owner_key(), b"synthq key id", hashlib.sha256).hexdigest()[:16]


def keyed_digest(*parts: str | bytes) -> str:
    """``HMAC-SHA256(key, parts)`` as hex: an identifier only the key's holder can test."""
    mac = hmac.new(owner_key(), digestmod=hashlib.sha256)
    for part in parts:
        mac.update(part if isinstance(part, bytes) else part.encode())
        mac.update(b"\x1f")
    return mac.hexdigest()


def private_data_digest(content_sha256: str) -> str:
    """The recorded identifier of a private dataset: keyed, so a candidate dataset cannot be
    tested against it without the key."""
    return "hmac:" + keyed_digest("private-data", content_sha256)


def unit_digest_values(kind: str, unit_ids: list[str]) -> list[int]:
    """The 8-byte keyed digest of each of ``unit_ids`` as an integer, in their order."""
    key = owner_key()
    return [
        int.from_bytes(hmac.new(key, f"unit\x1f{kind}\x1f{u}".encode(), hashlib.sha256).digest()[:8], "big")
        for u in unit_ids
    ]


def unit_digests(kind: str, unit_ids: list[str]) -> bytes:
    """Sorted 8-byte keyed digests of privacy units (``kind`` = query or user): what the ledger
    intersects to compose releases over the units they share. Never released."""
    values = sorted(unit_digest_values(kind, list(dict.fromkeys(unit_ids))))
    return b"".join(v.to_bytes(8, "big") for v in values)


def _canonical(manifest: dict) -> bytes:
    body = {k: v for k, v in manifest.items() if k != SEAL_FIELD}
    return json.dumps(body, sort_keys=True, separators=(",", ":"), ensure_ascii=False).encode()


def seal(manifest: dict[str, Any]) -> dict[str, str]:
    """The seal of a manifest (as it reads back from JSON): key id and HMAC of everything else."""
    key = owner_key()
    return {"key_id": key_id(key), "hmac": hmac.new(key, _canonical(manifest), hashlib.sha256).hexdigest()}


def check_seal(manifest: dict, where: str) -> bool:
    """``True`` when this installation sealed the manifest and it is unchanged; ``False`` when it
    was sealed under another key (readable, not verifiable). Raises when it was edited or has no
    seal."""
    stamp = manifest.get(SEAL_FIELD)
    if not isinstance(stamp, dict) or "hmac" not in stamp or "key_id" not in stamp:
        raise ArtifactError(f"{where}: the manifest has no seal: it was edited, or not written by synthq")
    key = owner_key()
    if stamp["key_id"] != key_id(key):
        return False
    expected = hmac.new(key, _canonical(manifest), hashlib.sha256).hexdigest()
    if not hmac.compare_digest(expected, str(stamp["hmac"])):
        raise ArtifactError(
            f"{where}: the manifest was edited after synthq wrote it (its seal does not match); "
            "its guarantee cannot be trusted — re-run the stage"
        )
    return True


def export_key(destination: Path) -> Path:
    """Copy the key to ``destination`` (mode 0600) for a colleague's ``synthq key --import``."""
    destination = Path(destination)
    if destination.exists():
        raise SynthqError(f"{destination}: already exists; choose a new file")
    descriptor = os.open(destination, os.O_WRONLY | os.O_CREAT | os.O_EXCL, 0o600)
    with os.fdopen(descriptor, "wb") as handle:
        handle.write(owner_key())
    return destination


def import_key(source: Path, replace: bool = False) -> str:
    """Install a shared key; refuses to replace a different existing key unless ``replace``
    (artifacts sealed under the old key could no longer be verified)."""
    data = Path(source).read_bytes()
    if len(data) != KEY_BYTES:
        raise SynthqError(f"{source}: not a synthq key ({len(data)} bytes, expected {KEY_BYTES})")
    target = key_path()
    if target.exists() and target.read_bytes() != data and not replace:
        raise SynthqError(
            f"{target}: a different key is installed (id {key_id()}); artifacts sealed under it could "
            "no longer be verified — pass --replace to install the new key anyway"
        )
    _write_whole(target, data, place=os.replace)
    _load_key.cache_clear()
    return key_id(data)

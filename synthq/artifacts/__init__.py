"""The artifact contract: every stage writes exactly one directory holding ``manifest.json``.

An artifact is created atomically (:func:`create_artifact` writes into a hidden sibling
``.<name>.partial`` and renames it into place only when the stage succeeded), opened with
verification (:func:`open_artifact` checks schema, stage and every payload hash), and linked to
its inputs by the sha256 of their manifests. :func:`find_up_to_date` tells a stage that the same
config on the same inputs was already computed, so it can skip.
"""

from __future__ import annotations

import contextlib
import datetime as _dt
import hashlib
import json
import math
import os
import platform
import secrets
import shutil
import tempfile
import time
from collections.abc import Iterable, Iterator, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from synthq import __version__
from synthq.config.registry import STAGES as STAGE_REGISTRY
from synthq.privacy.guarantee import Guarantee, check_recorded_epsilon, compose_releases
from synthq.privacy.keys import check_seal, key_id, private_data_digest, seal
from synthq.runtime import distributed
from synthq.runtime.errors import ArtifactError, DataError

# 2: guarantees recomputed from recorded releases, keyed private-data digests, sealed manifests.
SCHEMA_VERSION = 2
MANIFEST = "manifest.json"
CHECKPOINTS = "checkpoints"  # inside a partial artifact: what --resume continues from
PARTIAL_SUFFIX = ".partial"
STAGES = tuple(STAGE_REGISTRY)  # the stage names, from the one registry of stages
# Fields that never change what a stage computes, so they are left out of its fingerprint.
VOLATILE_CONFIG_KEYS = frozenset({"out", "force", "resume"})
DIAGNOSTICS = "diagnostics"
DIAGNOSTICS_NOTE = (
    "computed from the private data without noise (ε = ∞): for the data owner only; "
    "`synthq export` leaves it out of a release"
)


def sha256_file(path: Path, chunk_size: int = 1 << 20) -> str:
    digest = hashlib.sha256()
    with open(path, "rb") as handle:
        while chunk := handle.read(chunk_size):
            digest.update(chunk)
    return digest.hexdigest()


LARGE_FILE_BYTES = 16 << 20


def file_digest(path: Path) -> str:
    """sha256 of a file's whole content. A large file's digest is remembered while its stat
    (device, inode, size, mtime, ctime) is unchanged — the data layer's
    :func:`synthq.data.store.content_digest`, one cache for both — so an unchanged multi-GB corpus
    is read once, not on every up-to-date check."""
    path = Path(path)
    if path.stat().st_size <= LARGE_FILE_BYTES:
        return sha256_file(path)
    from synthq.data.store import content_digest  # numpy/pyarrow only when a large file is hashed

    return content_digest(path)


def sha256_tree(root: Path, exclude: Iterable[str] = ()) -> str:
    """One digest for a directory: relative paths and full contents of all files, sorted.

    Every byte counts (an edit in the middle of a 20 GB corpus is seen); files over 16 MiB
    have their digest remembered (see :func:`file_digest`)."""
    excluded = set(exclude)
    digest = hashlib.sha256()
    for path in sorted(p for p in Path(root).rglob("*") if p.is_file()):
        rel = path.relative_to(root).as_posix()
        if rel in excluded or rel.startswith(".") or "/." in rel:
            continue
        digest.update(rel.encode())
        digest.update(file_digest(path).encode())
    return digest.hexdigest()


def _json_default(value: Any) -> Any:
    if isinstance(value, Path):
        return str(value)
    if hasattr(value, "model_dump"):
        return value.model_dump(mode="json")
    raise TypeError(f"cannot serialise {type(value).__name__} into a manifest")


def json_safe(value: Any) -> Any:
    """Replace non-finite floats by the strings "inf", "-inf", "nan" so manifests are standard
    JSON (ε = ∞ is common); synthq's readers turn them back into floats."""
    if isinstance(value, float) and not math.isfinite(value):
        return "nan" if math.isnan(value) else ("inf" if value > 0 else "-inf")
    if isinstance(value, dict):
        return {k: json_safe(v) for k, v in value.items()}
    if isinstance(value, list | tuple):
        return [json_safe(v) for v in value]
    return value


def config_to_dict(config: Any) -> dict:
    if config is None:
        return {}
    if hasattr(config, "model_dump"):
        return json_safe(config.model_dump(mode="json"))
    return json_safe(json.loads(json.dumps(dict(config), default=_json_default)))


def check_resumable(path: Path, state: dict, config: Any, inputs: list[dict]) -> None:
    """Refuse to resume from the private checkpoint ``state`` (its ``config`` and ``inputs`` as
    JSON) when it was written with other settings or on inputs whose content has changed since:
    the accounting of the work already done was for the data it read."""
    saved_inputs = {
        (r.get("role") or r.get("kind"), r["path"]): r["sha256"]
        for r in json.loads(state.get("inputs", "[]"))
    }
    for record in inputs:
        if saved_inputs.get((record.get("role") or record.get("kind"), record["path"])) != record["sha256"]:
            raise ArtifactError(
                f"{path}: cannot resume, the input {record['path']} changed since the interrupted run "
                "read it; drop --resume to start over on the new data"
            )
    saved, now = json.loads(state["config"]), config_to_dict(config)
    volatile = {"out", "force", "resume", "device"}
    changed = sorted(k for k in set(saved) | set(now) if k not in volatile and saved.get(k) != now.get(k))
    if changed:
        raise ArtifactError(
            f"{path}: cannot resume, the interrupted run used other settings ({', '.join(changed)}); "
            "rerun with those settings, or drop --resume to start over"
        )


def config_fingerprint(config: Any, inputs: list[dict]) -> str:
    """What decides whether an existing artifact is up to date: the config (minus volatile keys)
    and the manifest hashes of the inputs."""
    relevant = {k: v for k, v in config_to_dict(config).items() if k not in VOLATILE_CONFIG_KEYS}
    payload = {"config": relevant, "inputs": sorted(i["sha256"] for i in inputs)}
    return hashlib.sha256(json.dumps(payload, sort_keys=True, default=_json_default).encode()).hexdigest()


def environment() -> dict:
    """Library versions and the device, recorded in every manifest."""
    env = {"python": platform.python_version(), "platform": platform.platform()}
    for name in ("torch", "transformers", "opacus", "sentence_transformers", "peft"):
        try:
            module = __import__(name)
            env[name] = getattr(module, "__version__", "unknown")
        except Exception:  # an optional library that is not importable is simply not recorded
            continue
    try:
        import torch

        env["device"] = torch.cuda.get_device_name(0) if torch.cuda.is_available() else "cpu"
        env["cpu_threads"] = torch.get_num_threads()
    except Exception:
        env["device"] = "unknown"
    return env


@dataclass
class Artifact:
    """A verified, finished artifact directory.

    ``verified`` is False for a manifest sealed under another installation's key: its guarantee
    is still recomputed from what it records, but an edit cannot be ruled out, and
    :attr:`privacy` says so among its assumptions."""

    path: Path
    manifest: dict
    verified: bool = True

    @property
    def stage(self) -> str:
        return self.manifest["stage"]

    @property
    def config(self) -> dict:
        return self.manifest.get("config", {})

    @property
    def privacy(self) -> Guarantee:
        guarantee = Guarantee.from_manifest(self.manifest["privacy"])
        return guarantee if self.verified else guarantee.assuming(self.unverified_assumption)

    @property
    def unverified_assumption(self) -> str:
        stamp = self.manifest.get("seal", {})
        return (
            f"the manifest of {self.path} was not edited: it was sealed under another key "
            f"(id {stamp.get('key_id')}; this installation's is {key_id()}), so synthq cannot verify it"
        )

    @property
    def releases(self) -> list[dict]:
        """Every read of private data behind this artifact, as recorded when it was written."""
        return self.manifest.get("releases", [])

    @property
    def metrics(self) -> dict:
        return self.manifest.get("metrics", {})

    @property
    def timings(self) -> dict:
        return self.manifest.get("timings", {})

    @property
    def inputs(self) -> list[dict]:
        return self.manifest.get("inputs", [])

    @property
    def manifest_hash(self) -> str:
        return sha256_file(self.path / MANIFEST)

    def input_record(self) -> dict:
        return {"path": str(self.path), "kind": "artifact", "stage": self.stage, "sha256": self.manifest_hash}


def data_input_record(path: Path, name: str | None = None, private: bool = False) -> dict:
    """Lineage entry for a plain data directory (a BEIR dir that is not an artifact).

    Private data is identified by a keyed digest (:func:`synthq.privacy.keys.private_data_digest`), never
    by its plain sha256, which anyone holding candidate datasets could test."""
    path = Path(path)
    digest = sha256_tree(path)
    record = {"path": str(path), "kind": "data", "name": name or path.name, "sha256": digest}
    if private:
        record.update(sha256=private_data_digest(digest), private=True)
    return record


def _read_manifest(path: Path) -> dict:
    manifest_path = path / MANIFEST
    if not path.exists():
        raise ArtifactError(f"{path}: no such artifact directory")
    if not manifest_path.is_file():
        raise ArtifactError(f"{path}: not an artifact (no {MANIFEST}); an interrupted run leaves none")
    try:
        return json.loads(manifest_path.read_text(encoding="utf-8"))
    except (json.JSONDecodeError, UnicodeDecodeError) as error:
        raise ArtifactError(f"{manifest_path}: corrupt manifest ({error})") from error


def public_file_record(path: Path, name: str) -> dict:
    """Lineage entry for a public file a stage reads (a corpus, a document list)."""
    if not Path(path).is_file():
        raise DataError("no such file", Path(path))
    return {"path": str(path), "kind": "data", "name": name, "sha256": file_digest(Path(path))}


def open_artifact(
    path: str | Path, stage: str | Iterable[str] | None = None, verify: bool = True
) -> Artifact:
    """Open an artifact and check it is what the caller expects.

    Raises :class:`ArtifactError` naming the path when the directory is missing, has no or a
    corrupt manifest, an unknown schema, the wrong stage, or a payload file that is missing or
    whose sha256 differs from the manifest's.
    """
    path = Path(path)
    manifest = _read_manifest(path)
    if manifest.get("schema") != SCHEMA_VERSION:
        raise ArtifactError(
            f"{path}: unknown artifact schema {manifest.get('schema')!r} "
            f"(this synthq reads {SCHEMA_VERSION}; re-run the stage that wrote it)"
        )
    verified = check_seal(manifest, str(path / MANIFEST))
    if stage is not None:
        wanted = (stage,) if isinstance(stage, str) else tuple(stage)
        if manifest.get("stage") not in wanted:
            raise ArtifactError(
                f"{path}: is a {manifest.get('stage')!r} artifact, expected {' or '.join(map(repr, wanted))}"
            )
    if verify:
        listed = {**manifest.get("files", {}), **manifest.get("private_files", {})}
        for relative, expected in listed.items():
            file_path = path / relative
            if not file_path.is_file():
                raise ArtifactError(f"{file_path}: payload file listed in the manifest is missing")
            if sha256_file(file_path) != expected:
                raise ArtifactError(f"{file_path}: payload file was altered or truncated (sha256 mismatch)")
    check_privacy(manifest, path / MANIFEST)
    return Artifact(path=path, manifest=manifest, verified=verified)


def check_privacy(manifest: dict, where: Path) -> None:
    """A guarantee is recomputed, never read: every recorded release's ε must be what its
    mechanism parameters give, and the headline ``privacy`` (and ``own_privacy``) must be exactly
    what :func:`synthq.privacy.guarantee.compose_releases` gives for the recorded releases."""
    from synthq.runtime.errors import PrivacyError

    releases = manifest.get("releases", [])
    try:
        for release in releases:
            check_recorded_epsilon(Guarantee.from_manifest(release["guarantee"]), f"{where} (release)")
        sharing = manifest.get("privacy", {}).get("details", {}).get("sharing", [[r["id"] for r in releases]])
        covered = {key for group in sharing for key in group}
        if covered != {r["id"] for r in releases}:
            raise PrivacyError(f"{where}: the releases and the groups they are composed in disagree")
        expected = compose_releases(releases, sharing, manifest.get("assumptions", []))
        if json_safe(expected.model_dump(mode="json")) != manifest.get("privacy"):
            raise PrivacyError(
                f"{where}: the recorded guarantee is not what its releases give "
                f"({expected.describe()}); the manifest was edited or is corrupt"
            )
        own = [r for r in releases if r["id"] == manifest.get("own_release")]
        if manifest.get("own_privacy") != (own[0]["guarantee"] if own else None):
            raise PrivacyError(f"{where}: own_privacy is not the artifact's own release")
    except (PrivacyError, KeyError, TypeError, ValueError) as error:
        if isinstance(error, PrivacyError):
            raise ArtifactError(str(error)) from error
        raise ArtifactError(f"{where}: malformed privacy record ({type(error).__name__}: {error})") from error


def is_artifact(path: str | Path) -> bool:
    return (Path(path) / MANIFEST).is_file()


def partial_dir(out: Path) -> Path:
    out = Path(out)
    return out.parent / f".{out.name}{PARTIAL_SUFFIX}"


@dataclass
class ArtifactWriter:
    """Handed to a stage inside :func:`create_artifact`; the stage writes payload under ``dir``
    and fills ``privacy``, ``metrics`` and ``timings``."""

    path: Path
    dir: Path
    stage: str
    config: dict
    inputs: list[dict]
    fingerprint: str
    metrics: dict = field(default_factory=dict)
    timings: dict = field(default_factory=dict)
    extra: dict = field(default_factory=dict)
    # Statistics computed from private data without noise (losses, batch sizes, timings of
    # private batches): ε = ∞. Written to ``diagnostics/metrics.json``, listed apart from the
    # payload, shown as private by ``synthq info`` and left out by ``synthq export``.
    diagnostics: dict = field(default_factory=dict)
    # True for stages whose run time depends on private data (DP training: the Poisson batch
    # sizes): their timings are diagnostics too.
    timings_are_private: bool = False
    # Sub-directories of ``dir`` that hold resumable state and are removed before finishing.
    scratch: list[str] = field(default_factory=lambda: [CHECKPOINTS])
    # False on the ranks other than 0 of a torchrun job, whose writer is thrown away
    # (synthq.artifact_on_main): large saves may be skipped there.
    primary: bool = True
    # The privacy record (see the module's docstring of synthq.privacy.guarantee): every read of private
    # data behind this artifact, what it assumes, and whether the stage said where it stands.
    releases: list[dict] = field(default_factory=list)
    assumptions: list[str] = field(default_factory=list)
    own_release: dict | None = None
    accounted: bool = False

    def inherit(self, source: Artifact) -> None:
        """``source``'s content flows into this artifact (post-processing, a starting model, a
        dataset that is an artifact): its releases and assumptions come along."""
        known = {r["id"] for r in self.releases}
        self.releases += [r for r in source.releases if r["id"] not in known]
        self.assume(*source.privacy.assumptions)

    def assume(self, *assumptions: str | None) -> None:
        """Facts the guarantee relies on that synthq cannot check (printed beside every ε)."""
        self.assumptions = list(dict.fromkeys([*self.assumptions, *(a for a in assumptions if a)]))
        self.accounted = True

    def release(
        self,
        guarantee: Guarantee,
        data: dict,
        unit_ids: Sequence[str] = (),
        unit_kind: str = "query",
        units: dict | None = None,
    ) -> dict:
        """Record this artifact's own read of private data ``data`` (an input record): its
        guarantee (ε = ∞ for a read without DP) and the keyed set of the units it read
        (``unit_ids``, or ``units``: the record of a set another release already stored)."""
        from synthq.privacy.units import register_private_data, store_unit_set

        if units is None:
            units = store_unit_set(unit_kind, list(unit_ids), also_in=self.dir / DIAGNOSTICS)
        record = {
            "id": secrets.token_hex(16),
            "stage": self.stage,
            "path": str(self.path),
            "data": {key: data.get(key) for key in ("name", "sha256", "kind")},
            "unit": guarantee.unit,
            "units": units,
            "guarantee": json_safe(guarantee.model_dump(mode="json")),
        }
        register_private_data(record["data"])
        self.own_release = record
        self.releases.append(record)
        self.accounted = True
        return record

    def public(self) -> None:
        """Say that this artifact read no private data and inherits nothing (ε = 0)."""
        self.accounted = True

    @property
    def privacy(self) -> Guarantee:
        """The headline guarantee the recorded releases give (what the manifest will carry)."""
        from synthq.privacy.units import sharing_groups

        return compose_releases(self.releases, sharing_groups(self.releases), self.assumptions)

    @privacy.setter
    def privacy(self, guarantee: Guarantee) -> None:
        """Shorthand for stages outside synthq (and tests): a public guarantee states its
        assumptions; any other is recorded as this artifact's release of one unnamed private
        dataset with no unit set (so it composes with every other release, a bound)."""
        if guarantee.mechanism == "public":
            self.assume(*guarantee.assumptions)
            return
        data = {"name": "unnamed private data", "sha256": "hmac:unnamed", "kind": "data"}
        self.release(guarantee, data, units={})

    @property
    def checkpoint_dir(self) -> Path:
        path = self.dir / CHECKPOINTS
        path.mkdir(exist_ok=True)
        return path

    @property
    def diagnostics_dir(self) -> Path:
        """Where private diagnostic files go (ε = ∞; never part of a release)."""
        path = self.dir / DIAGNOSTICS
        path.mkdir(exist_ok=True)
        return path


def find_up_to_date(out: str | Path, stage: str, config: Any, inputs: list[dict]) -> Artifact | None:
    """The existing artifact at ``out`` if it was made by ``stage`` with the same config and
    inputs (and still verifies); otherwise ``None``."""
    out = Path(out)
    if not is_artifact(out):
        return None
    try:
        artifact = open_artifact(out, stage=stage)
    except ArtifactError:
        return None
    if artifact.manifest.get("fingerprint") == config_fingerprint(config, inputs):
        return artifact
    return None


def current_input_hash(record: dict) -> str | None:
    """The sha256 an input recorded in a manifest has *now* (None if it is gone)."""
    path = Path(record["path"])
    if record.get("kind") == "artifact":
        return sha256_file(path / MANIFEST) if (path / MANIFEST).is_file() else None
    if path.is_file():  # a single input file, e.g. a public corpus or document list
        return file_digest(path)
    if not path.is_dir():
        return None
    keyed = record.get("private") or str(record.get("sha256", "")).startswith("hmac:")
    return private_data_digest(sha256_tree(path)) if keyed else sha256_tree(path)


def is_still_up_to_date(out: str | Path, stage: str, config: Any) -> bool:
    """Whether ``out`` holds a ``stage`` artifact for ``config`` whose recorded inputs are
    unchanged on disk. Needs no knowledge of how the stage finds its inputs, so pipelines can
    plan (``--dry-run``) without running anything."""
    out = Path(out)
    if not is_artifact(out):
        return False
    try:
        artifact = open_artifact(out, stage=stage)
    except ArtifactError:
        return False
    inputs = []
    for record in artifact.inputs:
        now = current_input_hash(record)
        if now is None:
            return False
        inputs.append({**record, "sha256": now})
    return artifact.manifest.get("fingerprint") == config_fingerprint(config, inputs)


def _overlaps(out: Path, other: Path) -> bool:
    """Whether replacing ``out`` would delete or replace ``other`` (the same path or inside it)."""
    out, other = out.resolve(), Path(other).resolve()
    return other == out or out in other.parents


def check_output_free(out: str | Path, force: bool, inputs: Iterable[dict] = ()) -> None:
    """Refuse to write ``out`` where that would lose something.

    ``out`` may not be (or contain) an input of the same command, nor lie inside one (an
    artifact or dataset directory would change under its own manifest or digest), even with
    ``--force``; an existing directory is replaced only with ``--force`` and only when it is a
    synthq artifact (its manifest says so): a user's directory or dataset is never deleted."""
    out = Path(out)
    for record in inputs:
        if _overlaps(out, Path(record["path"])):
            raise ArtifactError(
                f"{out}: is an input of this command ({record['path']}); choose another --out"
            )
        inside = Path(record["path"]).resolve()
        if inside.is_dir() and inside in out.resolve().parents:
            raise ArtifactError(
                f"{out}: is inside an input of this command ({record['path']}); choose an --out outside it"
            )
    if not out.exists() and not out.is_symlink():
        return
    if not out.is_dir() or out.is_symlink():
        raise ArtifactError(f"{out}: exists and is not an artifact directory; choose another --out")
    if not _is_synthq_manifest(out):
        contents = (
            "an empty directory" if not any(out.iterdir()) else "a directory that is not a synthq artifact"
        )
        raise ArtifactError(
            f"{out}: is {contents}; synthq replaces only its own artifacts, choose another --out"
        )
    if not force:
        raise ArtifactError(
            f"{out}: already holds an artifact made with a different config or inputs; "
            "pass --force to replace it"
        )


def _is_synthq_manifest(path: Path) -> bool:
    try:
        manifest = json.loads((path / MANIFEST).read_text(encoding="utf-8"))
    except (OSError, ValueError):
        return False
    return (
        isinstance(manifest, dict)
        and manifest.get("schema") == SCHEMA_VERSION
        and manifest.get("stage") in STAGES
    )


def existing_result(stage: str, config: Any, inputs: list[dict]) -> Artifact | None:
    """What every stage calls first: the up-to-date artifact to reuse (unless ``config.force``),
    or ``None`` after checking that ``config.out`` may be written."""
    out = Path(config.out)
    if not getattr(config, "force", False):
        artifact = find_up_to_date(out, stage, config, inputs)
        if artifact is not None:
            from synthq.runtime.console import debug

            debug(f"up to date: {out} ({stage}); pass --force to redo it")
            return artifact
    check_output_free(out, force=getattr(config, "force", False), inputs=inputs)
    _SEEN[out.resolve()] = _manifest_state(out)
    return None


# What :func:`existing_result` saw at each output it let a stage write (the manifest's identity, or
# None), so that :func:`create_artifact` can tell when another process finished that output in
# between: the lock is taken only when the stage starts writing, after its inputs are read.
_SEEN: dict[Path, tuple[int, int] | None] = {}


def _manifest_state(out: Path) -> tuple[int, int] | None:
    try:
        status = os.stat(Path(out) / MANIFEST)
    except OSError:
        return None
    return (status.st_ino, status.st_mtime_ns)


def _refuse_if_finished_meanwhile(out: Path, stage: str, config: Any, inputs: list[dict]) -> None:
    """Under the output lock: refuse to redo an output that another process finished, up to date
    for this very config and inputs, since :func:`existing_result` looked (two runs of the same
    pipeline started together). Re-running then reuses it."""
    key = out.resolve()
    if key not in _SEEN or getattr(config, "force", False):
        return
    seen = _SEEN.pop(key)
    if _manifest_state(out) != seen and find_up_to_date(out, stage, config, inputs) is not None:
        raise ArtifactError(
            f"{out}: another process finished this artifact, up to date for the same config and "
            "inputs, while this one was starting; nothing was redone — rerun to use it"
        )


_WRITTEN: list[Path] = []  # artifacts finished by this process, in order


def writes_so_far() -> int:
    """A mark for :func:`written_here`: how many artifacts this process has finished."""
    return len(_WRITTEN)


def written_here(path: str | Path, since: int = 0) -> bool:
    """Whether this process finished the artifact at ``path`` after the mark ``since`` (rather
    than finding it up to date)."""
    return Path(path).resolve() in _WRITTEN[since:]


def lock_path(out: Path) -> Path:
    out = Path(out)
    return out.parent / f".{out.name}.lock"


@contextlib.contextmanager
def output_lock(out: str | Path) -> Iterator[None]:
    """An exclusive ``flock`` on ``.<name>.lock`` beside the output, held while a stage writes it.

    A second process on the same ``--out`` fails at once with an error naming the holder (pid
    and host, written into the lock file). The lock dies with its process (a SIGKILL frees it);
    the file is removed on release, and a taker re-checks it locked the file still in place."""
    import fcntl
    import socket

    path = lock_path(Path(out))
    while True:
        handle = open(path, "a+", encoding="utf-8")  # noqa: SIM115 (held until the finally below)
        try:
            fcntl.flock(handle, fcntl.LOCK_EX | fcntl.LOCK_NB)
        except BlockingIOError:
            handle.seek(0)
            holder = handle.read().strip() or "another process"
            handle.close()
            raise ArtifactError(
                f"{out}: is being written by {holder}; wait for it to finish or choose another --out"
            ) from None
        try:
            same = os.fstat(handle.fileno()).st_ino == os.stat(path).st_ino
        except FileNotFoundError:
            same = False
        if same:
            break
        handle.close()  # the holder released and removed the file between our open and lock
    try:
        handle.truncate(0)
        handle.write(f"synthq pid {os.getpid()} on {socket.gethostname()}\n")
        handle.flush()
        yield
    finally:
        with contextlib.suppress(OSError):
            os.unlink(path)
        handle.close()


@contextlib.contextmanager
def create_artifact(
    out: str | Path,
    stage: str,
    config: Any,
    inputs: Iterable[dict] = (),
    resume: bool = False,
    keep_partial_on_error: bool = False,
) -> Iterator[ArtifactWriter]:
    """Create an artifact atomically.

    The stage writes into ``writer.dir`` (a hidden sibling ``.<name>.partial``). On success the
    manifest is written and the directory renamed to ``out``, replacing any old artifact. On
    any exception, Ctrl-C included, the partial directory is deleted, unless
    ``keep_partial_on_error`` (stages that checkpoint) keeps it for ``--resume``. With
    ``resume`` an existing partial directory is reused instead of wiped.

    ``out`` is locked against other processes for the whole write (:func:`output_lock`), and
    is refused if it is an input or a directory that is not a synthq artifact
    (:func:`check_output_free`): only artifacts are ever replaced.
    """
    if stage not in STAGES:
        raise ArtifactError(f"unknown stage {stage!r}")
    out = Path(out)
    inputs = list(inputs)
    check_output_free(out, force=True, inputs=inputs)
    out.parent.mkdir(parents=True, exist_ok=True)
    with output_lock(out):
        _refuse_if_finished_meanwhile(out, stage, config, inputs)
        tmp = partial_dir(out)
        if tmp.exists() and not resume:
            shutil.rmtree(tmp)
        elif tmp.exists():
            _keep_only_checkpoints(tmp)
        tmp.mkdir(exist_ok=True)
        config_dict = config_to_dict(config)
        writer = ArtifactWriter(
            path=out,
            dir=tmp,
            stage=stage,
            config=config_dict,
            inputs=inputs,
            fingerprint=config_fingerprint(config, inputs),
        )
        started = time.perf_counter()
        _WRITING.append(out)
        try:
            yield writer
            if not writer.accounted and not writer.releases:
                raise ArtifactError(f"stage {stage} finished without recording a privacy guarantee")
            writer.timings.setdefault("wall_seconds", round(time.perf_counter() - started, 3))
            if writer.timings_are_private:
                writer.diagnostics["timings"] = writer.timings
                writer.timings = {}
            check_output_free(out, force=True, inputs=inputs)  # nothing else appeared meanwhile
            _finish(writer)
            _WRITTEN.append(out.resolve())
        except BaseException:
            _FAILED.append(out)
            if tmp.exists() and not keep_partial_on_error:
                shutil.rmtree(tmp, ignore_errors=True)
            raise
        finally:
            _WRITING.remove(out)


_WRITING: list[Path] = []  # outputs this process is writing now, innermost last
_FAILED: list[Path] = []  # outputs whose write failed, last last


def output_in_trouble() -> Path | None:
    """The artifact this process is writing (innermost) or, once the error has left it, the one
    whose write failed last: for errors that carry no file name (a full disk reported by a
    library) and are reported after the stage has unwound."""
    return _WRITING[-1] if _WRITING else (_FAILED[-1] if _FAILED else None)


def _keep_only_checkpoints(partial: Path) -> None:
    """Before a resume: the interrupted run's checkpoints are all it continues from (each written
    whole, by rename); payload it had begun to write (a model cut off by a full disk) is rewritten
    from them, so none of it can reach the finished artifact."""
    for entry in partial.iterdir():
        if entry.name == CHECKPOINTS:
            continue
        if entry.is_dir() and not entry.is_symlink():
            shutil.rmtree(entry)
        else:
            entry.unlink()


def _finish(writer: ArtifactWriter) -> None:
    from synthq.artifacts.model_card import write_model_card
    from synthq.privacy.units import sharing_groups

    for name in writer.scratch:
        shutil.rmtree(writer.dir / name, ignore_errors=True)
    if writer.diagnostics:
        (writer.diagnostics_dir / "metrics.json").write_text(
            json.dumps(json_safe(writer.diagnostics), indent=2, default=_json_default) + "\n",
            encoding="utf-8",
        )
    manifest = {
        "schema": SCHEMA_VERSION,
        "stage": writer.stage,
        "synthq": __version__,
        "created": _dt.datetime.now(_dt.timezone.utc).isoformat(timespec="seconds"),
        "fingerprint": writer.fingerprint,
        "config": writer.config,
        "inputs": writer.inputs,
        "files": {},
        "privacy": compose_releases(
            writer.releases, sharing_groups(writer.releases), writer.assumptions
        ).model_dump(mode="json"),
        "releases": writer.releases,
        "assumptions": writer.assumptions,
        **(
            {"own_release": writer.own_release["id"], "own_privacy": writer.own_release["guarantee"]}
            if writer.own_release
            else {}
        ),
        "metrics": writer.metrics,
        "timings": writer.timings,
        "environment": environment(),
        **writer.extra,
    }
    write_model_card(writer.dir, manifest)
    hashes = {
        p.relative_to(writer.dir).as_posix(): sha256_file(p)
        for p in sorted(writer.dir.rglob("*"))
        if p.is_file() and p.name != MANIFEST
    }
    private = {k: v for k, v in hashes.items() if k.startswith(DIAGNOSTICS + "/")}
    manifest["files"] = {k: v for k, v in hashes.items() if k not in private}
    if private:
        manifest["private_files"] = private
        manifest["private_files_note"] = DIAGNOSTICS_NOTE
    write_manifest(writer.dir, manifest)
    old = None
    if writer.path.exists():
        old = writer.path.parent / f".{writer.path.name}.old"
        if old.exists():
            shutil.rmtree(old)
        os.replace(writer.path, old)
    os.replace(writer.dir, writer.path)
    if old is not None:
        shutil.rmtree(old, ignore_errors=True)


def write_manifest(directory: Path, manifest: dict) -> None:
    """Write ``manifest.json`` atomically, sealed with the owner's key (:func:`synthq.privacy.keys.seal`)
    over exactly what reads back from the file."""
    text = json.dumps(json_safe(manifest), default=_json_default, allow_nan=False)
    sealed = json.loads(text)
    sealed.pop("seal", None)
    sealed["seal"] = seal(sealed)
    manifest_tmp = directory / (MANIFEST + ".tmp")
    manifest_tmp.write_text(json.dumps(sealed, indent=2, ensure_ascii=False) + "\n", encoding="utf-8")
    os.replace(manifest_tmp, directory / MANIFEST)


def export_artifact(path: str | Path, out: str | Path) -> tuple[Artifact, list[str]]:
    """A release copy of an artifact: exactly the payload files its manifest lists (and
    verifies), and the manifest without the private ``diagnostics/`` part
    (:attr:`ArtifactWriter.diagnostics`). Returns the copy and the files left out (private
    diagnostics and anything else in the directory that the manifest does not list).

    Written atomically like every artifact, re-sealed with this installation's key; the copy
    records which artifact it came from. An artifact sealed under another key is refused: this
    installation cannot vouch for its guarantee."""
    source = open_artifact(path)
    if not source.verified:
        raise ArtifactError(f"{source.path}: {source.unverified_assumption}; export it where it was made")
    out = Path(out)
    if out.exists():
        raise ArtifactError(f"{out}: already exists; choose a new directory for the release")
    listed = source.manifest.get("files", {})
    present = sorted(p.relative_to(source.path).as_posix() for p in source.path.rglob("*") if p.is_file())
    left_out = [rel for rel in present if rel not in listed and rel != MANIFEST]
    tmp = partial_dir(out)
    shutil.rmtree(tmp, ignore_errors=True)
    try:
        for relative in listed:
            target = tmp / relative
            target.parent.mkdir(parents=True, exist_ok=True)
            shutil.copy2(source.path / relative, target)
        manifest = {
            k: v
            for k, v in source.manifest.items()
            if k not in ("private_files", "private_files_note", "seal")
        }
        manifest["exported_from"] = source.manifest_hash
        write_manifest(tmp, manifest)
        os.replace(tmp, out)
    except BaseException:
        shutil.rmtree(tmp, ignore_errors=True)
        raise
    return open_artifact(out), left_out


@contextlib.contextmanager
def artifact_on_main(out, stage: str, config: Any, inputs: Sequence[dict] = (), **options) -> Iterator:
    """:func:`create_artifact` on rank 0; a throwaway writer elsewhere.

    Every rank runs the same stage code inside the block; only rank 0's output becomes the
    artifact (``writer.primary`` tells a stage whether a large save is worth doing). The world
    size is recorded in the manifest. All ranks wait for rank 0 to finish the artifact before
    leaving, so a caller can open it next.
    """
    place = distributed.topology()
    if place.is_main:
        with create_artifact(out, stage, config, inputs, **options) as writer:
            writer.extra["distributed"] = place.describe()
            yield writer
    else:
        scratch = Path(tempfile.mkdtemp(prefix=f"synthq-rank{place.rank}-"))
        try:
            yield ArtifactWriter(
                path=Path(out),
                dir=scratch,
                stage=stage,
                config={},
                inputs=list(inputs),
                fingerprint=config_fingerprint(config, list(inputs)),
                primary=False,
            )
        finally:
            shutil.rmtree(scratch, ignore_errors=True)
    distributed.barrier()

"""Freshness: whether an existing artifact is up to date, may be resumed, or must be (re)written.

What decides whether an artifact is up to date is its fingerprint: the config (minus volatile
keys) and the manifest hashes of its inputs. :func:`existing_result`, what every stage calls
first, reuses an up-to-date artifact (:func:`find_up_to_date`) so the stage can skip;
:func:`is_still_up_to_date` lets a pipeline plan (``--dry-run``) without running anything;
:func:`check_resumable` refuses to resume a checkpoint written with other settings or inputs.
"""

from __future__ import annotations

import hashlib
import json
import os
from pathlib import Path
from typing import Any

from synthq.artifacts.locking import being_written, check_output_free, lock_holder
from synthq.artifacts.manifest import MANIFEST, Artifact, is_artifact, open_artifact, partial_dir
from synthq.artifacts.process_state import may_replace, this_process
from synthq.artifacts.records import current_input_hash
from synthq.runtime.errors import ArtifactError
from synthq.runtime.hashing import config_to_dict, json_default
from synthq.runtime.paths import recorded_location, recorded_path

# Fields that never change what a stage computes, so they are left out of its fingerprint.
VOLATILE_CONFIG_KEYS = frozenset({"out", "force", "resume"})

# Fields added to a stage after artifacts were written without them, each with the value that
# does what a config without the field did. At that value the field is left out of fingerprints
# and recipes, so upgrading synthq does not make every existing artifact out of date; any other
# value is part of them. A field whose default changes what the stage computes does not belong
# here.
# ``precision: auto`` is fp32 on a CPU, where every earlier artifact was written; on a GPU it is
# bf16, which is recorded in the manifest's environment (like ``device: auto``).
ADDED_FIELD_DEFAULTS = {
    "user_clipping": "per-example",
    "hard_negatives": 0,
    "precision": "auto",
    "corpus": None,
    "lora_targets": "all-linear",
    "query_only": False,
}


def without_added_defaults(config: dict) -> dict:
    """``config`` without the fields of :data:`ADDED_FIELD_DEFAULTS` that hold their old-behaviour
    value: what two configs are compared on (fingerprints, resumes, replicate recipes)."""
    return {
        k: v for k, v in config.items() if not (k in ADDED_FIELD_DEFAULTS and v == ADDED_FIELD_DEFAULTS[k])
    }


def input_location(artifact: Artifact, record: dict) -> Path:
    """Where an input that ``artifact`` recorded is now, from any working directory (absolute as
    recorded; an older relative record against the directory its command ran in, see
    :func:`synthq.runtime.paths.recorded_location`)."""
    return recorded_location(record["path"], artifact.path, artifact.config.get("out"))


# A fingerprint of the current scheme starts with this tag; one without it is of the first scheme
# (input hashes sorted without their role), which artifacts written before still carry.
FINGERPRINT_TAG = "r2:"


def config_fingerprint(config: Any, inputs: list[dict]) -> str:
    """What decides whether an existing artifact is up to date: the config (minus volatile keys)
    and the manifest hashes of the inputs, each with its role (``data``, ``model``, …; the record's
    kind where it states no role), in the order the stage read them within a role. So two inputs
    that trade contents (the generator and the data, or two retrievers of one eval) make another
    fingerprint."""
    payload = {"config": _relevant(config), "inputs": _inputs_by_role(inputs)}
    return FINGERPRINT_TAG + _digest(payload)


def legacy_fingerprint(config: Any, inputs: list[dict]) -> str:
    """The first scheme: the input hashes sorted without their role."""
    return _digest({"config": _relevant(config), "inputs": sorted(i["sha256"] for i in inputs)})


def fingerprint_matches(recorded: str | None, config: Any, inputs: list[dict]) -> bool:
    """Whether a recorded fingerprint is that of ``config`` on ``inputs``, by the scheme it was
    written in (so artifacts written before role-keyed fingerprints stay up to date)."""
    if not recorded:
        return False
    if recorded.startswith(FINGERPRINT_TAG):
        return recorded == config_fingerprint(config, inputs)
    return recorded == legacy_fingerprint(config, inputs)


def _relevant(config: Any) -> dict:
    config = without_added_defaults(config_to_dict(config))
    return {k: v for k, v in config.items() if k not in VOLATILE_CONFIG_KEYS}


# Inputs a fingerprint leaves out: finetune-lm's held-out read (a public split of the dataset whose
# keyed digest is already an input) came after artifacts were made without it, which stay up to date.
UNFINGERPRINTED_ROLES = frozenset({"held-out loss"})


def _inputs_by_role(inputs: list[dict]) -> list[list[str]]:
    inputs = [i for i in inputs if i.get("role") not in UNFINGERPRINTED_ROLES]
    keyed = [[str(i.get("role") or i.get("kind") or ""), i["sha256"]] for i in inputs]
    return sorted(keyed, key=lambda pair: pair[0])  # stable: the read order within a role stays


def _digest(payload: dict) -> str:
    return hashlib.sha256(json.dumps(payload, sort_keys=True, default=json_default).encode()).hexdigest()


def check_resumable(path: Path, state: dict, config: Any, inputs: list[dict]) -> None:
    """Refuse to resume from the private checkpoint ``state`` (its ``config`` and ``inputs`` as
    JSON) when it was written with other settings or on inputs whose content has changed since:
    the accounting of the work already done was for the data it read."""
    saved_inputs = {  # by resolved path: a resume from another directory names the same inputs
        (r.get("role") or r.get("kind"), recorded_path(r["path"])): r["sha256"]
        for r in json.loads(state.get("inputs", "[]"))
    }
    for record in inputs:
        if record.get("role") in UNFINGERPRINTED_ROLES:
            continue
        key = (record.get("role") or record.get("kind"), recorded_path(record["path"]))
        if saved_inputs.get(key) != record["sha256"]:
            raise ArtifactError(
                f"{path}: cannot resume, the input {record['path']} changed since the interrupted run "
                "read it; rerun with --force instead of --resume to start over on the new data"
            )
    saved = without_added_defaults(json.loads(state["config"]))
    now = without_added_defaults(config_to_dict(config))
    volatile = {"out", "force", "resume", "device"}
    changed = sorted(k for k in set(saved) | set(now) if k not in volatile and saved.get(k) != now.get(k))
    if changed:
        raise ArtifactError(
            f"{path}: cannot resume, the interrupted run used other settings ({', '.join(changed)}); "
            "rerun with those settings, or with --force instead of --resume to start over"
        )


def _verified_artifact(out: str | Path, stage: str) -> Artifact | None:
    """The ``stage`` artifact at ``out`` if there is one and it verifies, its seal this
    installation's (an edited copy of one of its own artifacts opens as foreign: never reused);
    otherwise ``None``."""
    if not is_artifact(out):
        return None
    try:
        artifact = open_artifact(Path(out), stage=stage)
    except ArtifactError:
        return None
    return artifact if artifact.verified else None


def find_up_to_date(out: str | Path, stage: str, config: Any, inputs: list[dict]) -> Artifact | None:
    """The existing artifact at ``out`` if it was made by ``stage`` with the same config and
    inputs (and still verifies); otherwise ``None``."""
    artifact = _verified_artifact(out, stage)
    if artifact is not None and fingerprint_matches(artifact.manifest.get("fingerprint"), config, inputs):
        return artifact
    return None


def is_still_up_to_date(out: str | Path, stage: str, config: Any) -> bool | None:
    """Whether ``out`` holds a ``stage`` artifact for ``config`` whose recorded inputs are
    unchanged on disk. Needs no knowledge of how the stage finds its inputs, so pipelines can
    plan (``--dry-run``) without running anything. ``None`` when that cannot be told from the
    records: an input is no longer where the artifact recorded it (a checkout or dataset that
    moved); the stage itself then finds its inputs and reuses the artifact if their content is
    unchanged (:func:`existing_result`)."""
    artifact = _verified_artifact(out, stage)
    if artifact is None:
        return False
    inputs = []
    for record in artifact.inputs:
        now = current_input_hash({**record, "path": str(input_location(artifact, record))})
        if now is None:
            return None
        inputs.append({**record, "sha256": now})
    return fingerprint_matches(artifact.manifest.get("fingerprint"), config, inputs)


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
    holder = lock_holder(out)
    if holder is not None:  # its checkpoint is a live run's, not an interrupted one's
        raise being_written(out, holder)
    check_output_free(out, force=may_replace(out, getattr(config, "force", False)), inputs=inputs)
    _refuse_to_discard_silently(out, config)
    this_process.seen[out.resolve()] = _manifest_state(out)
    return None


def interrupted_checkpoint(out: str | Path) -> Path | None:
    """The checkpoints an interrupted run (Ctrl-C, SIGTERM, kill -9, a crash) left for ``out``,
    if any: what ``--resume`` continues from."""
    from synthq.artifacts.writer import CHECKPOINTS

    checkpoints = partial_dir(Path(out)) / CHECKPOINTS
    if not checkpoints.is_dir():
        return None
    whole = [p for p in checkpoints.iterdir() if not p.name.endswith(".tmp")]  # .tmp: cut off mid-write
    return checkpoints if whole else None


def _refuse_to_discard_silently(out: Path, config: Any) -> None:
    """A run without ``--resume`` would start from step 0 and delete an interrupted run's
    checkpoint: only with ``--force`` (said in one line); otherwise ask which is meant."""
    if getattr(config, "resume", False) or "resume" not in type(config).model_fields:
        return
    checkpoints = interrupted_checkpoint(out)
    if checkpoints is None:
        return
    if getattr(config, "force", False):
        from synthq.runtime.console import info

        info(f"{out}: discarding the interrupted run's checkpoint in {checkpoints.parent} (--force)")
        return
    raise ArtifactError(
        f"{out}: an interrupted run left a checkpoint in {checkpoints.parent}; rerun with --resume to "
        "continue it, or with --force to discard it and start over"
    )


def _manifest_state(out: Path) -> tuple[int, int] | None:
    try:
        status = os.stat(Path(out) / MANIFEST)
    except OSError:
        return None
    return (status.st_ino, status.st_mtime_ns)


def refuse_if_finished_meanwhile(out: Path, stage: str, config: Any, inputs: list[dict]) -> None:
    """Under the output lock: refuse to redo an output that another process finished, up to date
    for this very config and inputs, since :func:`existing_result` looked (two runs of the same
    pipeline started together). Re-running then reuses it."""
    key = out.resolve()
    if key not in this_process.seen or getattr(config, "force", False):
        return
    seen = this_process.seen.pop(key)
    if _manifest_state(out) != seen and find_up_to_date(out, stage, config, inputs) is not None:
        raise ArtifactError(
            f"{out}: another process finished this artifact, up to date for the same config and "
            "inputs, while this one was starting; nothing was redone — rerun to use it"
        )

"""Creating an artifact atomically: write into a hidden partial directory, finish, rename into place.

:func:`create_artifact` hands the stage an :class:`~synthq.artifacts.writer.ArtifactWriter` on a
hidden sibling ``.<name>.partial``, under the output lock, and renames it into place only when the
stage succeeded; on any failure the partial directory is deleted, or kept for ``--resume``.
Finishing writes the private diagnostics, the model card, the payload hashes (diagnostics by keyed
digests, :func:`synthq.privacy.digests.artifact_digest`) and the sealed manifest, whose guarantee
is composed from the recorded releases.
"""

from __future__ import annotations

import contextlib
import json
import os
import platform
import shutil
import time
from collections.abc import Iterable, Iterator
from pathlib import Path
from typing import Any

from synthq._version import __version__
from synthq.artifacts.freshness import (
    config_fingerprint,
    interrupted_checkpoint,
    refuse_if_finished_meanwhile,
)
from synthq.artifacts.locking import check_output_free, output_lock
from synthq.artifacts.manifest import MANIFEST, SCHEMA_VERSION, STAGES, partial_dir, write_manifest
from synthq.artifacts.process_state import this_process
from synthq.artifacts.writer import CHECKPOINTS, DIAGNOSTICS, ArtifactWriter
from synthq.privacy.digests import artifact_digest
from synthq.privacy.guarantee import compose_releases
from synthq.runtime.errors import ArtifactError
from synthq.runtime.hashing import config_to_dict, json_default, json_safe

DIAGNOSTICS_NOTE = (
    "computed from the private data without noise (ε = ∞): for the data owner only; "
    "`synthq export` leaves it out of a release"
)


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

    ``out`` is locked against other processes for the whole write
    (:func:`~synthq.artifacts.locking.output_lock`), and is refused if it is an input or a
    directory that is not a synthq artifact (:func:`~synthq.artifacts.locking.check_output_free`):
    only artifacts are ever replaced.
    """
    if stage not in STAGES:
        raise ArtifactError(f"unknown stage {stage!r}")
    out = Path(out)
    inputs = list(inputs)
    check_output_free(out, force=True, inputs=inputs)
    out.parent.mkdir(parents=True, exist_ok=True)
    with output_lock(out):
        refuse_if_finished_meanwhile(out, stage, config, inputs)
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
        this_process.writing.append(out)
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
            this_process.written.append(out.resolve())
        except BaseException:
            this_process.failed.append(out)
            # kept only when it holds a checkpoint --resume continues from; anything else in it
            # (payload cut off by a full disk) is rewritten by any rerun, so it only holds space
            if tmp.exists() and not (keep_partial_on_error and interrupted_checkpoint(out) is not None):
                shutil.rmtree(tmp, ignore_errors=True)
            raise
        finally:
            this_process.writing.remove(out)


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


def _public_reads(writer: ArtifactWriter) -> list[dict]:
    """The artifact's own reads of public splits (its inputs of that kind) and those it inherited."""
    from synthq.artifacts.writer import unique_public_reads
    from synthq.privacy.digests import PUBLIC_SPLIT

    own = [record for record in writer.inputs if record.get("kind") == PUBLIC_SPLIT]
    return unique_public_reads([*own, *writer.public_reads])


def _finish(writer: ArtifactWriter) -> None:
    from synthq.artifacts.model_card import write_model_card
    from synthq.privacy.unit_sets import sharing_groups

    for name in writer.scratch:
        shutil.rmtree(writer.dir / name, ignore_errors=True)
    if writer.diagnostics:
        (writer.diagnostics_dir / "metrics.json").write_text(
            json.dumps(json_safe(writer.diagnostics), indent=2, default=json_default) + "\n",
            encoding="utf-8",
        )
    manifest = {
        "schema": SCHEMA_VERSION,
        "stage": writer.stage,
        "synthq": __version__,
        "fingerprint": writer.fingerprint,
        "config": writer.config,
        "inputs": writer.inputs,
        "files": {},
        "privacy": compose_releases(
            writer.releases, sharing_groups(writer.releases), writer.all_assumptions
        ).model_dump(mode="json"),
        "releases": writer.releases,
        "assumptions": writer.all_assumptions,
        **(
            {"own_release": writer.own_release["id"], "own_privacy": writer.own_release["guarantee"]}
            if writer.own_release
            else {}
        ),
        **({"public_reads": public_reads} if (public_reads := _public_reads(writer)) else {}),
        "metrics": writer.metrics,
        "timings": writer.timings,
        "environment": environment(),
        **writer.extra,
    }
    write_model_card(writer.dir, manifest)
    # Payload files are released: their plain sha256 tells nothing new. Diagnostics are private
    # (ε = ∞): listed by keyed digests only (a plain sha256 of un-noised dev scores would let anyone
    # test a hypothesised dev set against it), which the owner still verifies on open.
    files = [p for p in sorted(writer.dir.rglob("*")) if p.is_file() and p.name != MANIFEST]
    hashes = {
        p.relative_to(writer.dir).as_posix(): artifact_digest(
            p, private=p.relative_to(writer.dir).parts[0] == DIAGNOSTICS
        )
        for p in files
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
        from synthq.runtime.precision import current

        if current() is not None:  # the precision the stage's forward passes ran at
            env["precision"] = current()
    except Exception:
        env["device"] = "unknown"
    return env

"""Export: a release copy of an artifact, without its private diagnostics, re-sealed.

The copy holds exactly the payload files the manifest lists (and verifies); the private
``diagnostics/`` part (ε = ∞) and anything the manifest does not list are left out; the owner's
absolute paths are shown by their last component (:func:`_without_local_paths`). Every file and
folder of the copy carries one fixed time (:data:`RELEASE_FILE_TIME`): the times at which a run
wrote its files measure its private work (a DP stage's wall time grows with the pairs it sampled,
an un-noised count), and a copy that kept them would publish that. A manifest holds no time
either (:func:`synthq.artifacts.create._finish`).
"""

from __future__ import annotations

import errno
import os
import re
import shutil
from pathlib import Path

from synthq.artifacts.locking import artifact_holding
from synthq.artifacts.manifest import MANIFEST, Artifact, open_artifact, partial_dir, write_manifest
from synthq.privacy.digests import artifact_digest
from synthq.runtime.errors import ArtifactError

# 1980-01-01T00:00:00Z, the earliest time a ZIP archive can hold (reproducible builds use it too)
RELEASE_FILE_TIME = 315532800


def _fix_file_times(root: Path) -> None:
    """Give every file and folder under ``root`` (and ``root``) :data:`RELEASE_FILE_TIME`."""
    for path in sorted(root.rglob("*"), key=lambda p: len(p.parts), reverse=True):
        os.utime(path, (RELEASE_FILE_TIME, RELEASE_FILE_TIME), follow_symlinks=False)
    os.utime(root, (RELEASE_FILE_TIME, RELEASE_FILE_TIME))


# Payload files that are text for people or tables of runs (never data, tokenizers or configs a
# library reads): where the owner's paths are rewritten
REWRITTEN_FILES = ("README.md", "results.md", "selection.md", "audit.md", "results.json")
LARGEST_REWRITTEN = 64 << 20


def _local_paths(value, found: dict[str, str]) -> dict[str, str]:
    """Every absolute path a manifest holds as a value (inputs', releases' and config's) -> its
    last component, the name the release shows instead."""
    if isinstance(value, dict):
        for item in value.values():
            _local_paths(item, found)
    elif isinstance(value, list):
        for item in value:
            _local_paths(item, found)
    elif isinstance(value, str) and value.startswith("/") and not any(c.isspace() for c in value):
        path = Path(value)
        if path.is_absolute() and path.name:
            found[value] = path.name
    return found


def _without_local_paths(manifest: dict, copy: Path) -> dict:
    """The release names where the owner's files were by their last component only: an absolute
    path carries the owner's user name and directory layout, which a release has no need of.
    Rewritten in the manifest (every value that is an absolute path, and those paths inside its
    notes) and in the copy's text for people and tables of runs (:data:`REWRITTEN_FILES`), whose
    digests the manifest then lists anew; data, tokenizers and model configs are copied as they
    are. A path is replaced only whole (at a path boundary); the owner's artifact keeps its paths
    (resume and freshness need them)."""
    pairs = sorted(_local_paths(manifest, {}).items(), key=lambda item: -len(item[0]))
    if not pairs:
        return manifest
    pattern = re.compile("|".join(f"(?<![\\w./-]){re.escape(old)}(?=$|[^\\w.-])" for old, _ in pairs))
    names = dict(pairs)

    def rewrite(text: str) -> str:
        return pattern.sub(lambda match: names[match.group(0)], text)

    files = dict(manifest.get("files", {}))
    for relative in files:
        target = copy / relative
        if Path(relative).name not in REWRITTEN_FILES or target.stat().st_size > LARGEST_REWRITTEN:
            continue
        text = target.read_text(encoding="utf-8")
        changed = rewrite(text)
        if changed != text:
            target.write_text(changed, encoding="utf-8")
            files[relative] = artifact_digest(target, private=False)

    def clean(value):
        if isinstance(value, dict):
            return {key: clean(item) for key, item in value.items()}
        if isinstance(value, list):
            return [clean(item) for item in value]
        return rewrite(value) if isinstance(value, str) else value

    return clean({**manifest, "files": files})


_WRITE_SIDE = (errno.ENOSPC, errno.EDQUOT, errno.EROFS)


def _copy_into_release(source: Path, target: Path, out: Path) -> None:
    """Copy the content (no times, no modes); a disk that fills names the release being written,
    not the file read (``shutil`` reports the source as the error's file name)."""
    try:
        shutil.copyfile(source, target)
    except OSError as error:
        if error.errno in _WRITE_SIDE:
            raise OSError(error.errno, error.strerror or os.strerror(error.errno), str(out)) from error
        raise


def export_artifact(path: str | Path, out: str | Path) -> tuple[Artifact, list[str]]:
    """A release copy of an artifact: exactly the payload files its manifest lists (and
    verifies), and the manifest without the private ``diagnostics/`` part
    (:attr:`~synthq.artifacts.writer.ArtifactWriter.diagnostics`). Returns the copy and the files
    left out (private diagnostics and anything else in the directory that the manifest does not
    list).

    Written atomically like every artifact, re-sealed with this installation's key; the copy
    records which artifact it came from. An artifact sealed under another key is refused: this
    installation cannot vouch for its guarantee."""
    source = open_artifact(path)
    if not source.verified:
        raise ArtifactError(f"{source.path}: {source.unverified_reason}; export it where it was made")
    out = Path(out)
    if out.exists():
        raise ArtifactError(f"{out}: already exists; choose a new directory for the release")
    holder = artifact_holding(out)
    if holder is not None:
        raise ArtifactError(
            f"{out}: is inside the artifact {holder}; a --force of its stage would delete the release, "
            "write it outside"
        )
    listed = source.manifest.get("files", {})
    present = sorted(p.relative_to(source.path).as_posix() for p in source.path.rglob("*") if p.is_file())
    left_out = [rel for rel in present if rel not in listed and rel != MANIFEST]
    tmp = partial_dir(out)
    shutil.rmtree(tmp, ignore_errors=True)
    try:
        for relative in listed:
            target = tmp / relative
            target.parent.mkdir(parents=True, exist_ok=True)
            _copy_into_release(source.path / relative, target, out)
        manifest = {
            k: v
            for k, v in source.manifest.items()
            if k not in ("private_files", "private_files_note", "seal")
        }
        manifest["exported_from"] = source.manifest_hash
        manifest = _without_local_paths(manifest, tmp)
        write_manifest(tmp, manifest)
        _fix_file_times(tmp)
        os.replace(tmp, out)
    except BaseException:
        shutil.rmtree(tmp, ignore_errors=True)
        raise
    return open_artifact(out), left_out

"""The manifest: what a finished artifact is, opening it with verification, and writing it sealed.

Every stage writes exactly one directory holding ``manifest.json``. :func:`open_artifact` checks
its schema, stage and every payload hash, and recomputes the privacy guarantee from the releases
it records (:func:`check_privacy`): a guarantee is never read, only recomputed.
:func:`write_manifest` writes a manifest atomically, sealed with the owner's key.
"""

from __future__ import annotations

import json
import os
from collections.abc import Iterable
from dataclasses import dataclass
from pathlib import Path

from synthq.config.registry import STAGES as STAGE_REGISTRY
from synthq.privacy.accounting import check_recorded_epsilon
from synthq.privacy.digests import is_keyed
from synthq.privacy.guarantee import Guarantee, compose_all, compose_releases
from synthq.privacy.keys import check_seal, key_id, private_data_digest, seal
from synthq.runtime.errors import ArtifactError
from synthq.runtime.hashing import json_default, json_safe, sha256_file
from synthq.runtime.paths import recorded_path

# 2: guarantees recomputed from recorded releases, keyed private-data digests, sealed manifests.
SCHEMA_VERSION = 2
MANIFEST = "manifest.json"
STAGES = tuple(STAGE_REGISTRY)  # the stage names, from the one registry of stages
PARTIAL_SUFFIX = ".partial"


def partial_dir(out: Path) -> Path:
    """Where an artifact is written until it is finished: a hidden sibling ``.<name>.partial``."""
    out = Path(out)
    return out.parent / f".{out.name}{PARTIAL_SUFFIX}"


@dataclass
class Artifact:
    """A verified, finished artifact directory.

    ``verified`` is False for a manifest sealed under another installation's key: its guarantee
    is still recomputed from what it records, but an edit cannot be ruled out, and
    :attr:`privacy` says so among its assumptions."""

    path: Path
    manifest: dict
    verified: bool = True

    def __fspath__(self) -> str:
        """An artifact goes wherever a path does (``train_retriever(data=syn)``, ``Path(syn)``)."""
        return os.fspath(self.path)

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
    def unverified_reason(self) -> str:
        """What is known about a foreign seal, and only that: whether the manifest was edited is
        not known either way."""
        stamp = self.manifest.get("seal", {})
        return (
            f"sealed under another key (id {stamp.get('key_id')}; this installation's is {key_id()}): "
            "synthq cannot check whether it was edited"
        )

    @property
    def unverified_assumption(self) -> str:
        """The assumption an unverifiable manifest adds to its guarantee, worded as an assumption."""
        return f"the manifest of {self.path} is unedited ({self.unverified_reason})"

    @property
    def releases(self) -> list[dict]:
        """Every read of private data behind this artifact, as recorded when it was written."""
        return self.manifest.get("releases", [])

    @property
    def public_reads(self) -> list[dict]:
        """Every read of a split as public behind this artifact (its own and its inputs', carried
        as releases are, :meth:`ArtifactWriter.inherit`): what makes a retracted declaration
        noticed even when the artifact that read it is gone."""
        records = self.manifest.get("public_reads", [])
        well_formed = isinstance(records, list) and all(
            isinstance(r, dict) and isinstance(r.get("path"), str) and isinstance(r.get("split"), str)
            for r in records
        )
        if not well_formed:
            raise ArtifactError(f"{self.path}: public_reads is not a list of reads (path, split): edited")
        return records

    def vouched_releases(self) -> list[dict]:
        """What composes into an artifact this installation seals or publishes: its own records
        where this installation sealed it; where the seal is foreign and it records reads of
        private data, one stand-in for all of them (:meth:`foreign_stand_in`). A foreign
        manifest's records, unit sets and labels are fields its editor controls: its release ids
        could replace real ones, its unit sets make its releases look disjoint from others."""
        if self.verified or not self.releases:
            return self.releases
        return [self.foreign_stand_in()]

    def foreign_stand_in(self) -> dict:
        """The release record standing for every read of private data a foreign manifest records:
        their guarantees composed as if all read the same data (:func:`compose_all`, the parts
        kept so that any installation recomputes the sum), under the assumption that the manifest
        is unedited; no unit set (it composes with every other release, never beside it) and an id
        of its own (it can never replace, or be replaced by, a release recorded here)."""
        parts = [Guarantee.from_manifest(r["guarantee"]) for r in self.releases]
        composed = compose_all(
            parts, mechanism=f"the {len(parts)} release(s) of an artifact sealed elsewhere"
        )
        guarantee = composed.assuming(*self.privacy.assumptions)
        identity = f"foreign:{self.manifest_hash}"
        return {
            "id": identity,
            "stage": self.stage,
            "path": recorded_path(self.path),
            "data": {"name": f"the private data behind {self.path} (sealed elsewhere)", "identity": identity},
            "unit": guarantee.unit,
            "units": None,
            "guarantee": json_safe(guarantee.model_dump(mode="json")),
        }

    def require_sealed_here(self, use: str) -> None:
        """Refuse ``use`` of a foreign artifact that records reads of private data, where a stand-in
        cannot serve (a new release over its private data needs its unit sets)."""
        if self.releases and not self.verified:
            raise ArtifactError(
                f"{self.path}: {self.unverified_reason}, and it records reads of private data, so it "
                f"cannot be {use} here; do it where it was made, or share that installation's key "
                "(`synthq key import`)"
            )

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
        return {
            "path": recorded_path(self.path),  # found again from any working directory
            "kind": "artifact",
            "stage": self.stage,
            "sha256": self.manifest_hash,
        }


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
            if is_keyed(expected):  # private diagnostics: a keyed digest (synthq.privacy.digests),
                # verifiable under the key that sealed the manifest only
                altered = verified and private_data_digest(sha256_file(file_path)) != expected
            else:
                altered = sha256_file(file_path) != expected
            if altered:
                raise ArtifactError(f"{file_path}: payload file was altered or truncated (sha256 mismatch)")
    check_privacy(manifest, path / MANIFEST, sealed=verified)
    return Artifact(path=path, manifest=manifest, verified=verified)


def check_privacy(manifest: dict, where: Path, *, sealed: bool) -> None:
    """A guarantee is recomputed, never read: every recorded release's ε must be what its
    mechanism parameters give, and the headline ``privacy`` (and ``own_privacy``) must be exactly
    what :func:`synthq.privacy.guarantee.compose_releases` gives for the recorded releases. In a
    manifest whose seal is not verified (``sealed=False``) a private release must also record
    what its ε is recomputed from, and its releases must be composed in one group: which releases
    share no units is read from unit sets only the sealing installation can check, so a foreign
    manifest that splits them (each group's ε counted once, not summed) is refused, as is a
    release of another unit that records a bound on each user's queries: a
    user-level release relabelled ``query`` would compose at its user ε, not its per-query one."""
    from synthq.runtime.errors import PrivacyError

    releases = manifest.get("releases", [])
    try:
        for release in releases:
            guarantee = Guarantee.from_manifest(release["guarantee"])
            check_recorded_epsilon(guarantee, f"{where} (release)", sealed=sealed)
            if not sealed and guarantee.unit != "user" and _records_user_bound(guarantee):
                raise PrivacyError(
                    f"{where}: a release of unit {guarantee.unit!r} records a bound on each user's queries, "
                    "which only user-level releases carry, and its seal is not this "
                    "installation's: a user-level release relabelled would compose at its user ε"
                )
        sharing = manifest.get("privacy", {}).get("details", {}).get("sharing", [[r["id"] for r in releases]])
        covered = {key for group in sharing for key in group}
        if covered != {r["id"] for r in releases}:
            raise PrivacyError(f"{where}: the releases and the groups they are composed in disagree")
        if not sealed and len(sharing) > 1:
            raise PrivacyError(
                f"{where}: its releases are composed in {len(sharing)} groups that share no units, which "
                "only the installation that sealed it can check, and its seal is not this installation's; "
                "open it where it was written, or have it re-released there"
            )
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


def _records_user_bound(guarantee: Guarantee) -> bool:
    """The guarantee records the bound K on each user's queries, which only a user-level release
    carries (a derived per-query view on another unit is refused by
    :func:`~synthq.privacy.accounting.check_recorded_epsilon` already)."""
    return (guarantee.details or {}).get("max_queries_per_user") is not None


def merged_releases(known: list[dict], artifact: Artifact) -> list[dict]:
    """``known`` release records with ``artifact``'s added, each id once. Release ids are public, so
    a manifest sealed elsewhere could carry one of this installation's ids with another record (a
    larger σ, a public label) and replace the real release in a ledger or a downstream artifact:
    such a collision is refused. A foreign record's unit set is dropped (a set its editor forged
    could make its release look disjoint from the others): it counts as sharing units with every
    release. Between manifests this installation sealed, the later record of an id is kept (it is
    the same release, recorded again)."""
    by_id = {r["id"]: r for r in known}
    for release in artifact.releases:
        earlier = by_id.get(release["id"])
        if earlier is not None and earlier != release and not artifact.verified:
            raise ArtifactError(
                f"{artifact.path}: records release {release['id']} differently from another artifact, "
                "and its seal is not this installation's: the manifest was edited"
            )
        if earlier is None and not artifact.verified:  # its unit set is its editor's: unknown here
            by_id[release["id"]] = {**release, "units": None}
        elif earlier is None or artifact.verified:
            by_id[release["id"]] = release
    return list(by_id.values())


def is_artifact(path: str | Path) -> bool:
    return (Path(path) / MANIFEST).is_file()


def is_synthq_manifest(path: str | Path) -> bool:
    """Whether ``path`` holds a manifest a synthq stage wrote (its ``stage`` and ``seal``), not just
    any ``manifest.json`` (a web project's, say)."""
    try:
        manifest = json.loads((Path(path) / MANIFEST).read_text(encoding="utf-8"))
    except (OSError, ValueError, UnicodeDecodeError):
        return False
    return isinstance(manifest, dict) and "stage" in manifest and "seal" in manifest


def enclosing_artifact(path: str | Path) -> Path | None:
    """The synthq artifact ``path`` is or lies inside, following links (a synthetic set is a BEIR
    directory at its artifact's root; a link, or a directory of links, may point into one), or
    ``None``."""
    path = Path(path).expanduser()
    for candidate in dict.fromkeys([path, *path.parents, *path.resolve().parents, path.resolve()]):
        if is_synthq_manifest(candidate):
            return candidate
    return None


def write_manifest(directory: Path, manifest: dict) -> None:
    """Write ``manifest.json`` atomically, sealed with the owner's key (:func:`synthq.privacy.keys.seal`)
    over exactly what reads back from the file."""
    text = json.dumps(json_safe(manifest), default=json_default, allow_nan=False)
    sealed = json.loads(text)
    sealed.pop("seal", None)
    sealed["seal"] = seal(sealed)
    manifest_tmp = directory / (MANIFEST + ".tmp")
    manifest_tmp.write_text(json.dumps(sealed, indent=2, ensure_ascii=False) + "\n", encoding="utf-8")
    os.replace(manifest_tmp, directory / MANIFEST)

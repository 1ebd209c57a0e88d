"""The privacy of evaluation scores: which splits are private, and the guarantee a score carries.

A score is a release about the private data behind it, and its ε is recomputed from those
releases (:func:`synthq.privacy.guarantee.compose_releases`, per unit):

* the retriever's releases (post-processing: a retriever trained on a synthetic set carries the
  generator's ε); BM25 and untrained public encoders carry none;
* a dataset that is a synthq artifact (a synthetic set) brings its releases to every score on it;
* **a private split** — any split of a dataset this installation has read as private, or that
  the dataset's ``privacy.json`` declares private, unless it declares it public — is a read of
  private queries without noise: ε = ∞ for its scores, whatever the retriever.
"""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path

from synthq.artifacts.hashing import sha256_tree
from synthq.artifacts.manifest import Artifact, is_artifact, open_artifact
from synthq.data.sources import declared_splits
from synthq.privacy.guarantee import Guarantee, compose_releases
from synthq.privacy.keys import private_data_digest
from synthq.privacy.units import registered_private_data, sharing_groups


@dataclass
class EvalData:
    """An evaluation dataset and what reading its split costs."""

    spec: str
    root: Path
    record: dict
    private: bool  # the evaluated split holds private queries
    artifact: Artifact | None = None  # a synthetic set evaluated as data: its releases come along
    assumption: str | None = None


def known_private_data(models: list[Artifact]) -> set[str]:
    """The keyed digests of every dataset known to be private: read by a release behind one of
    ``models``, or registered as private by this installation."""
    return {r["data"]["sha256"] for a in models for r in a.releases} | set(registered_private_data())


def eval_data(spec: str, root: Path, split: str, known_private: set[str]) -> EvalData:
    """Classify one dataset's split: a synthq artifact (inherits), a private split (ε = ∞ to read
    without noise), or public (a declared-public split of a private dataset says so)."""
    if is_artifact(root):
        artifact = open_artifact(root)
        return EvalData(spec, root, artifact.input_record(), False, artifact)
    plain = sha256_tree(root)
    keyed = private_data_digest(plain)
    declared = declared_splits(root)
    state = declared.get(split)
    has_private = keyed in known_private or "private" in declared.values()
    private = state == "private" or (state is None and keyed in known_private)
    record = {"path": str(root), "kind": "data", "name": spec, "sha256": keyed if has_private else plain}
    if private:
        record["private"] = True
    assumption = (
        f"split {split!r} of {spec} is public: declared so in its {root / 'privacy.json'}"
        if state == "public" and has_private
        else None
    )
    return EvalData(spec, root, record, private, assumption=assumption)


def private_split_guarantee(spec: str, split: str) -> Guarantee:
    """The guarantee of scores of the private queries of a split, read without noise: ε = ∞."""
    reason = (
        f"scores of the private queries of split {split!r} of {spec}, without noise (ε = ∞); "
        "evaluate on a public split, or declare the split public in the dataset's privacy.json"
    )
    return Guarantee.non_private(reason, unit="query")


def score_guarantee(releases: list[dict], assumptions: list[str]) -> Guarantee:
    """The guarantee of a score computed from ``releases`` (each counted once, by id): their
    composition per unit, under ``assumptions``."""
    unique = list({r["id"]: r for r in releases}.values())
    return compose_releases(unique, sharing_groups(unique), assumptions)

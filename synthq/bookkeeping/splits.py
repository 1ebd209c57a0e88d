"""The privacy of evaluation scores: which splits are private, and the guarantee a score carries.

A score is a release about the private data behind it, and its ε is recomputed from those
releases (:func:`synthq.privacy.guarantee.compose_releases`, per unit):

* the retriever's releases (post-processing: a retriever trained on a synthetic set carries the
  generator's ε); BM25 and untrained public encoders carry none;
* a dataset that is a synthq artifact (a synthetic set) brings its releases to every score on it;
* **a private split** is a read of private queries without noise: ε = ∞ for its scores, whatever
  the retriever.

**Fail closed.** A split of a dataset the user gives (a directory, ``embedded`` included) is
private unless the dataset's ``privacy.json`` declares it public
(:func:`synthq.data.sources.declared_splits`, which refuses a misspelt split name); only a
published benchmark synthq fetches itself (``msmarco``, ``beir:NAME``, ``irds:ID``,
:func:`synthq.data.sources.public_benchmark`) is public without a declaration (and even then a
split it declares private is private). "Private" never depends on a digest matching: no edit of the
directory (a privacy.json added, a users.tsv, a typo fixed in the corpus), no other key, no other
installation turns a private split public.

What an eval records of the data it reads (:mod:`synthq.privacy.digests`): a private split, the
keyed digest of the dataset directory and its keyed identity; a public split (declared, or of a
public benchmark), only what that read reads — the corpus, ``qrels/<split>.tsv`` and that split's
queries — by a plain digest (public by the declaration), so the released manifest of a public-split
eval is the same for D and for D minus one private query or user of another split.
"""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path

from synthq.artifacts.manifest import Artifact, is_artifact, open_artifact
from synthq.data.sources import SPLIT_DECLARATION, dataset_parts, declared_splits, public_benchmark
from synthq.privacy.digests import data_record, public_split_record
from synthq.privacy.guarantee import Guarantee, compose_releases
from synthq.privacy.unit_sets import link_assumptions, sharing_groups
from synthq.runtime.errors import ArtifactError


@dataclass
class EvalData:
    """An evaluation dataset and what reading its split costs."""

    spec: str
    root: Path
    record: dict
    private: bool  # the evaluated split holds private queries
    artifact: Artifact | None = None  # a synthetic set evaluated as data: its releases come along
    assumption: str | None = None


def split_is_private(spec: str, root: Path, split: str) -> bool:
    """Fail closed: private unless declared public, or a public benchmark not declaring it private.

    A set of sub-datasets (CQADupStack's layout) is read by its own ``privacy.json`` and each
    part's: a split any of them declares private is private; without a declaration at the top, it
    is public only when every part declares it public."""
    parts = [part for _, part in dataset_parts(root) if Path(part) != Path(root)]
    states = [declared_splits(part).get(split) for part in parts]
    if "private" in states:
        return True
    state = declared_splits(root).get(split)
    if state is not None:
        return state == "private"
    if parts and all(s == "public" for s in states):
        return False
    return not public_benchmark(spec)


def eval_data(spec: str, root: Path, split: str) -> EvalData:
    """Classify one dataset's split: a synthq artifact (inherits), a private split (ε = ∞ to read
    without noise), or public (a declared-public split of a user's dataset says so)."""
    if is_artifact(root):
        artifact = open_artifact(root)
        return EvalData(spec, root, artifact.input_record(), False, artifact)
    private = split_is_private(spec, root, split)
    benchmark = public_benchmark(spec)
    assumption = None
    if private:
        # a read of private queries: the keyed digest of the directory, and the dataset's identity
        record = data_record(root, spec, private=True)
    else:
        # a read of a public split depends on that split only (corpus, its qrels, its queries):
        # plain digest, identical for D and D minus one private unit of another split
        record = public_split_record(root, spec, split)
        if record is None:  # the split's files are missing (the read fails): named as before
            record = data_record(root, spec, private=not benchmark)
            record.pop("private", None)
            record.pop("identity", None)
        if not benchmark:
            where = Path(root) / SPLIT_DECLARATION
            assumption = f"split {split!r} of {spec} is public: declared so in its {where}"
    return EvalData(spec, root, record, private, assumption=assumption)


def private_split_guarantee(spec: str, split: str) -> Guarantee:
    """The guarantee of scores of the private queries of a split, read without noise: ε = ∞."""
    reason = (
        f"scores of the private queries of split {split!r} of {spec}, without noise (ε = ∞); "
        "evaluate on a public split, or declare the split public in the dataset's privacy.json"
    )
    return Guarantee.non_private(reason, unit="query")


def distinct_records(releases: list[dict]) -> dict[str, dict]:
    """``releases`` by id, each once; two different records of one id are an ``ArtifactError``."""
    by_id: dict[str, dict] = {}
    for release in releases:
        if by_id.setdefault(release["id"], release) != release:
            raise ArtifactError(f"two different records of release {release['id']}: one was edited")
    return by_id


def score_guarantee(releases: list[dict], assumptions: list[str]) -> Guarantee:
    """The guarantee of a score computed from ``releases`` (each counted once, by id): their
    composition per unit, under ``assumptions``. Two different records of one id are refused:
    ids are public, and keeping either would let a forged one stand for the real release."""
    unique = list(distinct_records(releases).values())
    assumptions = list(dict.fromkeys([*assumptions, *link_assumptions(unique)]))
    return compose_releases(unique, sharing_groups(unique), assumptions)

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


# What a read of a public split records of why it was public (review round 5, flow 3): checked again
# whenever the artifact is used, since a declaration can be retracted after the read.
PUBLIC_BY_DECLARATION, PUBLIC_BY_BENCHMARK = "declared public in privacy.json", "public benchmark"


def public_read_record(record: dict, spec: str) -> dict:
    """A public split's read record with what made the split public when it was read."""
    return {**record, "public_by": PUBLIC_BY_BENCHMARK if public_benchmark(spec) else PUBLIC_BY_DECLARATION}


def _still_public(record: dict, where: Path) -> tuple[bool, str]:
    """Whether the split a public read recorded is still public, and if not, why. A split read as
    declared public must still be declared so, whatever the dataset's name (a directory named
    ``fiqa`` is no benchmark); a benchmark's split must not be declared private since."""
    from synthq.runtime.errors import DataError

    split = record["split"]
    benchmark = record.get("public_by") == PUBLIC_BY_BENCHMARK and _benchmark_name(record.get("name") or "")
    try:
        if benchmark:  # public unless declared private since (whatever the working directory holds)
            private = declared_splits(where).get(split) == "private"
        else:  # read as declared: still declared, whatever the directory is called
            private = split_is_private(str(where), where, split)
    except DataError as error:
        return False, f"its declaration cannot be read ({error})"
    return (True, "") if not private else (False, f"{where / SPLIT_DECLARATION} no longer declares it public")


def _benchmark_name(name: str) -> bool:
    """A name synthq fetches as a published benchmark, by the name alone (no local directory
    consulted: the check must not depend on the working directory)."""
    from synthq.data.sources import BEIR_DATASETS, IRDS_PREFIX

    return name.startswith(("beir:", IRDS_PREFIX)) or name in BEIR_DATASETS


def public_reads_of(artifact: Artifact, seen: set[str] | None = None) -> list[tuple[dict, Path]]:
    """Every read of a split as public behind ``artifact`` with where its dataset is now: the
    manifest's sealed list, and, for manifests written before it, the lineage still on disk."""
    from synthq.artifacts.freshness import input_location
    from synthq.privacy.digests import PUBLIC_SPLIT

    seen = set() if seen is None else seen
    reads = [(record, Path(record["path"])) for record in artifact.public_reads]
    for record in artifact.inputs:
        where = input_location(artifact, record)
        if record.get("kind") == PUBLIC_SPLIT:
            reads.append((record, where))
        elif record.get("kind") == "artifact" and is_artifact(where) and str(where.resolve()) not in seen:
            seen.add(str(where.resolve()))
            try:
                parent = open_artifact(where, verify=False)
            except ArtifactError:
                continue  # refused where it is opened to be used
            reads += public_reads_of(parent, seen)
    return reads


def retracted_reads(artifact: Artifact) -> list[str]:
    """Reads of a split as public by ``artifact`` or anything it was made from (a warm start,
    few-shot examples, a held-out loss, an eval's scores) whose dataset no longer declares that
    split public.

    Fail closed after the fact: such a read was a read of what its owner now says is private data,
    without noise (ε = ∞), and no recorded release says so. The reads come from the manifest's own
    sealed list (its reads and those it inherited, so a parent moved away or replaced still
    counts) and, for manifests written before that list, from the lineage still on disk
    (:func:`public_reads_of`). A dataset that is not there cannot be checked: the ledger says so
    (``not checked``); an unreadable ``privacy.json`` counts as a retraction."""
    found = []
    for record, where in public_reads_of(artifact):
        if not where.is_dir():
            continue
        public, why = _still_public(record, where)
        if not public:
            role = record.get("role") or "evaluation"
            read = f"a read of split {record['split']!r} of {where} as public ({role})"
            found.append(f"{artifact.path} rests on {read}, but {why}")
    return list(dict.fromkeys(found))


def refuse_retracted(artifact: Artifact) -> Artifact:
    """``artifact``, unless it rests on a read of a split that is no longer declared public
    (:func:`retracted_reads`): then a :class:`~synthq.runtime.errors.PrivacyError`, since every
    figure it would give (its ε, its scores, the ledger's total) would call an ε = ∞ read public."""
    from synthq.runtime.errors import PrivacyError

    found = retracted_reads(artifact)
    if found:
        more = f" (and {len(found) - 1} more)" if len(found) > 1 else ""
        raise PrivacyError(
            f"{found[0]}{more}: that read was of data now declared private, without noise (ε = ∞), "
            "and no release records it. Declare the split public again if it is, or redo the work "
            "without it"
        )
    return artifact


def refuse_artifact_parts(spec: str, root: Path, split: str) -> None:
    """A dataset that is not itself an artifact but holds one (a sub-dataset that is a synthetic
    set, a link into one) is refused: its split would be classified by a ``privacy.json`` while
    its queries are a release of private data (review round 5, the flow-1 class)."""
    from synthq.bookkeeping.inputs import artifact_inside
    from synthq.runtime.errors import PrivacyError

    inside = artifact_inside(root, split)
    if inside is not None:
        raise PrivacyError(
            f"{spec}: part of it is the synthq artifact {inside}, whose queries are a release of "
            "private data whatever privacy.json says; evaluate the artifact itself (it carries its ε)"
        )


def eval_data(spec: str, root: Path, split: str) -> EvalData:
    """Classify one dataset's split: a synthq artifact (inherits), a private split (ε = ∞ to read
    without noise), or public (a declared-public split of a user's dataset says so)."""
    if is_artifact(root):
        from synthq.bookkeeping.inputs import artifact_input

        artifact = artifact_input(root)
        return EvalData(spec, root, artifact.input_record(), False, artifact)
    refuse_artifact_parts(spec, root, split)
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
        else:
            record = public_read_record(record, spec)
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

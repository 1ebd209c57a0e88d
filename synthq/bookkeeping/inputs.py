"""Where every input of a stage came from, and what reading it brings into the artifact.

``--model`` / ``--encoder`` / ``--untrained`` may name a packaged alias (public by construction),
a hub id or a plain local directory (recorded with its content hash and *assumed* public — the
guarantee says so), or a synthq artifact, whose releases then come along into whatever is trained
from it (:func:`model_input`). A dataset argument may be a BEIR directory (private data) or a
synthq artifact used as data, whose releases come along the same way (:func:`data_input`); the
public documents a synthetic set is written for are recorded with the assumptions they make
(:func:`public_documents_input`).
"""

from __future__ import annotations

import contextlib
from collections.abc import Iterable
from dataclasses import dataclass
from pathlib import Path

from synthq.artifacts.manifest import Artifact, is_artifact, open_artifact
from synthq.artifacts.writer import ArtifactWriter
from synthq.config.registry import SYNTHETIC_STAGES
from synthq.privacy.guarantee import Guarantee
from synthq.runtime.hashing import sha256_tree


def artifact_input(path: str | Path, stage: str | Iterable[str] | None = None) -> Artifact:
    """An artifact a stage reads (a starting model, a generator, a synthetic set, retrievers to
    evaluate, evals to report): opened and checked, and refused when it rests on a read of a split
    that is no longer declared public (:func:`~synthq.bookkeeping.splits.refuse_retracted`)."""
    from synthq.bookkeeping.splits import refuse_retracted

    return refuse_retracted(open_artifact(path, stage=stage))


@dataclass(frozen=True)
class ModelInput:
    """A starting model: its lineage record and the guarantee it brings along."""

    spec: str
    path: Path
    record: dict
    guarantee: Guarantee
    artifact: Artifact | None = None

    @property
    def is_artifact(self) -> bool:
        return self.artifact is not None

    def carry_into(self, writer: ArtifactWriter) -> None:
        """What training from this model brings into ``writer``: an artifact's releases and
        assumptions, or the assumption that a plain model is public."""
        if self.artifact is not None:
            writer.inherit(self.artifact)
        else:
            writer.assume(*self.guarantee.assumptions)


def model_input(spec: str, stage: str | None = None) -> ModelInput:
    """Resolve ``spec`` and say what training from it inherits.

    * a synthq artifact directory (made by ``stage``, when given: a generator is never taken
      for an encoder): recorded as an input artifact; its guarantee is inherited;
    * a packaged alias: public by construction (:meth:`Guarantee.public`);
    * any other local directory or hub id: recorded with path (hub: snapshot revision) and
      content hash, public *by assumption*, which the guarantee lists.
    """
    from synthq.models.resolve import aliases, resolve_model

    candidate = Path(spec).expanduser()
    if is_artifact(candidate):
        artifact = artifact_input(candidate, stage=stage)
        record = {**artifact.input_record(), "role": "model"}
        return ModelInput(spec, artifact.path, record, artifact.privacy, artifact)
    path = resolve_model(spec)
    digest = sha256_tree(path)
    record = {"path": str(path), "kind": "model", "name": spec, "sha256": digest, "role": "model"}
    if spec in aliases():
        guarantee = Guarantee.public(f"packaged public model {spec}")
        return ModelInput(spec, path, record, guarantee)
    refuse_a_synthq_model_without_its_manifest(spec, path, local=candidate.exists())
    where = f"hub model {spec} (snapshot {path.name})" if not candidate.exists() else f"local model {path}"
    guarantee = Guarantee.public(f"{where}, assumed public").assuming(
        f"{STARTING_MODEL_ASSUMED} {spec} (sha256 {digest[:12]}) is public: it was not trained on the "
        "private data"
    )
    return ModelInput(spec, path, {**record, "revision": path.name}, guarantee)


# How the assumption that a plain starting model is public begins (a stage's result line shows it).
STARTING_MODEL_ASSUMED = "the starting model"


def assumed_public_models(guarantee: Guarantee) -> list[str]:
    """The assumptions of ``guarantee`` that a starting model is public: an ε of 0 rests on them."""
    return [a for a in guarantee.assumptions if a.startswith(STARTING_MODEL_ASSUMED + " ")]


def refuse_a_synthq_model_without_its_manifest(spec: str, path: Path, local: bool) -> None:
    """Weights that carry synthq's own model card (:mod:`synthq.artifacts.model_card`) came out of
    a synthq stage: copied without their ``manifest.json`` they would be taken as a public model
    and everything written from them would say ε = 0, whatever private data trained them (issue
    #74). A local copy is refused (the artifact it came from brings its guarantee along); a hub
    model is someone's published synthq model, public to you only if it never saw your data, which
    the result line and the ledger then state as an assumption, after a warning."""
    import re

    from synthq.artifacts.model_card import CARD, SECTION
    from synthq.runtime.console import warn
    from synthq.runtime.errors import PrivacyError

    card = path / CARD
    try:
        text = card.read_text(encoding="utf-8", errors="replace") if card.is_file() else ""
    except OSError:
        return
    if SECTION not in text:
        return
    stated = re.search(r"^\| ε \| ([^|]+?) \|", text, re.MULTILINE)
    epsilon = f" (its card states ε {stated.group(1)})" if stated else ""
    if local:
        raise PrivacyError(
            f"{spec}: these weights carry synthq's model card{epsilon} but no manifest.json: a synthq "
            "model copied without its record, which would be taken as a public model (ε = 0). Pass the "
            "artifact directory it came from (with its manifest.json), whose guarantee then comes along"
        )
    warn(
        f"{spec}: a model published by synthq{epsilon}; taken as public, which holds only if it was "
        "never trained on your private data (recorded as an assumption)"
    )


@dataclass(frozen=True)
class DataInput:
    """Training or evaluation data: a private dataset, or a synthq artifact used as data."""

    spec: str
    root: Path
    record: dict
    artifact: Artifact | None = None

    @property
    def is_artifact(self) -> bool:
        return self.artifact is not None


def data_input(spec: str, private: bool = True) -> DataInput:
    """Resolve a ``--data`` spec. A synthq artifact (a synthetic set) is recorded as an artifact
    input, and a stage that reads it inherits its releases (it is a release of the private data
    it came from); anything else is recorded by a keyed digest when ``private``."""
    from synthq.artifacts.records import data_input_record
    from synthq.data.sources import declared_splits, resolve_source

    candidate = Path(spec).expanduser()
    if is_artifact(candidate):
        artifact = artifact_input(candidate, stage=SYNTHETIC_STAGES)
        return DataInput(spec, artifact.path, {**artifact.input_record(), "role": "data"}, artifact)
    root = resolve_source(spec)
    if (inside := artifact_inside(root)) is not None:  # links into a synthetic set are not new data
        from synthq.runtime.errors import PrivacyError

        raise PrivacyError(
            f"{spec}: part of it is the synthq artifact {inside}; pass the artifact itself, so that "
            "what is trained on it carries its releases"
        )
    declared_splits(root)  # a malformed or misspelt privacy.json is refused before any work
    return DataInput(spec, root, data_input_record(root, name=spec, private=private))


def public_documents_input(
    root: Path, corpus: str, documents: Path | None, split: str | None
) -> tuple[list[dict], list[str]]:
    """What a stage that writes queries for public documents (generate, evolve) records: the
    lineage of the public files it reads to choose them (the corpus, a ``--documents`` list, the
    *set* of documents a split judges — never its qrels file, whose (query, document) pairing is
    private, and never the directory, which holds private queries) and the assumptions the choice
    rests on (the list, or the split's judged-document set, is public)."""
    from synthq.artifacts.records import public_file_record
    from synthq.data.synthetic import document_list_assumption, judged_set_assumption
    from synthq.privacy.digests import judged_set_record
    from synthq.runtime.errors import PrivacyError

    if (inside := artifact_inside(root, split)) is not None:  # its documents are those DP kept
        raise PrivacyError(
            f"--corpus {corpus}: {inside} is a synthq artifact, whose documents (the ones its queries "
            "kept) and judgements come from a release of private data; give the public corpus itself"
        )

    records, assumptions = [public_file_record(root / "corpus.jsonl", corpus)], []
    qrels = root / "qrels" / f"{split}.tsv"
    if split is not None and qrels.is_file():  # a missing one is reported when documents are chosen
        records.append(judged_set_record(qrels, split))
    if split is not None:
        assumptions.append(judged_set_assumption(split))
    if documents is not None:
        records.append(public_file_record(Path(documents), "document list"))
        assumptions.append(document_list_assumption(records[-1]))
    return records, assumptions


@dataclass(frozen=True)
class PublicPairs:
    """(document, query) pairs of a split its dataset declares public: few-shot examples, a warm
    start. Reading them costs no ε; the record names them and the assumption says why."""

    spec: str
    split: str
    pairs: object  # a synthq.data.pairs.PairList
    record: dict
    assumption: str


def artifact_inside(root: Path, split: str | None = None) -> Path | None:
    """The synthq artifact that ``root``, one of its sub-datasets, or a file a read of ``split``
    opens (its corpus, queries, qrels) is or lies inside, links followed; ``None`` when none is."""
    from synthq.artifacts.manifest import enclosing_artifact
    from synthq.data.sources import dataset_parts
    from synthq.runtime.errors import DataError

    candidates = [Path(root)]
    with contextlib.suppress(DataError):  # not a BEIR directory: refused where it is read
        candidates += [part for _, part in dataset_parts(Path(root))]
    for part in list(candidates[1:]) or candidates:
        files = ["corpus.jsonl", "queries.jsonl", *([f"qrels/{split}.tsv"] if split else [])]
        candidates += [part / name for name in files if (part / name).exists()]
    return next((found for c in candidates if (found := enclosing_artifact(c)) is not None), None)


def refuse_artifact_as_public_pairs(root: Path, spec: str, role: str, split: str | None = None) -> None:
    """Public pairs are a dataset's declared-public split, never a synthq artifact's: a synthetic
    set's queries are a release of the private data its generator read (its ε, which every reader
    inherits), and no ``privacy.json`` written into it, nor a directory that links to it, makes
    them public (review round 5, flow 1). Refused whatever the artifact's own ε, so the read never
    needs to inherit anything. A copy without its manifest cannot be told for sure: its synthetic
    query ids (``syn-<doc>-<k>``) draw a warning."""
    from synthq.artifacts.manifest import open_artifact
    from synthq.runtime.errors import PrivacyError

    artifact = artifact_inside(root, split)
    if artifact is None:
        _warn_of_a_copied_synthetic_set(root, spec, role, split)
        return
    try:
        what = f"a synthq {open_artifact(artifact, verify=False).stage} artifact"
    except Exception:  # noqa: BLE001 - refused either way; a broken manifest only changes the words
        what = "a synthq artifact"
    raise PrivacyError(
        f"{role} {spec}: {artifact} is {what}, not a public dataset: its pairs carry the releases of "
        "the private data behind it, and no privacy.json can make them public. Read a synthetic set "
        "as training data (train-retriever --data), which carries its ε"
    )


def _warn_of_a_copied_synthetic_set(root: Path, spec: str, role: str, split: str | None) -> None:
    from synthq.data.beir_io import read_qrels
    from synthq.data.synthetic import SYNTHETIC_QUERY_ID
    from synthq.runtime.console import warn

    qrels = Path(root) / "qrels" / f"{split}.tsv"
    if split is None or not qrels.is_file():
        return
    try:
        ids = list(read_qrels(qrels))
    except Exception:  # noqa: BLE001 - a malformed file is reported where it is read
        return
    if ids and all(SYNTHETIC_QUERY_ID.fullmatch(i) for i in ids):
        warn(
            f"{role} {spec}: every query id of split {split!r} has the form of synthq's synthetic ids "
            "(syn-<doc>-<k>): if this is a synthetic set copied without its manifest, its pairs are a "
            "release of private data, not public pairs"
        )


def public_pairs_input(spec: str, role: str) -> PublicPairs:
    """``SOURCE:SPLIT`` -> the split's pairs, refused unless the source declares the split public
    (:func:`~synthq.bookkeeping.splits.split_is_private`, fail closed)."""
    from synthq.bookkeeping.splits import public_read_record, split_is_private
    from synthq.data.pairs import training_pairs
    from synthq.data.sources import load_source, qrels_splits, resolve_source
    from synthq.privacy.digests import public_split_record
    from synthq.runtime.errors import DataError, PrivacyError

    source, _, split = spec.rpartition(":")
    if not source or not split:
        raise DataError(f"{role} must be SOURCE:SPLIT (e.g. pydocs:test), not {spec!r}")
    root = resolve_source(source)
    refuse_artifact_as_public_pairs(root, spec, role, split)
    splits = qrels_splits(root)
    if split not in splits:  # a misspelt split is missing, not private (split names are public)
        names = ", ".join(sorted(splits)) or "none"
        raise DataError(
            f"{role} {spec}: {source} has no split {split!r} (its splits: {names}); "
            "give SOURCE:SPLIT with a split its privacy.json declares public"
        )
    if split_is_private(source, root, split):
        raise PrivacyError(
            f"{role} {spec}: split {split!r} is not declared public in {root}/privacy.json; reading its "
            "pairs without noise would be a release of them (ε = ∞)"
        )
    pairs = training_pairs(load_source(source, splits=[split]), split)
    # exactly what the read depends on (the corpus, the split's qrels and its queries): never a plain
    # digest of the whole directory, whose private splits an adversary could test candidates against
    read = public_split_record(root, source, split)
    if read is None:
        raise DataError(f"{role} {spec}: the split's files are not all there", root)
    record = {**public_read_record(read, source), "role": role}
    return PublicPairs(
        spec, split, pairs, record, f"the {role} pairs {spec} are public (declared in privacy.json)"
    )

"""The run-level privacy ledger: where every model came from, and what a set of artifacts costs.

Two questions an artifact's own guarantee cannot answer alone:

* **Where did a starting model come from?** (:func:`model_input`) ``--model`` / ``--encoder`` /
  ``--untrained`` may name a packaged alias (public by construction), a hub id or a plain local
  directory (recorded with its content hash and *assumed* public — the guarantee says so), or a
  synthq artifact, whose releases then come along into whatever is trained from it.
* **What does a set of artifacts cost?** (:func:`ledger`) Every manifest records the releases
  of private data behind it (its own and its inputs', copied when it was written, sealed), so
  the ledger reads the *records*, never the paths that happen to be there now: the releases of
  all the artifacts given, each counted once, composed per privacy unit
  (:func:`synthq.privacy.guarantee.compose_releases`) — per private dataset and over everything. Inputs
  whose content changed since they were read are reported as "changed since"; the record still
  counts. ``synthq ledger DIR...`` and the end of ``synthq run`` print this.
"""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path

from synthq.artifacts import (
    MANIFEST,
    Artifact,
    ArtifactWriter,
    current_input_hash,
    is_artifact,
    open_artifact,
    sha256_tree,
)
from synthq.config.registry import SYNTHETIC_STAGES
from synthq.privacy.guarantee import Guarantee, compose_releases, release_guarantee
from synthq.privacy.units import sharing_groups
from synthq.runtime.errors import ArtifactError


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
        artifact = open_artifact(candidate, stage=stage)
        record = {**artifact.input_record(), "role": "model"}
        return ModelInput(spec, artifact.path, record, artifact.privacy, artifact)
    path = resolve_model(spec)
    digest = sha256_tree(path)
    record = {"path": str(path), "kind": "model", "name": spec, "sha256": digest, "role": "model"}
    if spec in aliases():
        guarantee = Guarantee.public(f"packaged public model {spec}")
        return ModelInput(spec, path, record, guarantee)
    where = f"hub model {spec} (snapshot {path.name})" if not candidate.exists() else f"local model {path}"
    guarantee = Guarantee.public(f"{where}, assumed public").assuming(
        f"the starting model {spec} (sha256 {digest[:12]}) is public: it was not trained on the private data"
    )
    return ModelInput(spec, path, {**record, "revision": path.name}, guarantee)


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
    from synthq.artifacts import data_input_record
    from synthq.data.sources import resolve_source

    candidate = Path(spec).expanduser()
    if is_artifact(candidate):
        artifact = open_artifact(candidate, stage=SYNTHETIC_STAGES)
        return DataInput(spec, artifact.path, {**artifact.input_record(), "role": "data"}, artifact)
    root = resolve_source(spec)
    return DataInput(spec, root, data_input_record(root, name=spec, private=private))


def public_documents_input(
    root: Path, corpus: str, documents: Path | None, split: str | None
) -> tuple[list[dict], list[str]]:
    """What a stage that writes queries for public documents (generate, evolve) records: the
    lineage of the public files it reads to choose them (the corpus, a ``--documents`` list, a
    split's qrels; never the directory, which may hold private queries) and the assumptions the
    choice rests on (the list, or the split's judged-document set, is public)."""
    from synthq.artifacts import public_file_record
    from synthq.data.synthetic import document_list_assumption, judged_set_assumption

    records, assumptions = [public_file_record(root / "corpus.jsonl", corpus)], []
    qrels = root / "qrels" / f"{split}.tsv"
    if split is not None and qrels.is_file():  # a missing one is reported when documents are chosen
        records.append(public_file_record(qrels, f"qrels {split}"))
    if split is not None:
        assumptions.append(judged_set_assumption(split))
    if documents is not None:
        records.append(public_file_record(Path(documents), "document list"))
        assumptions.append(document_list_assumption(records[-1]))
    return records, assumptions


@dataclass
class DatasetCost:
    """What the releases in a ledger cost one private dataset."""

    name: str
    sha256: str
    releases: list[dict]

    @property
    def total(self) -> Guarantee:
        return compose_releases(self.releases, sharing_groups(self.releases), [])


@dataclass
class Ledger:
    """The releases behind a set of artifacts, per private dataset, and what changed since."""

    artifacts: list[Artifact]
    releases: list[dict]
    datasets: dict[str, DatasetCost]
    changed: list[str]

    @property
    def total(self) -> Guarantee:
        """Everything composed per unit (across datasets: units are keyed by id, so ids that two
        datasets share are counted as one unit — a bound)."""
        assumptions = [a for artifact in self.artifacts for a in artifact.privacy.assumptions]
        return compose_releases(self.releases, sharing_groups(self.releases), assumptions)


def _changed_since(artifact: Artifact, seen: set[str]) -> list[str]:
    """Inputs (followed through artifacts still in place) whose content no longer matches the
    identifier recorded when they were read."""
    notes = []
    for record in artifact.inputs:
        now = current_input_hash(record)
        label = f"{record.get('stage') or record.get('kind')} {record['path']}"
        if now != record["sha256"]:
            state = "is gone" if now is None else "changed since"
            notes.append(f"{label} {state} {artifact.path} read it (the recorded releases still count)")
            continue
        if record.get("kind") == "artifact" and record["path"] not in seen:
            seen.add(record["path"])
            notes += _changed_since(open_artifact(record["path"]), seen)
    return notes


def ledger(paths: list[str | Path]) -> Ledger:
    """The releases recorded by the artifacts at ``paths`` (each once), per private dataset."""
    for path in paths:
        if not is_artifact(path):
            raise ArtifactError(f"{path}: not an artifact (no {MANIFEST})")
    artifacts = [open_artifact(path) for path in paths]
    releases = list({r["id"]: r for a in artifacts for r in a.releases}.values())
    datasets: dict[str, DatasetCost] = {}
    for release in releases:
        data = release["data"]
        cost = datasets.setdefault(data["sha256"], DatasetCost(data.get("name") or "?", data["sha256"], []))
        cost.releases.append(release)
    seen: set[str] = set()
    changed = list(dict.fromkeys(note for a in artifacts for note in _changed_since(a, seen)))
    return Ledger(artifacts, releases, datasets, changed)


def ledger_lines(paths: list[str | Path]) -> list[str]:
    """The ledger as text: one block per private dataset, the total, what changed since, then each
    assumption once, with the artifact that makes it (or how many do)."""
    book = ledger(paths)
    lines = []
    if not book.datasets:
        lines.append(
            "no artifact here read private data (only public data or post-processing of nothing private)"
        )
    for cost in book.datasets.values():
        total = cost.total
        lines.append(
            f"private dataset {cost.name} (keyed id {cost.sha256.removeprefix('hmac:')[:12]}): "
            f"{total.describe()} over {len(cost.releases)} release(s), composed per {total.unit}"
        )
        for release in cost.releases:
            own = release_guarantee(release)
            kind = "DP release" if own.is_private else "read WITHOUT DP"
            units = release.get("units") or {}
            lines.append(
                f"  - {release['stage']} {release['path']}: {kind}, {own.describe()}, "
                f"{units.get('count', '?')} {units.get('kind', own.unit)} units"
            )
    if len(book.datasets) > 1:
        lines.append(f"all releases together, per unit: {book.total.describe()}")
    for note in book.changed:
        lines.append(f"changed since: {note}")
    holders: dict[str, list[str]] = {}  # each assumption once, with the artifacts that make it
    for artifact in book.artifacts:
        for assumption in artifact.privacy.assumptions:
            holders.setdefault(assumption, []).append(str(artifact.path))
    if holders:
        lines.append("assumptions:")
        for assumption, paths_making_it in holders.items():
            where = paths_making_it[0] if len(paths_making_it) == 1 else f"{len(paths_making_it)} artifacts"
            lines.append(f"  - {assumption} ({where})")
    return lines


def dataset_totals(paths: list[str | Path]) -> dict[str, float]:
    """Total ε per private dataset name (``inf`` where something read it without DP)."""
    return {cost.name: cost.total.epsilon for cost in ledger(paths).datasets.values()}

"""The run-level privacy ledger: where every model came from, and what a set of artifacts costs.

Two questions an artifact's own guarantee cannot answer alone:

* **Where did a starting model come from?** (:func:`model_input`) ``--model`` / ``--encoder`` /
  ``--untrained`` may name a packaged alias (public by construction), a hub id or a plain local
  directory (recorded with its content hash and *assumed* public — the guarantee says so), or a
  synthq artifact, whose own guarantee then composes with whatever is trained from it.
* **What does a whole pipeline cost?** (:func:`ledger`) Every artifact that read a private
  dataset directly is a release of it: DP releases compose (basic composition, ε and δ add),
  a non-DP reader makes the dataset's total ε = ∞. Artifacts that only post-process releases
  (generate, training on synthetic data, eval, report) add nothing. ``synthq ledger DIR...`` and
  the end of ``synthq run`` print this per private dataset.
"""

from __future__ import annotations

import math
from dataclasses import dataclass, field
from pathlib import Path

from synthq.artifacts import MANIFEST, Artifact, is_artifact, open_artifact, sha256_tree
from synthq.errors import ArtifactError
from synthq.privacy import Guarantee, compose, format_epsilon


@dataclass(frozen=True)
class ModelInput:
    """A starting model: its lineage record and the guarantee it brings along."""

    spec: str
    path: Path
    record: dict
    guarantee: Guarantee

    @property
    def is_artifact(self) -> bool:
        return self.record.get("kind") == "artifact"


def model_input(spec: str) -> ModelInput:
    """Resolve ``spec`` and say what training from it inherits.

    * a synthq artifact directory: recorded as an input artifact; its guarantee is inherited;
    * a packaged alias: public by construction (:meth:`Guarantee.public`);
    * any other local directory or hub id: recorded with path (hub: snapshot revision) and
      content hash, public *by assumption*, which the guarantee lists.
    """
    from synthq.models.resolve import aliases, resolve_model

    candidate = Path(spec).expanduser()
    if is_artifact(candidate):
        artifact = open_artifact(candidate)
        record = {**artifact.input_record(), "role": "model"}
        return ModelInput(spec, artifact.path, record, artifact.privacy)
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


def trained_from(model: ModelInput, trained: Guarantee) -> Guarantee:
    """The guarantee of a model trained (with ``trained``'s guarantee) from ``model``: the
    starting model's own claim composes with the training's (both may read the same data)."""
    combined = compose(model.guarantee, trained, mechanism=f"{trained.mechanism} from {model.spec}")
    if model.is_artifact and model.guarantee.mechanism != "public":
        combined = combined.model_copy(
            update={"derived_from": list(dict.fromkeys([*combined.derived_from, model.record["sha256"]]))}
        )
    return combined


# ---------------------------------------------------------------------------------------------


@dataclass
class DatasetCost:
    """What the releases in a ledger cost one private dataset."""

    name: str
    sha256: str
    releases: list[tuple[Artifact, Guarantee]] = field(default_factory=list)

    @property
    def total(self) -> Guarantee:
        total: Guarantee | None = None
        for _, own in self.releases:
            total = own if total is None else compose(total, own, mechanism="basic composition")
        return total or Guarantee.public("no artifact read it")


def own_guarantee(artifact: Artifact) -> Guarantee:
    """The guarantee of what an artifact's own mechanism released about the private data it read
    directly (without what it inherited from its inputs)."""
    own = artifact.manifest.get("own_privacy")
    return Guarantee.from_manifest(own) if own else artifact.privacy


def _walk(paths: list[Path]) -> list[Artifact]:
    seen: dict[str, Artifact] = {}
    pending = list(paths)
    while pending:
        path = Path(pending.pop())
        key = str(path.resolve())
        if key in seen or not (path / MANIFEST).is_file():
            continue
        artifact = open_artifact(path)
        seen[key] = artifact
        pending += [Path(r["path"]) for r in artifact.inputs if r.get("kind") == "artifact"]
    return list(seen.values())


def ledger(paths: list[str | Path]) -> tuple[list[Artifact], dict[str, DatasetCost]]:
    """Every artifact reachable from ``paths`` and, per private dataset, the releases that read it."""
    for path in paths:
        if not is_artifact(path):
            raise ArtifactError(f"{path}: not an artifact (no {MANIFEST})")
    artifacts = _walk([Path(p) for p in paths])
    costs: dict[str, DatasetCost] = {}
    for artifact in artifacts:
        for record in artifact.inputs:
            if not record.get("private"):
                continue
            key = record["sha256"]
            cost = costs.setdefault(key, DatasetCost(record.get("name") or record["path"], key))
            cost.releases.append((artifact, own_guarantee(artifact)))
    return artifacts, costs


def ledger_lines(paths: list[str | Path]) -> list[str]:
    """The ledger as text: one block per private dataset, then each assumption once, with the
    artifact that makes it (or how many do)."""
    artifacts, costs = ledger(paths)
    lines = []
    if not costs:
        lines.append("no artifact here read private data directly (only public data or post-processing)")
    for cost in costs.values():
        total = cost.total
        lines.append(
            f"private dataset {cost.name} (sha256 {cost.sha256[:12]}): total "
            f"{total.describe()} over {len(cost.releases)} release(s)"
        )
        for artifact, own in cost.releases:
            kind = "DP release" if own.is_private else "read WITHOUT DP"
            lines.append(f"  - {artifact.stage} {artifact.path}: {kind}, {own.describe()}")
    holders: dict[str, list[str]] = {}  # each assumption once, with the artifacts that make it
    for artifact in artifacts:
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
    _, costs = ledger(paths)
    return {cost.name: cost.total.epsilon for cost in costs.values()}


def describe_total(epsilon: float) -> str:
    return "∞" if math.isinf(epsilon) else format_epsilon(epsilon)

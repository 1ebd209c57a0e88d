"""The writer a stage fills inside ``create_artifact``: its payload, metrics and privacy record.

A stage writes payload under :attr:`ArtifactWriter.dir`, private noiseless statistics into
:attr:`ArtifactWriter.diagnostics` (ε = ∞, never part of a release), and says where it stands on
privacy: its own read of private data (:meth:`ArtifactWriter.release`), what flows in from input
artifacts (:meth:`ArtifactWriter.inherit`), the assumptions its guarantee relies on, or that it
read no private data (:meth:`ArtifactWriter.public`).
"""

from __future__ import annotations

import secrets
from collections.abc import Sequence
from dataclasses import dataclass, field
from pathlib import Path

from synthq.artifacts.manifest import Artifact
from synthq.privacy.guarantee import Guarantee, compose_releases
from synthq.runtime.errors import PrivacyError
from synthq.runtime.hashing import json_safe
from synthq.runtime.paths import recorded_path

CHECKPOINTS = "checkpoints"  # inside a partial artifact: what --resume continues from
DIAGNOSTICS = "diagnostics"


PUBLIC_READ_FIELDS = ("path", "name", "split", "public_by", "role")


def unique_public_reads(records: Sequence[dict]) -> list[dict]:
    """Public-split read records, each distinct one once, in order. Two records of one (dataset,
    split) that say different things are both kept: each is checked, so a record from another
    installation's manifest never stands in for this one's (the check fails closed on either)."""
    seen, kept = set(), []
    for record in records:
        trimmed = {k: record[k] for k in PUBLIC_READ_FIELDS if k in record}
        key = tuple(sorted((k, str(v)) for k, v in trimmed.items()))
        if key not in seen:
            seen.add(key)
            kept.append(trimmed)
    return kept


@dataclass
class ArtifactWriter:
    """Handed to a stage inside :func:`~synthq.artifacts.create.create_artifact`; the stage writes
    payload under ``dir`` and fills ``privacy``, ``metrics`` and ``timings``."""

    path: Path
    dir: Path
    stage: str
    config: dict
    inputs: list[dict]
    fingerprint: str
    metrics: dict = field(default_factory=dict)
    timings: dict = field(default_factory=dict)
    extra: dict = field(default_factory=dict)
    # Statistics computed from private data without noise (losses, batch sizes, timings of
    # private batches): ε = ∞. Written to ``diagnostics/metrics.json``, listed apart from the
    # payload, shown as private by ``synthq info`` and left out by ``synthq export``.
    diagnostics: dict = field(default_factory=dict)
    # True for stages whose run time depends on private data (DP training: the Poisson batch
    # sizes): their timings are diagnostics too.
    timings_are_private: bool = False
    # Sub-directories of ``dir`` that hold resumable state and are removed before finishing.
    scratch: list[str] = field(default_factory=lambda: [CHECKPOINTS])
    # False on the ranks other than 0 of a torchrun job, whose writer is thrown away
    # (synthq.artifacts.on_main): large saves may be skipped there.
    primary: bool = True
    # The privacy record (see the module's docstring of synthq.privacy.guarantee): every read of private
    # data behind this artifact, what it assumes, and whether the stage said where it stands.
    releases: list[dict] = field(default_factory=list)
    assumptions: list[str] = field(default_factory=list)
    own_release: dict | None = None
    accounted: bool = False
    # Reads of splits as public by what flowed in (their own records), checked again whenever the
    # artifact is used (synthq.bookkeeping.splits.retracted_reads).
    public_reads: list[dict] = field(default_factory=list)

    def __post_init__(self) -> None:
        # Paths recorded absolute and resolved, so that the ledger and the freshness checks are
        # right from any working directory (synthq.runtime.paths.recorded_path).
        self.inputs = [{**record, "path": recorded_path(record["path"])} for record in self.inputs]

    def inherit(self, source: Artifact) -> None:
        """``source``'s content flows into this artifact (post-processing, a starting model, a
        dataset that is an artifact): its releases (a foreign one's as one stand-in,
        :meth:`~synthq.artifacts.manifest.Artifact.vouched_releases`) and assumptions come along."""
        self.take_releases(source.vouched_releases())
        self.assume(*source.privacy.assumptions)
        self.take_public_reads(source.public_reads)

    def take_public_reads(self, records: Sequence[dict]) -> None:
        """Reads of public splits that flowed in with what this artifact read."""
        self.public_reads = unique_public_reads([*self.public_reads, *records])

    def take_releases(self, records: Sequence[dict]) -> None:
        """``records`` flow into this artifact, each id once (a release recorded again keeps its
        first record); only records this installation sealed, or a foreign artifact's stand-in."""
        known = {r["id"] for r in self.releases}
        for record in records:
            if record["id"] not in known:
                self.releases.append(record)
                known.add(record["id"])

    def assume(self, *assumptions: str | None) -> None:
        """Facts the guarantee relies on that synthq cannot check (printed beside every ε)."""
        self.assumptions = list(dict.fromkeys([*self.assumptions, *(a for a in assumptions if a)]))
        self.accounted = True

    def release(
        self,
        guarantee: Guarantee,
        data: dict,
        unit_ids: Sequence[str] = (),
        unit_kind: str = "query",
        units: dict | None = None,
        links: dict[str, list[str]] | None = None,
        texts: Sequence[str] | None = None,
    ) -> dict:
        """Record this artifact's own read of private data ``data`` (an input record): its
        guarantee (ε = ∞ for a read without DP) and the keyed set of the units it read
        (``unit_ids``, or ``units``: the record of a set another release already stored; a
        user-level release passes its ``links``, :func:`synthq.privacy.unit_sets.store_unit_set`;
        a query-level read passes the queries' ``texts``, in the order of ``unit_ids``, which
        link its queries by id and text, :func:`synthq.privacy.unit_sets.query_links`).

        The guarantee must be one synthq can recompute: a private ε with no mechanism parameters
        (σ, sampling rate, steps and a known accountant, or its parts'), an ε its parameters do
        not give, or a release labelled public is refused here, before it is sealed into a
        manifest (:func:`synthq.privacy.accounting.check_recorded_epsilon`, the check an
        unsealed manifest gets when it is opened)."""
        from synthq.privacy.accounting import check_recorded_epsilon
        from synthq.privacy.unit_sets import query_links, store_unit_set

        check_recorded_epsilon(guarantee, f"{self.stage}: the release about {data.get('name')}", sealed=False)

        if texts is not None:
            links = query_links(list(unit_ids), list(texts))
        if units is None:
            if unit_kind == "query" and not links:  # at least the query ids, as a user-level release
                links = {"query": list(unit_ids)}  # links them: what the ledger's dataset merge compares
            units = store_unit_set(unit_kind, list(unit_ids), also_in=self.dir / DIAGNOSTICS, links=links)
        record = {
            "id": secrets.token_hex(16),
            "stage": self.stage,
            "path": recorded_path(self.path),
            "data": {
                **{key: data.get(key) for key in ("name", "sha256", "kind")},
                **({"identity": data["identity"]} if data.get("identity") else {}),  # the ledger's grouping
            },
            "unit": guarantee.unit,
            "units": units,
            "guarantee": json_safe(guarantee.model_dump(mode="json")),
        }
        self.own_release = record
        self.releases.append(record)
        self.accounted = True
        return record

    def public(self) -> None:
        """Say that this artifact read no private data and inherits nothing (ε = 0)."""
        self.accounted = True

    @property
    def privacy(self) -> Guarantee:
        """The headline guarantee the recorded releases give (what the manifest will carry)."""
        from synthq.privacy.unit_sets import sharing_groups

        return compose_releases(self.releases, sharing_groups(self.releases), self.all_assumptions)

    @property
    def all_assumptions(self) -> list[str]:
        """What the artifact assumes: its own, then what composing its releases keeps apart on
        (:func:`synthq.privacy.unit_sets.link_assumptions`), each once."""
        from synthq.privacy.unit_sets import link_assumptions

        return list(dict.fromkeys([*self.assumptions, *link_assumptions(self.releases)]))

    @privacy.setter
    def privacy(self, guarantee: Guarantee) -> None:
        """Shorthand for stages outside synthq (and tests): a public guarantee states its
        assumptions; any other is recorded as this artifact's release of one unnamed private
        dataset with no unit set (so it composes with every other release, a bound)."""
        if guarantee.mechanism == "public":
            if guarantee.epsilon != 0 or guarantee.delta != 0:  # a public label on a private claim
                raise PrivacyError(
                    f"{self.stage}: a guarantee labelled public states ε = {guarantee.epsilon:g}, "
                    f"δ = {guarantee.delta:g}; public means ε = 0 and δ = 0 (Guarantee.public())"
                )
            self.assume(*guarantee.assumptions)
            return
        data = {"name": "unnamed private data", "sha256": "hmac:unnamed", "kind": "data"}
        self.release(guarantee, data, units={})

    @property
    def checkpoint_dir(self) -> Path:
        path = self.dir / CHECKPOINTS
        path.mkdir(exist_ok=True)
        return path

    @property
    def diagnostics_dir(self) -> Path:
        """Where private diagnostic files go (ε = ∞; never part of a release)."""
        path = self.dir / DIAGNOSTICS
        path.mkdir(exist_ok=True)
        return path

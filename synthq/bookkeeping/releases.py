"""The run-level privacy ledger: what a set of artifacts costs, per private dataset and unit.

Every manifest records the releases of private data behind it (its own and its inputs', copied when
it was written, sealed), so the ledger reads the *records*, never the paths that happen to be there
now: the releases of all the artifacts given, each counted once, composed per privacy unit
(:func:`synthq.privacy.guarantee.compose_releases`) — per private dataset and over everything.
Inputs whose content changed since they were read are reported as "changed since"; the record
still counts. ``synthq ledger DIR...`` and the end of ``synthq run`` print this. Where each input
came from is :mod:`synthq.bookkeeping.inputs`.
"""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path

from synthq.artifacts.freshness import input_location
from synthq.artifacts.manifest import MANIFEST, Artifact, is_artifact, merged_releases, open_artifact
from synthq.artifacts.records import current_input_hash
from synthq.privacy.accounting import MAX_DELTA
from synthq.privacy.digests import JUDGED_SET, is_keyed
from synthq.privacy.guarantee import Guarantee, compose_releases, release_guarantee
from synthq.privacy.unit_sets import (
    LINK_ASSUMPTIONS,
    SEPARATE_DATASETS,
    link_assumptions,
    meeting_datasets,
    sharing_groups,
)
from synthq.runtime.errors import ArtifactError

# How releases compose: per unit, on which releases' data share units (read from the data without
# noise: one bit per pair of releases), or as a plain sum that reads nothing of the data.
COMPOSE_MODES = ("units", "sum")
SUM_NOTE = (
    "composed as a plain sum of every release's ε (--compose sum): it reads nothing of the data, so "
    "it shows nothing of which releases share units, and bounds every unit of every dataset read; "
    "all datasets are one line"
)
SUM_KEY = "sum"


def composition_groups(releases: list[dict], compose: str = "units") -> list[list[str]]:
    """The groups :func:`compose_releases` sums over: releases whose data share units
    (:func:`sharing_groups`), or, with ``compose="sum"``, every release in one group."""
    if compose == "sum":
        return [[r["id"] for r in releases]] if releases else []
    return sharing_groups(releases)


def artifact_assumptions(artifact: Artifact, compose: str = "units") -> list[str]:
    """What an artifact's own headline assumes, less what only a per-unit composition rests on
    (:data:`~synthq.privacy.unit_sets.LINK_ASSUMPTIONS`) when the ledger sums."""
    own = artifact.privacy.assumptions
    return [a for a in own if a not in LINK_ASSUMPTIONS] if compose == "sum" else list(own)


def composition_assumptions(releases: list[dict], compose: str = "units") -> list[str]:
    """What a composition keeps apart on an assumption (:func:`link_assumptions`); a plain sum
    keeps nothing apart."""
    return [] if compose == "sum" else link_assumptions(releases)


class _Composition:
    """Releases composed as ``compose`` says: per unit (their sharing groups) or summed."""

    releases: list[dict]
    compose: str

    @property
    def groups(self) -> list[list[str]]:
        return composition_groups(self.releases, self.compose)

    def composed(self, assumptions: list[str] | None = None) -> Guarantee:
        """The composition, with ``assumptions`` before the composition's own."""
        every = [*(assumptions or []), *composition_assumptions(self.releases, self.compose)]
        return compose_releases(self.releases, self.groups, every)


@dataclass
class DatasetCost(_Composition):
    """What the releases in a ledger cost one private dataset."""

    name: str
    sha256: str
    releases: list[dict]
    compose: str = "units"

    @property
    def total(self) -> Guarantee:
        return self.composed()


@dataclass
class Ledger(_Composition):
    """The releases behind a set of artifacts, per private dataset, and what changed since."""

    artifacts: list[Artifact]
    releases: list[dict]
    datasets: dict[str, DatasetCost]
    changed: list[str]
    compose: str = "units"

    @property
    def total(self) -> Guarantee:
        """Everything composed per unit (across datasets: units are keyed by id, so ids that two
        datasets share are counted as one unit — a bound), or summed (``compose="sum"``)."""
        recorded = [a for artifact in self.artifacts for a in artifact_assumptions(artifact, self.compose)]
        return self.composed(recorded)


# What a plain sum does not check: re-digesting a private dataset to say it changed is a bit about
# the log as it is now (a deletion honoured, a query added), read without noise (round 5, flow 4).
SUM_UNCHECKED_NOTE = (
    "private datasets are not read again under --compose sum: whether they changed since is not checked"
)


def _is_private_record(record: dict) -> bool:
    """A read of private data, or of something computed from it: a keyed digest, or the document
    set a (private) split judges, which changes when one of its queries is deleted."""
    keyed = bool(record.get("private")) or is_keyed(record.get("sha256", ""))
    return keyed or record.get("kind") == JUDGED_SET


def _changed_since(artifact: Artifact, seen: set[str], read_private: bool = True) -> list[str]:
    """Inputs (followed through artifacts still in place) whose content no longer matches the
    identifier recorded when they were read; with ``read_private=False`` private datasets are
    left unread (``--compose sum``, which reads nothing of the data)."""
    if not artifact.verified:
        # its records name another machine's files, chosen by whoever sealed it: digesting what they
        # name here would answer their questions about this machine's data (review round 5)
        # (the ledger lists its assumption that the manifest is unedited)
        return []
    notes = []
    for record in artifact.inputs:
        if not read_private and _is_private_record(record):
            continue
        where = input_location(artifact, record)  # right from any working directory
        now = current_input_hash({**record, "path": str(where)})
        label = f"{record.get('stage') or record.get('kind')} {where}"
        if now != record["sha256"]:
            state = "is gone" if now is None else "changed since"
            notes.append(f"{label} {state} {artifact.path} read it (the recorded releases still count)")
            continue
        if record.get("kind") == "artifact" and str(where.resolve()) not in seen:
            seen.add(str(where.resolve()))
            notes += _changed_since(open_artifact(where), seen, read_private)
    return notes


def _dataset_key(release: dict) -> str:
    # the dataset's keyed identity (its query ids, synthq.privacy.digests), which an unrelated edit
    # of the directory does not change; older records by their directory digest
    return release["data"].get("identity") or release["data"]["sha256"]


def _merged_datasets(releases: list[dict]) -> dict[str, str]:
    """Dataset key -> the key of the dataset it is merged into: datasets whose releases hold a
    common query or the same people (:func:`synthq.privacy.unit_sets.meeting_datasets`: a whole
    sub-dataset layout and one of its parts, a log and its re-export under re-issued pseudonyms)
    are one dataset in the ledger, so no per-dataset total shows the max of two releases over one
    unit."""
    same = {}
    for group in meeting_datasets(releases, _dataset_key):
        same.update(dict.fromkeys(group, min(group)))
    return same


def ledger(paths: list[str | Path], compose: str = "units") -> Ledger:
    """The releases recorded by the artifacts at ``paths`` (each once), per private dataset,
    composed per unit or (``compose="sum"``) as a plain sum, datasets then kept by identity."""
    if compose not in COMPOSE_MODES:
        raise ValueError(f"compose must be one of {COMPOSE_MODES}, not {compose!r}")
    for path in paths:
        if not is_artifact(path):
            raise ArtifactError(f"{path}: not an artifact (no {MANIFEST})")
    from synthq.bookkeeping.inputs import artifact_input

    # an artifact resting on a read of a split no longer declared public is refused, not composed:
    # that read has no release to count (review round 5, flow 3)
    artifacts = [artifact_input(path) for path in paths]
    releases: list[dict] = []
    for artifact in sorted(artifacts, key=lambda a: not a.verified):  # this installation's records first
        releases = merged_releases(releases, artifact)
    datasets: dict[str, DatasetCost] = {}
    keys = map(_dataset_key, releases)
    same = _merged_datasets(releases) if compose == "units" else dict.fromkeys(keys, SUM_KEY)
    for release in releases:
        data = release["data"]
        key = same[_dataset_key(release)]
        cost = datasets.setdefault(key, DatasetCost(data.get("name") or "?", key, [], compose))
        if (data.get("name") or "?") not in cost.name.split(" + "):
            cost.name = f"{cost.name} + {data.get('name') or '?'}"
        cost.releases.append(release)
    seen: set[str] = set()
    read_private = compose != "sum"
    changed = list(dict.fromkeys(note for a in artifacts for note in _changed_since(a, seen, read_private)))
    return Ledger(artifacts, releases, datasets, changed, compose)


def recorded_units(releases: list[dict]) -> list[int]:
    """The unit counts n the releases' accountants assumed (``details.num_units``), sorted."""
    counts = {(r["guarantee"].get("details") or {}).get("num_units") for r in releases}
    return sorted(int(n) for n in counts if n)


def unrecorded_n_note(releases: list[dict]) -> str | None:
    """What the δ ≥ 1/n check cannot see: private releases with δ > 0 that record no n (made outside
    synthq's stages, or before n was recorded). Their data may hold more units than any recorded
    n, and then 1/n is smaller than the one checked; ``None`` when every such release records n."""
    guarantees = [(r, release_guarantee(r)) for r in releases]
    missing = [
        r for r, g in guarantees if g.is_private and g.delta and not (g.details or {}).get("num_units")
    ]
    if not missing:
        return None
    return (
        f"{len(missing)} release(s) with δ > 0 record no n: δ is checked against 1/n of the recorded "
        "n only; check it against the size of their data yourself"
    )


def delta_warning(total: Guarantee, units: list[int]) -> str | None:
    """Why a composed δ is no meaningful guarantee — at or above 1/n (the largest recorded n) or
    above :data:`MAX_DELTA`, as :func:`~synthq.privacy.accounting.validate_budget` refuses for one
    release — or ``None``."""
    if not total.is_private or not total.delta:
        return None
    if units and total.delta >= 1 / max(units):
        why = f"δ ≥ 1/n = 1/{max(units)}"
    elif total.delta > MAX_DELTA:
        why = f"δ > {MAX_DELTA:g}"
    else:
        return None
    return (
        f"not a meaningful guarantee ({why}: one unit's data could be published outright); "
        "do not sign; the total at δ = 1e-6 is the one to read"
    )


def ledger_assumptions(book: Ledger) -> list[str]:
    """What the ledger's totals and its split into lines rest on: the links' assumptions
    (:func:`composition_assumptions`), and, with several dataset lines composed per unit, that
    datasets on separate lines share no one (:data:`~synthq.privacy.unit_sets.SEPARATE_DATASETS`)."""
    found = composition_assumptions(book.releases, book.compose)
    if book.compose == "units" and len(book.datasets) > 1:
        found.append(SEPARATE_DATASETS)
    return found


def unchecked_public_reads(artifacts: list[Artifact]) -> list[str]:
    """Reads of public splits whose dataset is not where it was read (moved, or an exported
    copy's): whether the split is still declared public cannot be checked."""
    from synthq.bookkeeping.splits import public_reads_of

    notes = []
    for artifact in artifacts:
        for record, where in public_reads_of(artifact):
            if not where.is_dir():
                notes.append(
                    f"split {record['split']!r} of {where}, read as public behind {artifact.path}: the "
                    "dataset is not there, so whether the split is still declared public is not checked"
                )
    return list(dict.fromkeys(notes))


def ledger_lines(paths: list[str | Path], compose: str = "units") -> list[str]:
    """The ledger as text: one block per private dataset, the total, what changed since, then each
    assumption once, with the artifact that makes it (or how many do)."""
    book = ledger(paths, compose)
    lines = [SUM_NOTE] if compose == "sum" and book.datasets else []
    if not book.datasets:
        lines.append(
            "no artifact here read private data (only public data or post-processing of nothing private)"
        )
    for cost in book.datasets.values():
        total = cost.total
        how = "summed" if compose == "sum" else f"composed per {total.unit}"
        lines.append(
            f"private dataset {cost.name} (keyed id {cost.sha256.removeprefix('hmac:')[:12]}): "
            f"{total.describe()} over {len(cost.releases)} release(s), {how}"
        )
        warning = delta_warning(total, recorded_units(cost.releases))
        lines += [f"  WARNING: {warning}"] if warning else []
        lines += [f"  note: {note}"] if (note := unrecorded_n_note(cost.releases)) and not warning else []
        for release in cost.releases:
            own = release_guarantee(release)
            kind = "DP release" if own.is_private else "read WITHOUT DP"
            units = release.get("units") or {}
            lines.append(
                f"  - {release['stage']} {release['path']}: {kind}, {own.describe()}, "
                f"over its {units.get('kind', own.unit)} units"
            )
    if len(book.datasets) > 1:
        how = "summed" if compose == "sum" else "per unit"
        lines.append(f"all releases together, {how}: {book.total.describe()}")
    for note in book.changed:
        lines.append(f"changed since: {note}")
    if compose == "sum" and book.datasets:
        lines.append(f"not checked: {SUM_UNCHECKED_NOTE}")
    lines += [f"not checked: {note}" for note in unchecked_public_reads(book.artifacts)]
    holders: dict[str, list[str]] = {}  # each assumption once, with the artifacts that make it
    for artifact in book.artifacts:
        for assumption in artifact_assumptions(artifact, compose):
            holders.setdefault(assumption, []).append(str(artifact.path))
    for linking in ledger_assumptions(book):  # what the totals and the lines rest on
        holders.setdefault(linking, []).append("the composed totals")
    if holders:
        lines.append("assumptions:")
        for assumption, paths_making_it in holders.items():
            where = paths_making_it[0] if len(paths_making_it) == 1 else f"{len(paths_making_it)} artifacts"
            lines.append(f"  - {assumption} ({where})")
    return lines


def dataset_totals(paths: list[str | Path]) -> dict[str, float]:
    """Total ε per private dataset name (``inf`` where something read it without DP); two datasets
    of one name are told apart by their keyed ids."""
    costs = list(ledger(paths).datasets.values())
    names = [cost.name for cost in costs]

    def label(cost: DatasetCost) -> str:
        keyed = cost.sha256.removeprefix("hmac:")[:12]
        return cost.name if names.count(cost.name) == 1 else f"{cost.name} ({keyed})"

    return {label(cost): cost.total.epsilon for cost in costs}

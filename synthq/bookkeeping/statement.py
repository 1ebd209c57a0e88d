"""The privacy statement a reviewer signs: one page of Markdown about the releases behind a set of
artifacts, rendered from a :class:`~synthq.bookkeeping.releases.Ledger`.

``synthq ledger DIR... --statement [--out FILE]`` writes it. Every number is recomputed from the
sealed release records (``artifact.releases``, which :func:`~synthq.artifacts.manifest.open_artifact`
has already checked against their mechanism parameters), never read from a printed line or a
config. Per private dataset it states:

* the data (name, keyed identity as the ledger prints it) and the privacy unit; at the user unit,
  the bound K and what one query gets (:func:`synthq.privacy.accounting.per_query`, derived again);
* the adjacency the accountants assume (add/remove one unit; a replacement is two steps);
* each release's sampling, q, steps, σ, clip norm, sensitivity (noise std) and n *as its record
  stores them* ("not recorded" where it stores nothing: the sampler is not recorded, the
  subsampled-Gaussian accountant's model — Poisson — is what is stated; "—" where the mechanism
  has no such parameter); the tables are :mod:`synthq.bookkeeping.statement_tables`;
* ε at the run's δ, composed exactly as the ledger composes (:func:`compose_releases` over
  :func:`~synthq.privacy.unit_sets.sharing_groups`), and the same composition with every release's ε
  recomputed by its own accountant (:func:`~synthq.privacy.accounting.epsilon_for`) at δ = 1e-6 and
  at δ = 1/n² (n: the unit count the release's accountant assumed, ``details.num_units``; skipped
  when a δ-dependent release records none); a composed total whose δ is at or above 1/n, or above
  0.1, is refused — its line states no ε (:func:`~synthq.bookkeeping.releases.delta_warning`) — and a
  statement in which every total is refused is not written at all;
* the Gaussian-DP μ, only where it is exact: ``√T/σ`` for the Gaussian without subsampling
  (Private Evolution's votes, q = 1), composed as ``√(Σ μ²)`` per unit when every release has one;
  for a subsampled release "not stated" (the CLT approximation is no guarantee).

Across datasets: the total at the run's δ, 1e-6 and 1/n², and a warning when two datasets share a
name under different keyed ids. Then every assumption, once; a canary audit's empirical lower
bounds when a ``canary-audit`` artifact is given (evidence about the recipe, not a release: its
own read without noise is listed as not released and is not composed; those numbers are computed
from the private data without noise, so a statement that shows them is ε = ∞ itself, and says so
at the top); what was *not* released (reads without DP, every private ``diagnostics/`` file, each
once); what changed since; and a blank signature block.
"""

from __future__ import annotations

import datetime as _dt
import json
from pathlib import Path

from synthq.artifacts.manifest import MANIFEST, Artifact, is_artifact, open_artifact
from synthq.bookkeeping.reaccounting import (
    NOT_RECORDED,
    REFERENCE_DELTA,
    DatasetStatement,
    ReleaseRow,
    composed_at,
    dataset_statement,
    unit_count,
)
from synthq.bookkeeping.releases import (
    SUM_NOTE,
    SUM_UNCHECKED_NOTE,
    Ledger,
    artifact_assumptions,
    delta_warning,
    ledger,
    ledger_assumptions,
    recorded_units,
    unrecorded_n_note,
)
from synthq.bookkeeping.statement_tables import (
    audit_lines,
    claim,
    eps,
    prv_comparisons,
    recomputed_table,
    release_table,
)
from synthq.privacy.guarantee import UNIT_NOTES, Guarantee, release_guarantee
from synthq.runtime.errors import ArtifactError, PrivacyError

AUDIT_STAGE = "canary-audit"


# ---------------------------------------------------------------------------------------------
# Rendering


def _unit_lines(statement: DatasetStatement) -> list[str]:
    kinds = list(dict.fromkeys(row.guarantee.unit for row in statement.rows))
    notes = [UNIT_NOTES.get(kind, kind).removeprefix("privacy unit: ") for kind in kinds]
    lines = [f"- **Privacy unit**: {'; '.join(notes)}."]
    for row in statement.rows:
        if row.guarantee.unit != "user":
            continue
        bound = (row.guarantee.details or {}).get("max_queries_per_user")
        cap = f"K = {bound} queries per user" if bound else f"K (queries per user): {NOT_RECORDED}"
        if not row.guarantee.is_private:
            lines.append(
                f"  - {row.label}: user level, {cap}; read without DP (ε = ∞ per user and per query)."
            )
            continue
        if row.per_query is None:
            single = "no per-query guarantee derivable from the record: ε = ∞ per query"
        else:
            derived = row.per_query
            single = (
                f"for a single query ε = {eps(derived['epsilon'])} at δ = {derived['delta']:.2e} "
                f"(rule `{derived['rule']}`: {derived['note']})"
            )
        lines.append(
            f"  - {row.label}: user level, {cap}; {claim(row.guarantee)} per user; {single}. Removing one "
            "query of a user is a replacement of the user's contribution, not the removal of a unit."
        )
    if len(kinds) > 1:
        lines.append(
            f"  - Releases of different units compose only at the weakest, {statement.total.unit}: each "
            "user-level release counts at its per-query ε."
        )
    return lines


def _adjacency(statement: DatasetStatement) -> str:
    accountants = {row.guarantee.accountant for row in statement.rows if row.guarantee.is_private}
    parts = [
        "- **Adjacency**: add/remove one unit (neighbouring datasets differ by the presence of one whole "
        "unit); each mechanism's sensitivity bounds the change when one unit is added or removed."
    ]
    if "rdp" in accountants:
        parts.append(
            "RDP (Opacus; Mironov, Talwar & Zhang 2019): the sampled-Gaussian bound holds for adding and "
            "for removing a unit."
        )
    if "prv" in accountants:
        parts.append(
            "PRV (Opacus; Gopi, Lee & Wutschitz 2021) evaluates the privacy loss of one ordering of the pair "
            "((1−q)·N(0,σ²) + q·N(1,σ²), N(0,σ²)); synthq does not check the other ordering separately, "
            "so each PRV release's RDP ε (both directions) is given below for comparison."
        )
    if "pure-composition" in accountants:
        parts.append(
            "Report-noisy-max: the utility moves by at most 1 when one dev query is added or removed."
        )
    parts.append(
        "Replacing one unit by another is two such steps: covered only at (2ε, (1 + e^ε)·δ) by group privacy."
    )
    return " ".join(parts)


def _dataset_section(statement: DatasetStatement) -> list[str]:
    cost = statement.cost
    keyed = cost.sha256.removeprefix("hmac:")[:12]
    lines = [f"## Private dataset {cost.name} (keyed id {keyed})", ""]
    lines += _unit_lines(statement)
    lines.append(_adjacency(statement))
    if statement.units:
        n_line = ", ".join(str(n) for n in statement.units)
        lines.append(f"- **n** (units the accountants assumed, as recorded): {n_line}.")
    else:
        lines.append(f"- **n** (units the accountants assumed): {NOT_RECORDED} by any release.")
    if note := unrecorded_n_note(cost.releases):
        lines.append(f"- **δ against 1/n**: {note}.")
    how = (
        "summed, as `synthq ledger --compose sum` sums them"
        if cost.compose == "sum"
        else ("composed per unit exactly as `synthq ledger` composes them")
    )
    lines += ["", f"Releases (as recorded; {how}):", ""]
    lines += release_table(statement)
    lines += [""] + recomputed_table(statement)
    prv = prv_comparisons(statement)
    lines += ["", *prv] if prv else []
    total = statement.total
    lines += [
        "",
        f"**Composed total** ({len(statement.rows)} release(s), per {total.unit}, basic composition "
        + ("of every release, summed):" if cost.compose == "sum" else "per unit):"),
        "",
    ]
    lines += _total_lines(total, statement.at_reference, statement.at_n_squared, statement.units)
    lines.append(f"- Gaussian-DP μ (√(Σ μ²) per unit): {statement.mu if statement.mu else 'not available'}")
    if not total.is_private and total.note:
        lines.append(f"- why ∞: {total.note}")
    return lines + [""]


def _flagged(guarantee: Guarantee | None, units: list[int]) -> str:
    """The guarantee as stated; where its δ makes it meaningless (at or above 1/n, or above 0.1) it
    is *refused*: the line says why and states no ε, so none can be signed."""
    warning = delta_warning(guarantee, units) if guarantee is not None else None
    if warning:
        return f"**refused, no ε stated (δ = {guarantee.delta:.3g}) — {warning}**"
    return claim(guarantee)


def refuse_without_a_meaningful_total(text: str) -> None:
    """Refuse a statement in which every composed total was refused (:func:`_flagged`): it would
    state nothing a reader could sign."""
    prefixes = ("- at the run's δ:", "- every release at δ")
    totals = [line for line in text.splitlines() if line.startswith(prefixes)]
    if totals and all("refused, no ε stated" in line for line in totals):
        raise PrivacyError(
            "no composed total in this statement is a meaningful guarantee (every δ is at or above 1/n "
            "or above 0.1): train with a smaller --delta, or on more privacy units"
        )


def _total_lines(
    total: Guarantee, at_reference: Guarantee | None, at_n_squared: Guarantee | None, units: list[int]
) -> list[str]:
    """A composed total at the run's δ, at 1e-6 and at 1/n² (each flagged when meaningless)."""
    lines = [
        f"- at the run's δ: {_flagged(total, units)}",
        f"- every release at δ = {REFERENCE_DELTA:g}: {_flagged(at_reference, units)}",
    ]
    if at_n_squared is not None:
        lines.append(f"- every release at δ = 1/n² (its own n): {_flagged(at_n_squared, units)}")
    else:
        lines.append(f"- at δ = 1/n²: skipped (n {NOT_RECORDED} for a release whose ε depends on δ)")
    return lines


def _across_datasets(book: Ledger) -> list[str]:
    """Every dataset together, per unit, at the run's δ, 1e-6 and 1/n²; and the datasets that
    share a name under different keyed ids."""
    if len(book.datasets) < 2:
        return []
    groups = book.groups
    at_reference = composed_at(book.releases, groups, lambda g: REFERENCE_DELTA)
    at_n = composed_at(book.releases, groups, lambda g: 1 / unit_count(g) ** 2 if unit_count(g) else None)
    lines = ["**All datasets together, per unit:**", ""]
    lines += _total_lines(book.total, at_reference, at_n, recorded_units(book.releases))
    return lines + [""] + _same_name_lines(book)


def _same_name_lines(book: Ledger) -> list[str]:
    keyed: dict[str, list[str]] = {}
    for cost in book.datasets.values():
        keyed.setdefault(cost.name, []).append(cost.sha256.removeprefix("hmac:")[:12])
    lines = [
        f"**Same name, different keyed ids**: {name} ({', '.join(ids)}) may be the same data read under "
        "another key: then their releases compose."
        for name, ids in keyed.items()
        if len(ids) > 1
    ]
    return [*lines, ""] if lines else []


def _private_files(path: Path) -> list[str]:
    try:
        manifest = json.loads((path / MANIFEST).read_text(encoding="utf-8"))
    except (OSError, ValueError):
        return []
    return sorted(manifest.get("private_files") or {})


def _places(book: Ledger, audits: list[Artifact]) -> list[Path]:
    """Every artifact directory given or recorded, each once (resolved: a relative and an absolute
    path to one directory are one place)."""
    paths = [*(a.path for a in [*book.artifacts, *audits]), *(r["path"] for r in book.releases)]
    return list(dict.fromkeys(Path(path).resolve() for path in paths))


def _not_released(book: Ledger, audits: list[Artifact], rows: list[ReleaseRow]) -> list[str]:
    lines = ["## Not private, not released", ""]
    for row in rows:
        if not row.guarantee.is_private:
            note = f" ({row.guarantee.note})" if row.guarantee.note else ""
            lines.append(
                f"- {row.label} {row.release['stage']} `{row.release['path']}`: read WITHOUT DP, "
                f"ε = ∞{note}; not private: not released; do not share anything computed from it."
            )
    for audit in audits:
        lines.append(
            f"- canary-audit `{audit.path}`: reads the private data and the canary coins without noise "
            "(ε = ∞): evidence for this review, not composed above; not released; do not share."
        )
    for place in _places(book, audits):
        for name in _private_files(place):
            lines.append(f"- `{place / name}`: private diagnostic (ε = ∞): not released; do not share.")
    if len(lines) == 2:
        lines.append("- nothing: every release above is DP and no artifact keeps private diagnostics.")
    return lines + [""]


def _assumption_lines(book: Ledger, audits: list[Artifact]) -> list[str]:
    holders: dict[str, list[str]] = {}
    for artifact in book.artifacts:
        for assumption in artifact_assumptions(artifact, book.compose):
            holders.setdefault(assumption, []).append(str(artifact.path))
    for release in book.releases:
        for assumption in release_guarantee(release).assumptions:
            holders.setdefault(assumption, []).append(release["path"])
    for linking in ledger_assumptions(book):  # what the totals and the lines rest on
        holders.setdefault(linking, []).append("the composed totals")
    lines = ["## Assumptions (what the guarantees rely on that synthq cannot check)", ""]
    for assumption, where in holders.items():
        where = list(dict.fromkeys(where))
        lines.append(f"- {assumption} ({where[0] if len(where) == 1 else f'{len(where)} artifacts'})")
    if not holders:
        lines.append("- none recorded")
    return lines + [""]


SIGNATURE = [
    "## Review",
    "",
    "Reviewed by: ______________________________",
    "",
    "Date: ______________________________",
    "",
    "Decision (approve / approve with conditions / reject): ______________________________",
    "",
    "Conditions: ______________________________",
]


def _audit_warning(audits: list[Artifact]) -> list[str]:
    if not audits:
        return []
    return [
        "**This statement contains canary-audit results computed from the private data without noise "
        "(ε = ∞): keep it within the review; generate it without the audit artifact for anything "
        "shared.**",
        "",
    ]


def _nothing_private(book: Ledger, audits: list[Artifact]) -> list[str]:
    """What to say when no release read private data (a canary audit still may have)."""
    if book.datasets:
        return []
    if audits:
        return [
            "No release here read private data; the canary audit did: it read the private data "
            "without noise (ε = ∞) and is not a release (evidence for this review only).",
            "",
        ]
    return ["No artifact here read private data (public data, or post-processing of nothing private).", ""]


def render_statement(book: Ledger, audits: list[Artifact] = ()) -> str:
    """The statement (Markdown) for a ledger and the canary-audit artifacts given beside it."""
    from synthq._version import __version__

    audits = list(audits)
    today = _dt.datetime.now(_dt.timezone.utc).date().isoformat()
    lines = [
        "# Privacy statement",
        "",
        *_audit_warning(audits),
        f"Written by synthq {__version__} on {today} from the sealed release records of: "
        + (", ".join(f"`{a.path}` ({a.stage})" for a in book.artifacts) or "no release artifact")
        + (f"; canary-audit evidence: {', '.join(f'`{a.path}`' for a in audits)}" if audits else "")
        + ". Every number is recomputed from those records (ε by Opacus' accountants); none is copied "
        "from a log or a config.",
        "",
        *([f"**Composition**: {SUM_NOTE}.", ""] if book.compose == "sum" else []),
    ]
    for artifact in [*book.artifacts, *audits]:
        if not artifact.verified:
            lines += [f"**Seal not verifiable**: {artifact.unverified_reason} ({artifact.path}).", ""]
    lines += _nothing_private(book, audits)
    statements, start = [], 1
    for cost in book.datasets.values():
        statements.append(dataset_statement(cost, start))
        start += len(cost.releases)
    for statement in statements:
        lines += _dataset_section(statement)
    lines += _across_datasets(book)
    lines += _assumption_lines(book, audits)
    lines += audit_lines(audits)
    lines += _not_released(book, audits, [row for s in statements for row in s.rows])
    unchecked = [f"- Not checked: {SUM_UNCHECKED_NOTE}."] if book.compose == "sum" and book.datasets else []
    if book.changed or unchecked:
        lines += ["## Changed since (the recorded releases still count)", ""]
        lines += [f"- {note}" for note in book.changed] + unchecked + [""]
    return "\n".join(lines + SIGNATURE) + "\n"


def statement_for(paths: list[str | Path], compose: str = "units") -> str:
    """The statement for the artifacts at ``paths``: ``canary-audit`` artifacts are evidence, the
    rest are the releases (composed by :func:`synthq.bookkeeping.releases.ledger`)."""
    for path in paths:
        if not is_artifact(path):
            raise ArtifactError(f"{path}: not an artifact (no {MANIFEST})")
    audits = [a for a in (open_artifact(p) for p in paths) if a.stage == AUDIT_STAGE]
    audited = {str(a.path) for a in audits}
    text = render_statement(ledger([p for p in paths if str(Path(p)) not in audited], compose), audits)
    refuse_without_a_meaningful_total(text)
    return text

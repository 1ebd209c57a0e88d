"""The privacy statement a reviewer signs: one page of Markdown about the releases behind a set of
artifacts, rendered from a :class:`~synthq.privacy.ledger.Ledger`.

``synthq ledger DIR... --statement [--out FILE]`` writes it. Every number is recomputed from the
sealed release records (``artifact.releases``, which :func:`~synthq.artifacts.manifest.open_artifact`
has already checked against their mechanism parameters), never read from a printed line or a
config. Per private dataset it states:

* the data (name, keyed identity as the ledger prints it) and the privacy unit; at the user unit,
  the bound K and what one query gets (:func:`synthq.privacy.accounting.per_query`, derived again);
* the adjacency the accountants assume (add/remove one unit; a replacement is two steps);
* each release's sampling, q, steps, σ, clip norm and n *as its record stores them* ("not
  recorded" where it stores nothing: the sampler is not recorded, the subsampled-Gaussian
  accountant's model — Poisson — is what is stated);
* ε at the run's δ, composed exactly as the ledger composes (:func:`compose_releases` over
  :func:`~synthq.privacy.units.sharing_groups`), and the same composition with every release's ε
  recomputed by its own accountant (:func:`~synthq.privacy.accounting.epsilon_for`) at δ = 1e-6 and
  at δ = 1/n² (n: the unit count the release's accountant assumed, ``details.num_units``; skipped
  when a δ-dependent release records none);
* the Gaussian-DP μ: exact ``√T/σ`` for the Gaussian without subsampling (Private Evolution's votes,
  q = 1), Opacus' CLT approximation ``q·√(T·(e^{1/σ²} − 1))`` for Poisson subsampling
  (:func:`opacus.accountants.analysis.gdp.compute_mu_poisson`), composed as ``√(Σ μ²)`` per unit;
* every assumption, once; a canary audit's empirical lower bounds when a ``canary-audit``
  artifact is given (evidence about the recipe, not a release: its own read without noise is
  listed as not released and is not composed); what was *not* released (reads without DP, every
  private ``diagnostics/`` file); what changed since; and a blank signature block.
"""

from __future__ import annotations

import datetime as _dt
import json
import math
from pathlib import Path

from synthq.artifacts.manifest import MANIFEST, Artifact, is_artifact, open_artifact
from synthq.privacy.accounting import ACCOUNTANTS
from synthq.privacy.guarantee import (
    UNIT_NOTES,
    Guarantee,
    release_guarantee,
)
from synthq.privacy.ledger import Ledger, ledger
from synthq.privacy.reaccounting import (
    GAUSSIAN,
    NOT_RECORDED,
    REFERENCE_DELTA,
    DatasetStatement,
    ReleaseRow,
    cached_epsilon_for,
    dataset_statement,
)
from synthq.runtime.errors import ArtifactError

AUDIT_STAGE = "canary-audit"


# ---------------------------------------------------------------------------------------------
# Rendering


def _eps(value: float) -> str:
    return "∞" if math.isinf(value) else f"{value:.3f}" if value < 1000 else f"{value:.0f}"


def _claim(guarantee: Guarantee | None) -> str:
    """``ε = 8.003 at δ = 1.00e-05`` (``ε = ∞``)."""
    if guarantee is None:
        return "not available"
    if not guarantee.is_private:
        return "ε = ∞"
    return f"ε = {_eps(guarantee.epsilon)} at δ = {guarantee.delta:.2e}"


def _short(value) -> str:
    return f"{float(value):.4g}"


def _value(details: dict, key: str, shown=None) -> str:
    value = details.get(key)
    if value is None:
        return NOT_RECORDED
    return shown(value) if shown else str(value)


def _sampling(guarantee: Guarantee) -> str:
    details = guarantee.details or {}
    if not guarantee.is_private:
        return "none (read without DP)"
    if guarantee.mechanism == "report-noisy-max":
        return f"none: report-noisy-max, {_value(details, 'selections')} selection(s)"
    if "sample_rate" not in details:
        return NOT_RECORDED
    if float(details["sample_rate"]) == 1.0:
        return "none: every unit in every step (q = 1)"
    cap = details.get("max_batch_size")
    capped = f"; batch cap {cap} (an over-full batch becomes empty)" if cap else ""
    return f"Poisson (the accountant's model; the sampler is not recorded){capped}"


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
                f"for a single query ε = {_eps(derived['epsilon'])} at δ = {derived['delta']:.2e} "
                f"(rule `{derived['rule']}`: {derived['note']})"
            )
        lines.append(
            f"  - {row.label}: user level, {cap}; {_claim(row.guarantee)} per user; {single}. Removing one "
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


def _cell(text: str) -> str:
    return str(text).replace("|", "\\|").replace("\n", " ")


def _release_table(statement: DatasetStatement) -> list[str]:
    lines = [
        "| # | stage | artifact | mechanism | accountant | sampling | q | steps | σ | clip norm "
        "| ε at its δ |",
        "|---|---|---|---|---|---|---|---|---|---|---|",
    ]
    for row in statement.rows:
        g, details = row.guarantee, row.guarantee.details or {}
        kind = "" if g.is_private else " — read WITHOUT DP"
        if not g.is_private:
            claim = "ε = ∞"
        elif row.recomputed:
            claim = f"ε = {_eps(row.epsilon)} at δ = {g.delta:.2e}"
        else:
            claim = f"{_claim(g)} (recorded; no parameters to recompute it from)"
        cells = [
            row.label, row.release["stage"], f"`{row.release['path']}`", g.mechanism + kind,
            g.accountant or "—", _sampling(g), _value(details, "sample_rate", _short),
            _value(details, "steps"), _value(details, "noise_multiplier", _short),
            _value(details, "clip_norm"), claim,
        ]  # fmt: skip
        if not g.is_private:
            cells[6:10] = ["—"] * 4
        lines.append("| " + " | ".join(_cell(c) for c in cells) + " |")
    return lines


def _recomputed_table(statement: DatasetStatement) -> list[str]:
    lines = [
        f"| # | ε at δ = {REFERENCE_DELTA:g} | n (units the accountant assumed) | ε at δ = 1/n² "
        "| Gaussian-DP μ |",
        "|---|---|---|---|---|",
    ]
    for row in statement.rows:
        needs_n = row.guarantee.is_private and row.guarantee.accountant in ACCOUNTANTS
        n = str(row.n) if row.n else (NOT_RECORDED if needs_n else "—")
        at_n = _claim(row.at_n_squared) if (row.n or not needs_n) else f"skipped (n {NOT_RECORDED})"
        mu = str(row.mu) if row.mu is not None else "not available (not a Gaussian mechanism)"
        lines.append(f"| {row.label} | {_claim(row.at_reference)} | {n} | {at_n} | {mu} |")
    return lines


def _prv_comparisons(statement: DatasetStatement) -> list[str]:
    lines = []
    for row in statement.rows:
        g, details = row.guarantee, row.guarantee.details or {}
        if g.accountant == "prv" and g.is_private and all(key in details for key in GAUSSIAN):
            delta = float(details.get("accountant_delta", g.delta))
            rdp = cached_epsilon_for(
                float(details["noise_multiplier"]),
                delta,
                float(details["sample_rate"]),
                int(details["steps"]),
                "rdp",
            ).epsilon
            lines.append(f"- {row.label} (PRV): RDP gives ε = {_eps(rdp)} at the same δ = {delta:.2e}.")
    return lines


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
    lines += ["", "Releases (as recorded; composed per unit exactly as `synthq ledger` composes them):", ""]
    lines += _release_table(statement)
    lines += [""] + _recomputed_table(statement)
    prv = _prv_comparisons(statement)
    lines += ["", *prv] if prv else []
    total = statement.total
    lines += [
        "",
        f"**Composed total** ({len(statement.rows)} release(s), per {total.unit}, basic composition "
        "per unit):",
        "",
        f"- at the run's δ: {_claim(total)}",
        f"- every release at δ = {REFERENCE_DELTA:g}: {_claim(statement.at_reference)}",
    ]
    if statement.at_n_squared is not None:
        lines.append(f"- every release at δ = 1/n² (its own n): {_claim(statement.at_n_squared)}")
    else:
        lines.append(f"- at δ = 1/n²: skipped (n {NOT_RECORDED} for a release whose ε depends on δ)")
    lines.append(f"- Gaussian-DP μ (√(Σ μ²) per unit): {statement.mu if statement.mu else 'not available'}")
    if not total.is_private and total.note:
        lines.append(f"- why ∞: {total.note}")
    return lines + [""]


def _audit_lines(audits: list[Artifact]) -> list[str]:
    if not audits:
        return []
    lines = [
        "## Empirical audit (lower bounds)",
        "",
        "A canary audit of the **same recipe** (generators fine-tuned by the real `finetune-lm` at each "
        "audited ε), **not of this very generator**: an empirical lower bound below the proven ε is "
        "consistent with the guarantee; it does not prove it.",
        "",
    ]
    for audit in audits:
        config = audit.config
        delta = NOT_RECORDED
        report = audit.path / "audit.json"
        if report.is_file() and "audit.json" in audit.manifest.get("files", {}):
            delta = f"{float(json.loads(report.read_text(encoding='utf-8'))['delta']):.2e}"
        lines.append(
            f"`{audit.path}`: data {config.get('data')}, model {config.get('model')}, unit "
            f"{config.get('privacy_unit', 'query')}, method {config.get('method')}, confidence "
            f"{config.get('confidence')}, δ = {delta}."
        )
        lines += [
            "",
            "| audited | proven ε | empirical ε lower bound | GDP ε lower bound | AUROC |",
            "|---|---|---|---|---|",
        ]
        for key, values in audit.metrics.items():
            if not key.startswith(("one-run/", "exposure/")) or not isinstance(values, dict):
                continue
            what, proven = key.rsplit("/eps=", 1) if "/eps=" in key else (key, "?")
            if key.startswith("exposure/"):
                what, proven = (
                    "exposure " + key.split("/rep=")[-1] + " repetitions",
                    key.split("eps=")[1].split("/")[0],
                )
            bound = values.get("epsilon_lower_bound", values.get("pair_epsilon_lower_bound"))
            flag = ""
            try:
                proven_value = math.inf if proven in ("∞", "inf") else float(proven)
                if bound is not None and float(bound) > proven_value:
                    flag = " **exceeds the proven ε: do not sign**"
            except ValueError:
                pass
            shown = [
                what.removeprefix("one-run/"), proven, _num(bound) + flag,
                _num(values.get("gdp_epsilon_lower_bound")), _num(values.get("auroc")),
            ]  # fmt: skip
            lines.append("| " + " | ".join(_cell(c) for c in shown) + " |")
        lines.append("")
    return lines


def _num(value) -> str:
    if value is None:
        return "—"
    value = float(value)
    return "∞" if math.isinf(value) else f"{value:.3f}"


def _private_files(path: Path) -> list[str]:
    try:
        manifest = json.loads((path / MANIFEST).read_text(encoding="utf-8"))
    except (OSError, ValueError):
        return []
    return sorted(manifest.get("private_files") or {})


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
    places = list(
        dict.fromkeys(
            [*(str(a.path) for a in [*book.artifacts, *audits]), *(r["path"] for r in book.releases)]
        )
    )
    for place in places:
        for name in _private_files(Path(place)):
            lines.append(f"- `{Path(place) / name}`: private diagnostic (ε = ∞): not released; do not share.")
    if len(lines) == 2:
        lines.append("- nothing: every release above is DP and no artifact keeps private diagnostics.")
    return lines + [""]


def _assumption_lines(book: Ledger, audits: list[Artifact]) -> list[str]:
    holders: dict[str, list[str]] = {}
    for artifact in book.artifacts:
        for assumption in artifact.privacy.assumptions:
            holders.setdefault(assumption, []).append(str(artifact.path))
    for release in book.releases:
        for assumption in release_guarantee(release).assumptions:
            holders.setdefault(assumption, []).append(release["path"])
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


def render_statement(book: Ledger, audits: list[Artifact] = ()) -> str:
    """The statement (Markdown) for a ledger and the canary-audit artifacts given beside it."""
    from synthq import __version__

    audits = list(audits)
    today = _dt.datetime.now(_dt.timezone.utc).date().isoformat()
    lines = [
        "# Privacy statement",
        "",
        f"Written by synthq {__version__} on {today} from the sealed release records of: "
        + (", ".join(f"`{a.path}` ({a.stage})" for a in book.artifacts) or "no release artifact")
        + (f"; canary-audit evidence: {', '.join(f'`{a.path}`' for a in audits)}" if audits else "")
        + ". Every number is recomputed from those records (ε by Opacus' accountants); none is copied "
        "from a log or a config.",
        "",
    ]
    for artifact in [*book.artifacts, *audits]:
        if not artifact.verified:
            lines += [f"**Seal not verifiable**: {artifact.unverified_reason} ({artifact.path}).", ""]
    if not book.datasets:
        lines += [
            "No artifact here read private data (public data, or post-processing of nothing private).",
            "",
        ]
    statements, start = [], 1
    for cost in book.datasets.values():
        statements.append(dataset_statement(cost, start))
        start += len(cost.releases)
    for statement in statements:
        lines += _dataset_section(statement)
    if len(book.datasets) > 1:
        lines += [f"**All datasets together, per unit**: {_claim(book.total)}.", ""]
    lines += _assumption_lines(book, audits)
    lines += _audit_lines(audits)
    lines += _not_released(book, audits, [row for s in statements for row in s.rows])
    if book.changed:
        lines += ["## Changed since (the recorded releases still count)", ""]
        lines += [f"- {note}" for note in book.changed] + [""]
    return "\n".join(lines + SIGNATURE) + "\n"


def statement_for(paths: list[str | Path]) -> str:
    """The statement for the artifacts at ``paths``: ``canary-audit`` artifacts are evidence, the
    rest are the releases (composed by :func:`synthq.privacy.ledger.ledger`)."""
    for path in paths:
        if not is_artifact(path):
            raise ArtifactError(f"{path}: not an artifact (no {MANIFEST})")
    audits = [a for a in (open_artifact(p) for p in paths) if a.stage == AUDIT_STAGE]
    audited = {str(a.path) for a in audits}
    return render_statement(ledger([p for p in paths if str(Path(p)) not in audited]), audits)

"""The privacy statement a reviewer signs: every number recomputed from the sealed release records
(ε at the run's δ as the ledger composes it, at δ = 1e-6 and 1/n² by an independent accountant,
μ by its closed form), reads without DP and private diagnostics listed as not released, a canary
audit as evidence, and the CLI's --out."""

from __future__ import annotations

import json
import math

import pytest
from opacus.accountants import PRVAccountant, RDPAccountant

from synthq.artifacts.create import create_artifact
from synthq.bookkeeping.reaccounting import dataset_statement
from synthq.bookkeeping.releases import dataset_totals, ledger, ledger_lines
from synthq.bookkeeping.statement import statement_for
from synthq.bookkeeping.statement_tables import claim, eps
from synthq.privacy.accounting import epsilon_for, per_query
from synthq.privacy.guarantee import Guarantee
from synthq.reporting.eval_files import PER_QUERY_FILE, SELECTION_FILE
from synthq.runtime.errors import PrivacyError
from synthq.stages import train_retriever
from tests.helpers import accounted, one_line, retriever_config, run_main

DELTA = 1e-5
NOT_STATED = "not stated: the CLT approximation for the subsampled Gaussian is not a guarantee"
N = 300  # the units the accountant assumed (recorded as details.num_units, as PrivacyPlan does)


def gaussian(sigma: float, rate: float, steps: int, accountant: str = "rdp", **details) -> Guarantee:
    """A DP-SGD release whose ε its recorded parameters reproduce when the artifact is opened."""
    return Guarantee(
        epsilon=epsilon_for(sigma, DELTA, rate, steps, accountant).epsilon, delta=DELTA, unit="query",
        mechanism="dp-adam", accountant=accountant,
        details={"noise_multiplier": sigma, "sample_rate": rate, "steps": steps, "accountant_delta": DELTA,
                 "num_units": N, "clip_norm": 1.0, "max_batch_size": None, **details},
    )  # fmt: skip


def independent(sigma: float, rate: float, steps: int, delta: float, accountant: str = "rdp") -> float:
    """Opacus' accountant, called directly (not through synthq)."""
    acc = RDPAccountant() if accountant == "rdp" else PRVAccountant()
    acc.history = [(sigma, rate, steps)]
    return float(acc.get_epsilon(delta=delta))


def release(out, data: dict, guarantee: Guarantee, units: list[str], stage: str = "train-retriever", **kw):
    with create_artifact(out, stage, {"out": str(out)}, inputs=[data]) as writer:
        (writer.dir / "model.bin").write_bytes(b"weights")
        writer.release(guarantee, data, unit_ids=units, **kw)
        writer.assume("the encoder is public")
    return out


def shown(value: float) -> str:
    return f"{value:.3f}" if not 0 < value < 0.0005 else f"{value:.2g}"


def test_a_tiny_private_epsilon_never_reads_as_a_public_zero():
    # the ledger prints 0.0001 (format_epsilon): the statement must not print 0.000 for it
    tiny = Guarantee(epsilon=1e-4, delta=1e-6, unit="query", mechanism="dp-adam")
    assert eps(1e-4) == "0.0001" and claim(tiny) == "ε = 0.0001 at δ = 1.00e-06"
    shown_values = [eps(v) for v in (0.0, 0.0005, 8.0034, 1234.4, math.inf)]
    assert shown_values == ["0.000", "0.001", "8.003", "1234", "∞"]


def test_every_epsilon_and_mu_is_recomputed_from_the_records(tmp_path, private_data):
    _, data = private_data
    first = release(tmp_path / "a", data, gaussian(1.1, 0.02, 60), ["q1", "q2"])
    second = release(tmp_path / "b", data, gaussian(0.9, 0.05, 20, "prv"), ["q2", "q3"])
    book = ledger([first, second])
    (cost,) = book.datasets.values()
    facts = dataset_statement(cost)
    # at the run's δ: exactly the ledger's composition (q2 is in both releases: ε and δ add)
    assert facts.total == cost.total and facts.total.epsilon == book.total.epsilon
    assert facts.total.delta == pytest.approx(2 * DELTA)
    # at δ = 1e-6 and 1/n²: each release by the same accountant, independently of synthq
    at_reference = [independent(1.1, 0.02, 60, 1e-6), independent(0.9, 0.05, 20, 1e-6, "prv")]
    at_n = [independent(1.1, 0.02, 60, 1 / N**2), independent(0.9, 0.05, 20, 1 / N**2, "prv")]
    for row, expected, expected_n in zip(facts.rows, at_reference, at_n, strict=True):
        assert (
            row.at_reference.epsilon == pytest.approx(expected, rel=1e-6) and row.at_reference.delta == 1e-6
        )
        assert row.n == N and row.at_n_squared.epsilon == pytest.approx(expected_n, rel=1e-6)
    assert facts.at_reference.epsilon == pytest.approx(sum(at_reference), rel=1e-6)
    assert facts.at_reference.delta == pytest.approx(2e-6)
    assert facts.at_n_squared.epsilon == pytest.approx(sum(at_n), rel=1e-6)
    # μ: no μ for a subsampled release (the CLT approximation is not a bound), nor composed
    assert all(row.mu.value is None for row in facts.rows) and facts.mu.value is None

    text = statement_for([first, second])
    assert f"- at the run's δ: ε = {shown(book.total.epsilon)} at δ = {2 * DELTA:.2e}" in text
    assert f"- every release at δ = 1e-06: ε = {shown(sum(at_reference))} at δ = 2.00e-06" in text
    assert f"- every release at δ = 1/n² (its own n): ε = {shown(sum(at_n))}" in text
    assert f"Gaussian-DP μ (√(Σ μ²) per unit): {NOT_STATED}" in text and "(CLT approximation)" not in text
    assert f"| 300 | ε = {shown(at_n[0])} at δ = {1 / N**2:.2e} | {NOT_STATED} |" in text
    assert f"| R1 | ε = {shown(at_reference[0])} at δ = 1.00e-06 | {N} |" in text
    assert "| dp-adam | prv | Poisson" in text and "(PRV): RDP gives ε = " in text  # PRV: one ordering only
    assert "add/remove one unit" in text and "(2ε, (1 + e^ε)·δ)" in text
    assert "- the encoder is public (2 artifacts)" in text
    assert text.rstrip().endswith("Conditions: ______________________________")
    assert "Reviewed by: ___" in text and "Date: ___" in text


def test_a_read_without_dp_makes_the_statement_infinite_and_is_listed_as_not_private(tmp_path, private_data):
    _, data = private_data
    private = release(tmp_path / "a", data, gaussian(1.1, 0.02, 60), ["q1"])
    leaked = release(tmp_path / "n", data, Guarantee.non_private("trained without DP", unit="query"), ["q1"])
    with create_artifact(tmp_path / "e", "eval", {"out": "e"}, inputs=[data]) as writer:  # dev selection
        writer.release(Guarantee.non_private("dev scores", unit="query"), data, unit_ids=["q1"])
        (writer.diagnostics_dir / PER_QUERY_FILE).write_text("{}")
        (writer.diagnostics_dir / SELECTION_FILE).write_text("| candidate | dev NDCG@10 |")
    text = statement_for([private, leaked, tmp_path / "e"])
    for name in (PER_QUERY_FILE, SELECTION_FILE):
        private_file = tmp_path / "e" / "diagnostics" / name
        assert f"`{private_file}`: private diagnostic (ε = ∞): not released; do not share" in text
    assert "- at the run's δ: ε = ∞" in text and "- every release at δ = 1e-06: ε = ∞" in text
    assert "- why ∞: trained without DP" in text
    not_released = text.split("## Not private, not released")[1]
    assert (
        f"- R2 train-retriever `{leaked.resolve()}`: read WITHOUT DP, ε = ∞ (trained without DP)"
        in not_released
    )
    assert "R1 train-retriever" not in not_released  # the DP release is not listed as leaked
    # each release's unit set is a private diagnostic of its artifact
    assert (
        f"`{leaked.resolve() / 'diagnostics' / 'units.bin'}`: private diagnostic (ε = ∞): not released"
        in text
    )
    assert "| dp-adam | rdp |" in text and "| none — read WITHOUT DP |" in text


def test_private_evolution_gets_an_exact_mu_and_a_user_level_release_its_per_query_guarantee(
    tmp_path, private_data
):
    _, data = private_data
    votes = Guarantee(
        epsilon=epsilon_for(2.0, DELTA, 1.0, 4).epsilon,
        delta=DELTA,
        unit="user",
        mechanism="private-evolution",
        accountant="rdp",
        details={
            "noise_multiplier": 2.0,
            "sample_rate": 1.0,
            "steps": 4,
            "accountant_delta": DELTA,
            "max_queries_per_user": 8,
        },
    )  # fmt: skip  -- no num_units recorded: δ = 1/n² cannot be computed and must be skipped
    derived = per_query(votes, "gaussian-substitution")
    votes = votes.model_copy(update={"details": {**votes.details, "per_query": derived}})
    path = release(tmp_path / "pe", data, votes, ["u1", "u2"], stage="evolve", unit_kind="user")
    (cost,) = ledger([path]).datasets.values()
    facts = dataset_statement(cost)
    (row,) = facts.rows
    assert row.mu.value == pytest.approx(math.sqrt(4) / 2.0) and row.mu.method == "exact"
    assert row.per_query["epsilon"] == pytest.approx(independent(2.0 / math.sqrt(2), 1.0, 4, DELTA))
    assert row.n is None and facts.at_n_squared is None
    assert facts.mu.value == pytest.approx(1.0) and facts.mu.method == "exact"  # q = 1: exact
    text = statement_for([path])
    assert "K = 8 queries per user" in text and "gaussian-substitution" in text
    assert f"for a single query ε = {shown(derived['epsilon'])} at δ = {DELTA:.2e}" in text
    # no clip norm (each vote has L2 norm 1): not applicable; no sensitivity recorded here
    assert "| none: every unit in every step (q = 1) | 1 | 4 | 2 | — | not recorded |" in text
    assert "| not recorded | skipped (n not recorded) | 1.0000 (exact) |" in text
    assert "- at δ = 1/n²: skipped (n not recorded for a release whose ε depends on δ)" in text
    # and the δ ≥ 1/n check says what it could not see: its data may hold more units than any n
    note = "1 release(s) with δ > 0 record no n: δ is checked against 1/n of the recorded n only"
    assert f"- **δ against 1/n**: {note}" in text
    assert any(
        line == f"  note: {note}; check it against the size of their data yourself"
        for line in ledger_lines([path])
    )


def test_a_canary_audit_is_evidence_with_its_lower_bounds_not_a_release(tmp_path, private_data):
    _, data = private_data
    dp = release(tmp_path / "gen", data, gaussian(1.1, 0.02, 60), ["q1"])
    with create_artifact(tmp_path / "audit", "canary-audit", {"model": "tiny-t5", "privacy_unit": "query"},
                         inputs=[data]) as writer:  # fmt: skip
        (writer.dir / "audit.json").write_text(json.dumps({"delta": 0.0125, "one_run": []}))
        writer.release(
            Guarantee.non_private("the audit reads the coins", unit="query"), data, unit_ids=["q1"]
        )
        bounds = ("epsilon_lower_bound", "gdp_epsilon_lower_bound", "auroc")
        writer.metrics.update({
            "one-run/generator/eps=8.00": dict(zip(bounds, (0.42, 0.5, 0.6), strict=True)),
            "one-run/generator/eps=1.00": dict(zip(bounds, (1.7, 1.8, 0.9), strict=True)),
        })  # fmt: skip
    text = statement_for([dp, tmp_path / "audit"])
    book = ledger([dp])
    assert f"- at the run's δ: ε = {shown(book.total.epsilon)}" in text  # the audit's ∞ is not composed
    audit = text.split("## Empirical audit (lower bounds)")[1].split("## Not private")[0]
    assert "**same recipe**" in audit and "not of this very generator" in audit and "δ = 1.25e-02" in audit
    assert "| generator | 8.00 | 0.420 | 0.500 | 0.600 |" in audit
    assert "| generator | 1.00 | 1.700 **exceeds the proven ε: do not sign** |" in audit
    assert f"- canary-audit `{tmp_path / 'audit'}`: reads the private data" in text


def pe_votes(sigma: float = 2.0, steps: int = 4) -> Guarantee:
    """Private Evolution's votes at the user unit (q = 1), with their per-query guarantee."""
    votes = Guarantee(
        epsilon=epsilon_for(sigma, DELTA, 1.0, steps).epsilon, delta=DELTA, unit="user",
        mechanism="private-evolution", accountant="rdp",
        details={"noise_multiplier": sigma, "sample_rate": 1.0, "steps": steps, "accountant_delta": DELTA,
                 "max_queries_per_user": 8, "num_units": N, "sensitivity": 1.0, "noise_std": sigma},
    )  # fmt: skip
    derived = per_query(votes, "gaussian-substitution")
    return votes.model_copy(update={"details": {**votes.details, "per_query": derived}})


def test_mu_is_stated_only_where_exact_and_composed_only_when_every_release_has_one(tmp_path, private_data):
    _, data = private_data
    pe = release(tmp_path / "pe", data, pe_votes(), ["u1"], stage="evolve", unit_kind="user")
    dp = release(tmp_path / "dp", data, gaussian(1.1, 0.02, 60), ["q1"])
    (alone,) = ledger([pe]).datasets.values()
    assert dataset_statement(alone).mu.value == pytest.approx(2 / 2.0)  # √T/σ, exact
    (mixed,) = ledger([pe, dp]).datasets.values()
    facts = dataset_statement(mixed)
    assert [row.mu.value for row in facts.rows] == [pytest.approx(1.0), None]
    assert facts.mu.value is None and str(facts.mu) == NOT_STATED
    text = statement_for([pe, dp])
    assert f"Gaussian-DP μ (√(Σ μ²) per unit): {NOT_STATED}" in text and "(CLT approximation)" not in text


def test_not_applicable_cells_and_the_recorded_sensitivity_and_noise_std(tmp_path, private_data):
    _, data = private_data
    pe = release(tmp_path / "pe", data, pe_votes(), ["u1"], stage="evolve", unit_kind="user")
    batch = gaussian(1.1, 0.02, 60, sensitivity=2.0, noise_std=2.2, clip_norm=1.0)
    dp = release(tmp_path / "dp", data, batch, ["q1"])
    selection = Guarantee(
        epsilon=1.0, delta=0.0, unit="query", mechanism="report-noisy-max", accountant="pure-composition",
        details={"epsilon_per_selection": 1.0, "selections": 1, "sensitivity": 1.0},
    )  # fmt: skip
    ev = release(tmp_path / "ev", data, selection, ["q2"], stage="eval")
    text = statement_for([pe, dp, ev])
    assert "| clip norm | sensitivity (noise std) | ε at its δ |" in text
    assert "(q = 1) | 1 | 4 | 2 | — | 1 (2) | ε = " in text  # PE: votes of L2 norm 1, no clip norm
    assert "| 0.02 | 60 | 1.1 | 1.0 | 2 (2.2) | ε = " in text  # batch clipping: noise std 2σC
    assert "| none: report-noisy-max, 1 selection(s) | — | — | — | — | 1 | ε = 1.000" in text
    assert "| not recorded |" not in text.split("Releases (as recorded")[1].split("| # | ε at")[0]


def at_delta(delta: float, n: int | None) -> Guarantee:
    """A DP-SGD release at a large δ, over ``n`` units (``None``: n not recorded)."""
    details = {"noise_multiplier": 1.0, "sample_rate": 0.1, "steps": 10, "accountant_delta": delta}
    return Guarantee(
        epsilon=epsilon_for(1.0, delta, 0.1, 10).epsilon, delta=delta, unit="query", mechanism="dp-adam",
        accountant="rdp", details={**details, **({"num_units": n} if n else {})},
    )  # fmt: skip


def test_a_composed_delta_at_or_above_one_over_n_is_refused_in_the_statement_and_flagged_in_the_ledger(
    tmp_path, private_data
):
    _, data = private_data
    wide = [
        release(tmp_path / f"r{i}", data, at_delta(0.02, 30), ["q1"]) for i in range(2)
    ]  # each δ = 0.02 < 1/30; together 0.04 ≥ 1/30
    warning = "not a meaningful guarantee (δ ≥ 1/n = 1/30: one unit's data could be published outright)"
    text = statement_for(wide)
    at_run = next(line for line in text.splitlines() if line.startswith("- at the run's δ:"))
    assert warning in at_run and "do not sign; the total at δ = 1e-6 is the one to read" in at_run
    assert "refused, no ε stated (δ = 0.04)" in at_run and "ε=" not in at_run and "ε = " not in at_run
    at_reference = next(line for line in text.splitlines() if line.startswith("- every release at δ = 1e-06"))
    assert warning not in at_reference and "refused" not in at_reference and "ε = " in at_reference
    lines = ledger_lines(wide)
    assert lines[1].startswith("  WARNING: " + warning)
    unknown = [
        release(tmp_path / f"u{i}", data, at_delta(0.06, None), ["q1"]) for i in range(2)
    ]  # no n recorded: only the 0.1 rule
    assert "not a meaningful guarantee (δ > 0.1: " in statement_for(unknown)
    assert "refused, no ε stated (δ = 0.12)" in statement_for(unknown)
    assert "not a meaningful guarantee" not in statement_for([unknown[0]])
    assert not any("WARNING" in line for line in ledger_lines([unknown[0]]))


def test_a_statement_whose_every_total_is_refused_is_not_written(tmp_path, private_data, monkeypatch):
    _, data = private_data
    wide = [release(tmp_path / f"r{i}", data, at_delta(0.06, None), ["q1"]) for i in range(2)]
    import synthq.bookkeeping.reaccounting as reaccounting
    import synthq.bookkeeping.statement as statement

    for module in (statement, reaccounting):  # the δ = 1e-6 lines at 0.06: refused as well
        monkeypatch.setattr(module, "REFERENCE_DELTA", 0.06)
    with pytest.raises(PrivacyError, match="no composed total in this statement is a meaningful guarantee"):
        statement_for(wide)


def test_all_datasets_at_every_delta_and_a_shared_name_under_another_key(tmp_path, private_data):
    _, data = private_data
    other = {**data, "identity": "hmac:" + "f" * 64}  # the same name, another keyed id
    first = release(tmp_path / "a", data, gaussian(1.1, 0.02, 60), ["q1"])
    second = release(tmp_path / "b", other, gaussian(0.9, 0.05, 20), ["q2"])
    third = release(tmp_path / "c", other, gaussian(0.9, 0.05, 20), ["q1"])  # q1 again: composes
    book = ledger([first, second])
    assert len(book.datasets) == 2  # no query in common: two datasets, whatever their names
    assert len(ledger([first, second, third]).datasets) == 1  # q1 read under both ids: one dataset
    text = statement_for([first, third])  # one dataset now: the statement says so in one section
    assert text.count("## Private dataset tiny") == 1 and "**All datasets together" not in text
    text = statement_for([first, second])
    together = text.split("**All datasets together, per unit:**")[1].split("## Assumptions")[0]
    at_reference = max(independent(1.1, 0.02, 60, 1e-6), independent(0.9, 0.05, 20, 1e-6))
    at_n = max(independent(1.1, 0.02, 60, 1 / N**2), independent(0.9, 0.05, 20, 1 / N**2))
    assert f"- at the run's δ: ε = {shown(book.total.epsilon)}" in together
    assert f"- every release at δ = 1e-06: ε = {shown(at_reference)} at δ = 1.00e-06" in together
    assert f"- every release at δ = 1/n² (its own n): ε = {shown(at_n)}" in together
    assert "**Same name, different keyed ids**: tiny (" in together and "ffffffffffff" in together
    assert "may be the same data read under another key: then their releases compose" in together


def test_diagnostics_given_by_relative_and_absolute_paths_are_listed_once(
    tmp_path, private_data, monkeypatch
):
    _, data = private_data
    release(tmp_path / "a", data, gaussian(1.1, 0.02, 60), ["q1"])
    monkeypatch.chdir(tmp_path)
    text = statement_for(["a"])
    assert text.count("diagnostics/units.bin`: private diagnostic") == 1
    assert f"`{(tmp_path / 'a' / 'diagnostics' / 'units.bin').resolve()}`" in text


def audit_artifact(out, data) -> object:
    with create_artifact(out, "canary-audit", {"model": "tiny-t5"}, inputs=[data]) as writer:
        (writer.dir / "audit.json").write_text(json.dumps({"delta": 0.0125, "one_run": []}))
        writer.release(
            Guarantee.non_private("the audit reads the coins", unit="query"), data, unit_ids=["q1"]
        )
        writer.metrics["one-run/generator/eps=8.00"] = {"epsilon_lower_bound": 0.42, "auroc": 0.6}
    return out


AUDIT_WARNING = (
    "**This statement contains canary-audit results computed from the private data without noise "
    "(ε = ∞): keep it within the review; generate it without the audit artifact for anything shared.**"
)


def test_an_audit_given_puts_its_infinite_epsilon_at_the_top_and_alone_is_not_called_no_private_read(
    tmp_path, private_data
):
    _, data = private_data
    audit = audit_artifact(tmp_path / "audit", data)
    dp = release(tmp_path / "gen", data, gaussian(1.1, 0.02, 60), ["q1"])
    text = statement_for([dp, audit])
    assert text.startswith("# Privacy statement\n\n" + AUDIT_WARNING + "\n")
    assert "## Empirical audit (lower bounds)" in text
    assert AUDIT_WARNING not in statement_for([dp])
    alone = statement_for([audit])
    assert alone.startswith("# Privacy statement\n\n" + AUDIT_WARNING)
    assert "No artifact here read private data" not in alone
    assert (
        "the canary audit did: it read the private data without noise (ε = ∞) and is not a release" in alone
    )


def test_the_cli_writes_the_statement_of_a_real_dp_run_and_refuses_a_directory(
    tmp_path, tiny_beir, tiny_encoder_dir, capsys, monkeypatch
):
    trained = train_retriever.run(
        retriever_config(tmp_path / "r", tiny_beir, tiny_encoder_dir, dp="group", epsilon=8)
    )
    own = trained.releases[0]["guarantee"]["details"]
    out = tmp_path / "statement.md"
    status, output = run_main(
        ["ledger", str(trained.path), "--statement", "--out", str(out)], capsys, monkeypatch
    )
    assert status == 0 and one_line(output) == f"privacy statement written to {out}"
    text = out.read_text()
    assert (
        text.startswith("# Privacy statement\n") and f"`{trained.path.resolve()}` (train-retriever)" in text
    )
    row = next(line for line in text.splitlines() if line.startswith("| R1 | train-retriever |"))
    assert (
        f"| {own['sample_rate']:.4g} | {own['steps']} | {own['noise_multiplier']:.4g} | {own['clip_norm']} |"
        in row
    )
    assert f"- **n** (units the accountants assumed, as recorded): {own['num_units']}." in text
    status, output = run_main(["ledger", str(trained.path), "--statement"], capsys, monkeypatch)
    assert status == 0 and output == text  # stdout without --out: the same statement
    (tmp_path / "dir").mkdir()
    status, output = run_main(["ledger", str(trained.path), "--statement", "--out", str(tmp_path / "dir")],
                              capsys, monkeypatch)  # fmt: skip
    assert status == 2 and "is a directory" in one_line(output)
    status, output = run_main(["ledger", str(trained.path), "--out", str(out)], capsys, monkeypatch)
    assert status == 2 and "--out goes with --statement" in one_line(output)
    status, output = run_main(
        ["ledger", str(trained.path), "--statement", "--out", str(trained.path / "s.md")], capsys, monkeypatch
    )
    assert status == 2 and "inside an artifact directory" in one_line(output)
    assert not (trained.path / "s.md").exists()


def test_the_assumption_that_unlinked_user_level_releases_hold_different_people_is_printed(
    tmp_path, private_data
):
    """Two user-level releases with no query id or text in common compose as different people:
    an assumption of the composed total, which the ledger and the statement must show."""
    from synthq.privacy.unit_sets import DIFFERENT_PEOPLE

    _, data = private_data
    user_level = accounted(epsilon=2.0, delta=1e-5, unit="user", mechanism="dp-adam", accountant="rdp")
    paths = [
        release(
            tmp_path / name,
            {**data, "identity": f"hmac:{name}"},
            user_level,
            users,
            unit_kind="user",
            links={"query": queries, "text": texts},
        )  # fmt: skip
        for name, users, queries, texts in (
            ("log-a", ["alice"], ["a1"], ["boil an egg"]),
            ("log-b", ["zed"], ["z1"], ["fix a bike"]),
        )
    ]
    assert DIFFERENT_PEOPLE in ledger(paths).total.assumptions
    assert any(DIFFERENT_PEOPLE in line and "the composed total" in line for line in ledger_lines(paths))
    assert f"- {DIFFERENT_PEOPLE} (the composed totals)" in statement_for(paths)
    # --compose sum: nothing read of the data, nothing assumed; the two releases add up everywhere
    summed = ledger(paths, compose="sum")
    assert summed.total.epsilon == pytest.approx(4.0) and DIFFERENT_PEOPLE not in summed.total.assumptions
    lines = ledger_lines(paths, compose="sum")
    assert lines[0].startswith("composed as a plain sum") and not any(DIFFERENT_PEOPLE in x for x in lines)
    assert lines[1].startswith("private dataset tiny ") and "ε=4.00" in lines[1] and "summed" in lines[1]
    text = statement_for(paths, compose="sum")
    assert "**Composition**: composed as a plain sum" in text and DIFFERENT_PEOPLE not in text
    assert text.count("## Private dataset") == 1 and "basic composition of every release, summed" in text


def test_a_plain_sum_is_one_line_that_bounds_every_unit(tmp_path, private_data):
    """Two query-level releases of one log and of its copy under new ids: per unit they merge into
    one line of 4 (the copy's texts meet); summed, every release is on one line of 4 (review: a
    per-dataset line of a plain sum would not bound a unit another dataset also holds) — and
    nothing reads which releases share queries."""
    _, data = private_data
    query_level = accounted(epsilon=2.0, delta=1e-5, unit="query", mechanism="dp-adam", accountant="rdp")
    paths = [
        release(
            tmp_path / name,
            {**data, "identity": f"hmac:{name}"},
            query_level,
            ids,
            links={"query": ids, "text": ["boil an egg", "tie a knot"]},
        )  # fmt: skip
        for name, ids in (("log", ["q1", "q2"]), ("copy", ["n1", "n2"]))
    ]
    per_unit = ledger(paths)
    assert [c.total.epsilon for c in per_unit.datasets.values()] == [pytest.approx(4.0)]
    summed = ledger(paths, compose="sum")
    assert [c.total.epsilon for c in summed.datasets.values()] == [pytest.approx(4.0)]
    assert summed.total.epsilon == pytest.approx(4.0)
    with pytest.raises(ValueError, match="compose"):
        ledger(paths, compose="max")
    # two datasets of one name stay two entries of dataset_totals
    assert sorted(dataset_totals(paths).values()) == [pytest.approx(4.0)]  # merged: one line
    apart = [release(tmp_path / "other", {**data, "identity": "hmac:other"}, query_level, ["z1"],
                     links={"query": ["z1"], "text": ["fix a bike"]}), paths[0]]  # fmt: skip
    assert len(dataset_totals(apart)) == 2
    # the plain sum rests on no link assumption, whatever an artifact's own headline says
    from synthq.privacy.unit_sets import LINK_ASSUMPTIONS

    summed_apart = ledger(apart, compose="sum")
    assert not set(LINK_ASSUMPTIONS) & set(summed_apart.total.assumptions)
    assert not any(a in statement_for(apart, compose="sum") for a in LINK_ASSUMPTIONS)


def test_datasets_on_separate_lines_print_that_they_hold_different_people_and_queries(tmp_path, private_data):
    """Review N3: a user-level release and a query-level release of unrelated logs are composed as
    sharing (the total adds them) but printed on separate lines, which rests on their holding
    different people: the ledger and the statement say so."""
    from synthq.privacy.unit_sets import SEPARATE_DATASETS

    _, data = private_data
    user_level = accounted(epsilon=2.0, delta=1e-5, unit="user", mechanism="dp-adam", accountant="rdp")
    query_level = accounted(epsilon=2.0, delta=1e-5, unit="query", mechanism="dp-adam", accountant="rdp")
    people = release(tmp_path / "log", {**data, "identity": "hmac:log"}, user_level, ["alice"],
                     unit_kind="user", links={"query": ["a1"], "text": ["boil an egg"]})  # fmt: skip
    other = release(tmp_path / "other", {**data, "identity": "hmac:other"}, query_level, ["z1"],
                    links={"query": ["z1"], "text": ["fix a bike"]})  # fmt: skip
    book = ledger([people, other])
    assert len(book.datasets) == 2  # two lines; the total composes them as sharing
    assert any(SEPARATE_DATASETS in line for line in ledger_lines([people, other]))
    assert SEPARATE_DATASETS in statement_for([people, other])
    alone = ledger_lines([people])
    assert not any(SEPARATE_DATASETS in line for line in alone)


def test_a_plain_sum_reads_nothing_of_the_private_log_and_says_what_it_did_not_check(
    tmp_path, tiny_beir, tiny_encoder_dir, monkeypatch
):
    """Review round 5, flow 4: after one private query is deleted, the per-unit ledger notes that
    the data changed since; ``--compose sum`` (the ledger and the statement) never digests the
    private dataset again, so it prints no such bit, and says that it did not check."""
    import shutil

    from synthq.artifacts import records
    from synthq.bookkeeping import releases

    data = tmp_path / "log"
    shutil.copytree(tiny_beir, data)
    dp = train_retriever.run(retriever_config(tmp_path / "dp", data, tiny_encoder_dir, dp="batch", epsilon=4))
    queries = (data / "queries.jsonl").read_text().splitlines()
    (data / "queries.jsonl").write_text("\n".join(queries[1:]) + "\n")  # a deletion request honoured
    assert any("changed since" in line and str(data) in line for line in ledger_lines([dp.path]))

    read = []

    def recording(record):
        read.append(record)
        return records.current_input_hash(record)

    monkeypatch.setattr(releases, "current_input_hash", recording)
    lines = ledger_lines([dp.path], compose="sum")
    text = statement_for([dp.path], compose="sum")
    assert not [r for r in read if r.get("private")], "the plain sum digested the private dataset"
    assert not any(str(data) in line for line in lines if "changed since" in line)
    assert any(line.startswith("not checked: private datasets are not read again") for line in lines)
    assert "private datasets are not read again under --compose sum" in text and f"- data {data}" not in text


def test_a_plain_sum_does_not_read_a_private_split_s_judged_documents_again(
    tmp_path, tiny_beir, tiny_causal_dir
):
    """Review round 5, second pass (finding 3): ``generate --split train`` records the document set
    the private train split judges; after a train query is deleted, the per-unit ledger says it
    changed, ``--compose sum`` does not digest it again."""
    import shutil

    from synthq.config.generator import GenerateConfig
    from synthq.stages import generate

    data = tmp_path / "log"
    shutil.copytree(tiny_beir, data)
    syn = generate.run(GenerateConfig(generator=tiny_causal_dir, corpus=str(data), split="train",
                                      out=tmp_path / "syn", max_new_tokens=4, device="cpu"))  # fmt: skip
    qrels = data / "qrels" / "train.tsv"
    header, *rows = qrels.read_text().splitlines()
    kept = [row for row in rows if not row.startswith("tr-egg-2-")]  # egg-2's only query: a deletion
    qrels.write_text("\n".join([header, *kept]) + "\n")
    assert any("judged-set" in line and "changed since" in line for line in ledger_lines([syn.path]))
    assert not any("judged-set" in line for line in ledger_lines([syn.path], compose="sum"))

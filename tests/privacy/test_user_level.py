"""User-level privacy: the user as a privacy unit, from the data's user ids through the DP
engine's sampling and bounds to every printed guarantee."""

from __future__ import annotations

import json
import math
import shutil
from collections import Counter

import pytest
import torch
from opacus.accountants import RDPAccountant
from pydantic import ValidationError
from typer.testing import CliRunner

from synthq.bookkeeping.releases import ledger_lines
from synthq.cli.app import app
from synthq.config.evaluation import EvalConfig
from synthq.config.generator import GenerateConfig
from synthq.data.beir_io import load_beir_dir
from synthq.data.pairs import training_pairs
from synthq.data.summary import summarize
from synthq.data.users import query_users
from synthq.dp.clipping import norm as _norm
from synthq.dp.contrastive.examples import Example
from synthq.dp.contrastive.group import GroupClipping
from synthq.dp.contrastive.sample import SampleClipping
from synthq.dp.engine import PrivacyPlan
from synthq.dp.lm.step import DPStep
from synthq.dp.noise import SecretRandomness
from synthq.dp.privacy_units import PrivacyUnits, poisson_units, training_units
from synthq.models.encoder import embed
from synthq.models.generator import QueryGenerator
from synthq.privacy.accounting import epsilon_for
from synthq.privacy.guarantee import Guarantee, compose_releases
from synthq.reporting.labels import _synthetic_origin
from synthq.runtime.errors import DataError, PrivacyError
from synthq.stages import evaluate, generate, train_retriever
from tests.helpers import finetune, retriever_config

# The tiny set's 17 training queries written by 8 people: one heavy user (5 queries), one with 3,
# two with 2, and singles.
USER_SIZES = [5, 3, 2, 2, 1, 1, 1, 1, 1]


def with_users(tmp_path, tiny_beir, name="private-log", sizes=USER_SIZES):
    """tiny_beir with ``metadata.user_id`` on every training query (``sizes`` queries per user,
    in file order) and the split declaration of the embedded data."""
    root = tmp_path / name
    shutil.copytree(tiny_beir, root)
    records = [json.loads(line) for line in (root / "queries.jsonl").read_text().splitlines()]
    train = [r for r in records if r["_id"].startswith("tr-")]
    users = [f"user{u}" for u, size in enumerate(sizes) for _ in range(size)]
    assert len(users) == len(train)
    for record, user in zip(train, users, strict=True):
        record["metadata"] = {"user_id": user}
    (root / "queries.jsonl").write_text("".join(json.dumps(r) + "\n" for r in records))
    return root


# Data ------------------------------------------------------------------------------------------


def test_user_ids_come_from_metadata_or_users_tsv(tmp_path, tiny_beir):
    data = with_users(tmp_path, tiny_beir)
    dataset = load_beir_dir(data)
    pairs = training_pairs(dataset)
    users = query_users(data, dataset.queries, pairs.query_rows)
    assert sorted(Counter(users).values(), reverse=True) == USER_SIZES
    summary = summarize(dataset)["splits"]["train"]["users"]
    assert summary["users"] == 9 and summary["queries_per_user"]["max"] == 5
    assert summary["queries_per_user"]["median"] == 1
    # a separate users.tsv is accepted (and is the source when present)
    apart = tmp_path / "apart"
    shutil.copytree(tiny_beir, apart)
    rows = [f"{pairs[i].query_id}\tperson-{i % 3}" for i in range(len(pairs))]
    (apart / "users.tsv").write_text("query-id\tuser-id\n" + "\n".join(rows) + "\n")
    dataset = load_beir_dir(apart)
    users = query_users(apart, dataset.queries, training_pairs(dataset).query_rows)
    assert set(users) == {"person-0", "person-1", "person-2"}


def test_a_query_without_a_user_is_an_error_naming_file_and_line(tmp_path, tiny_beir, tiny_causal_dir):
    data = with_users(tmp_path, tiny_beir)
    lines = (data / "queries.jsonl").read_text().splitlines()
    record = json.loads(lines[3])
    del record["metadata"]
    lines[3] = json.dumps(record)
    (data / "queries.jsonl").write_text("\n".join(lines) + "\n")
    with pytest.raises(DataError, match=rf"queries.jsonl:4.*{record['_id']}.*no metadata.user_id"):
        finetune(tmp_path, data, tiny_causal_dir, "gen", epsilon=8.0, max_steps=1, privacy_unit="user",
                 batch_size=4)  # fmt: skip
    # the query unit needs no user ids
    finetune(tmp_path, data, tiny_causal_dir, "gen-q", epsilon=8.0, max_steps=1, batch_size=4)
    # users.tsv that disagrees with the metadata, and one that misses a query
    other = with_users(tmp_path, tiny_beir, "disagree")
    dataset = load_beir_dir(other)
    pairs = training_pairs(dataset)
    (other / "users.tsv").write_text(f"{pairs[0].query_id}\tsomeone-else\n")
    with pytest.raises(DataError, match="users.tsv:1 says 'someone-else'"):
        query_users(other, dataset.queries, pairs.query_rows)
    (other / "users.tsv").write_text(f"{pairs[0].query_id}\tuser0\n")
    with pytest.raises(DataError, match=rf"users.tsv.*no user for query '{pairs[1].query_id}'"):
        query_users(other, dataset.queries, pairs.query_rows)


# Units and the bound K ---------------------------------------------------------------------------


def heavy_units(key_seed: int | None, max_queries: int = 3) -> PrivacyUnits:
    query_ids = [f"q{i}" for i in range(12)] + ["q12", "q12"]  # q12 has two pairs
    users = ["heavy"] * 10 + ["light", "light", "heavy", "heavy"]
    return PrivacyUnits.by_user(query_ids, users, max_queries, SecretRandomness(key_seed))


def test_each_user_keeps_at_most_k_queries_chosen_by_secret_randomness():
    units = heavy_units(None)
    assert units.kind == "user" and units.keys == ["heavy", "light"] and len(units) == 2
    heavy = units.rows[0]
    kept_queries = {f"q{r}" if r < 12 else "q12" for r in heavy}
    assert len(kept_queries) == 3  # K queries; a kept query brings all of its pairs
    assert (12 in heavy) == (13 in heavy)
    assert units.rows[1] == [10, 11]
    # two secret keys keep different subsets (with overwhelming probability over 10 tries)
    subsets = {tuple(heavy_units(None).rows[0]) for _ in range(10)}
    assert len(subsets) > 1
    # a seeded run is reproducible, and its guarantee says the seed is an assumption
    assert heavy_units(3).rows == heavy_units(3).rows
    assert "reproducible seed 3" in SecretRandomness(3).assumption()
    # which queries a user keeps depends on nobody else: drop the light user, same choice
    alone = PrivacyUnits.by_user([f"q{i}" for i in range(10)], ["heavy"] * 10, 3, SecretRandomness(3))
    assert alone.rows[0] == [r for r in heavy_units(3).rows[0] if r < 10]
    # weights: a user's rows weigh 1/k, so a user's rows sum to 1
    rows, weights = units.expand([0, 1])
    assert sum(weights) == pytest.approx(2.0)


def test_poisson_sampling_is_over_users():
    units = heavy_units(0)
    generator = torch.Generator().manual_seed(0)
    draws = [poisson_units(len(units), 0.5, generator) for _ in range(4000)]
    for unit in range(len(units)):  # each user is drawn with probability q, as a whole
        assert sum(unit in d for d in draws) / len(draws) == pytest.approx(0.5, abs=0.03)
    rows, _ = units.expand([0])
    assert set(rows) == set(units.rows[0])


# Sensitivity, brute force over users ------------------------------------------------------------


def _tiny_units(tmp_path, tiny_beir, max_queries=8):
    data = with_users(tmp_path, tiny_beir)
    pairs = training_pairs(load_beir_dir(data))
    return pairs, training_units(pairs, data, "user", max_queries, SecretRandomness(0))


@pytest.mark.parametrize("clipping", ["per-example", "per-user"])
@pytest.mark.parametrize("mode", ["vmap", "ghost"])
def test_generator_step_moves_by_at_most_c_when_any_user_is_removed(
    tmp_path, tiny_beir, tiny_causal_dir, clipping, mode
):
    pairs, units = _tiny_units(tmp_path, tiny_beir)
    generator = QueryGenerator.load(tiny_causal_dir, device="cpu", max_source_length=48)
    for module in generator.model.modules():  # no dropout: both neighbours see the same function
        if isinstance(module, torch.nn.Dropout):
            module.p = 0.0
    generator.model.train()  # ghost clipping's hooks run in training mode only
    clip = 1e-3
    plan = PrivacyPlan.with_noise(1.0, clip, 4)
    optimizer = torch.optim.SGD([p for p in generator.model.parameters() if p.requires_grad], lr=0.1)
    step = DPStep(
        generator, optimizer, plan, physical_batch_size=4, grad_sample_mode=mode, user_clipping=clipping
    )

    def make_batch(rows):
        chosen = [pairs[i] for i in rows]
        return generator.training_batch([p.document for p in chosen], [p.query for p in chosen], 16)

    def clipped_sum(sample):
        return step.clipped_sum(make_batch, *units.expand(sample), groups=units.positions(sample))[0]

    everyone = list(range(len(units)))
    full = clipped_sum(everyone)
    differences = {}
    for user in everyone:
        others = clipped_sum([u for u in everyone if u != user])
        differences[units.keys[user]] = float(
            torch.sqrt(sum((full[n] - others[n]).pow(2).sum() for n in full))
        )
    assert max(differences.values()) <= clip * (1 + 1e-4)
    assert max(differences.values()) > 0.9 * clip  # a one-query user reaches the bound: not vacuous
    if clipping == "per-example":
        assert differences["user0"] > 0.2 * clip  # the heavy user's 5 queries average (weights 1/k)
    else:  # every user's combined gradient is clipped to C: each one moves the sum by C exactly
        assert min(differences.values()) > (1 - 1e-3) * clip
    assert plan.sensitivity == clip
    step.clipper.close()


@pytest.mark.parametrize("mode", ["group", "sample"])
def test_retriever_mechanisms_bound_the_removal_of_any_user(tmp_path, tiny_beir, tiny_encoder_dir, mode):
    from synthq.models.encoder import load_encoder

    pairs, units = _tiny_units(tmp_path, tiny_beir)
    torch.manual_seed(0)
    encoder = load_encoder(tiny_encoder_dir)
    encoder.eval()
    parameters = [p for p in encoder.parameters() if p.requires_grad]

    def encode(texts, side):
        return embed(encoder, texts, 32)

    def batch_of(chosen):
        rows, weights = units.expand(chosen)
        return [
            Example(pairs[r].query, pairs[r].document, pairs[r].doc_id, units.key_of(r, ""), w)
            for r, w in zip(rows, weights, strict=True)
        ]

    clip, everyone = 1e-3, list(range(len(units)))

    def mechanism():
        if mode == "group":
            return GroupClipping(clip, 0.05, group_size=3, expected_batch_size=len(everyone),
                                 randomness=SecretRandomness(seed=1))  # fmt: skip
        return SampleClipping(clip, 0.05)

    full, _ = mechanism().clipped_sum(encode, batch_of(everyone), parameters)
    differences = []
    for user in everyone:
        others, _ = mechanism().clipped_sum(encode, batch_of([u for u in everyone if u != user]), parameters)
        differences.append(float(_norm([a - b for a, b in zip(full, others, strict=True)])))
    sensitivity = mechanism().sensitivity(len(everyone))  # the cap counts users
    assert max(differences) <= sensitivity * (1 + 1e-4)
    assert max(differences) > 0.5 * clip
    if mode == "group":  # all of a user's rows go to one group
        groups = mechanism().groups(batch_of(everyone))
        homes: dict[str, set[int]] = {}
        for group, members in groups.items():
            for example in members:
                homes.setdefault(example.unit_id, set()).add(group)
        assert len(homes) == len(everyone) and all(len(found) == 1 for found in homes.values())


# The stages -------------------------------------------------------------------------------------


def test_user_level_pipeline_states_the_user_everywhere(
    tmp_path, tiny_beir, tiny_causal_dir, tiny_encoder_dir
):
    data = with_users(tmp_path, tiny_beir)
    generator = finetune(
        tmp_path, data, tiny_causal_dir, "gen", epsilon=8.0, max_steps=3, batch_size=3,
        privacy_unit="user", max_queries_per_user=4,
    )  # fmt: skip
    guarantee = generator.privacy
    details = guarantee.details
    assert guarantee.unit == "user" and details["max_queries_per_user"] == 4
    assert details["num_units"] == 9 and details["sample_rate"] == pytest.approx(3 / 9)
    assert guarantee.delta == pytest.approx(1 / (2 * 9))  # δ counts users
    independent = RDPAccountant()
    independent.history = [(details["noise_multiplier"], 3 / 9, 3)]
    assert guarantee.epsilon == pytest.approx(independent.get_epsilon(delta=1 / 18), rel=1e-6)
    assert "(user, ≤4 queries)" in guarantee.describe()
    assert guarantee.per_unit == "per user (≤ 4 queries each)"
    assert "number of training users n" in " ".join(guarantee.assumptions)
    (release,) = generator.releases
    assert release["unit"] == "user" and release["units"]["kind"] == "user"
    assert "count" not in release["units"]  # n is released once, as the accountant's stated assumption
    diagnostics = json.loads((generator.path / "diagnostics" / "metrics.json").read_text())
    assert diagnostics["pairs_dropped_by_user_bound"] == 1  # the 5-query user keeps 4
    assert "per user, ≤ 4 queries each" in (generator.path / "README.md").read_text()

    synthetic = generate.run(
        GenerateConfig(
            generator=generator.path, corpus=str(data), out=tmp_path / "syn", max_new_tokens=4, seed=0
        )
    )
    retriever = train_retriever.run(retriever_config(tmp_path / "ret", synthetic.path, tiny_encoder_dir))
    assert retriever.privacy.unit == "user" and retriever.privacy.epsilon == pytest.approx(guarantee.epsilon)
    result = evaluate.run(
        EvalConfig(out=tmp_path / "ev", retrievers=[str(retriever.path)], datasets=[str(data)])
    )
    assert f"| {format(guarantee.epsilon, '.2f')} per user |" in (result.path / "results.md").read_text()
    text = "\n".join(ledger_lines([retriever.path]))
    assert "(user, ≤4 queries)" in text and "composed per user" in text and "over its user units" in text
    runner = CliRunner()
    shown = runner.invoke(app, ["info", str(generator.path)])
    assert shown.exit_code == 0 and "per user (≤ 4 queries each)" in shown.output


def test_per_user_clipping_run_records_its_rule_and_the_same_accounting(tmp_path, tiny_beir, tiny_causal_dir):
    """``--user-clipping per-user`` changes the clipping, not the accounting: the same σ for the
    same q and steps, and the rule and label say which clipping ran."""
    data = with_users(tmp_path, tiny_beir)
    options = dict(
        epsilon=8.0, max_steps=2, batch_size=3, privacy_unit="user", max_queries_per_user=4, seed=0
    )
    runs = {
        clipping: finetune(
            tmp_path, data, tiny_causal_dir, f"gen-{clipping}", user_clipping=clipping, **options
        )
        for clipping in ("per-example", "per-user")
    }
    example, user = (runs[c].privacy.details for c in ("per-example", "per-user"))
    assert user["user_clipping"] == "per-user" and example["user_clipping"] == "per-example"
    assert "sum clipped to C" in user["sensitivity_rule"] and "weighted 1/k" in example["sensitivity_rule"]
    assert user["noise_multiplier"] == example["noise_multiplier"]
    assert runs["per-user"].privacy.epsilon == pytest.approx(runs["per-example"].privacy.epsilon)
    synthetic = generate.run(
        GenerateConfig(
            generator=runs["per-user"].path, corpus=str(data), out=tmp_path / "syn", max_new_tokens=4, seed=0
        )
    )
    assert "(per-user clipping)" in _synthetic_origin(str(synthetic.path))[0]


def test_direct_dp_retriever_at_the_user_unit(tmp_path, tiny_beir, tiny_encoder_dir):
    data = with_users(tmp_path, tiny_beir)
    retriever = train_retriever.run(
        retriever_config(
            tmp_path / "ret",
            data,
            tiny_encoder_dir,
            dp="group",
            epsilon=4,
            privacy_unit="user",
            max_queries_per_user=2,
            batch_size=3,
        )  # fmt: skip
    )
    assert retriever.privacy.unit == "user" and retriever.privacy.details["num_units"] == 9
    assert retriever.privacy.details["sensitivity"] == 2.0
    with pytest.raises(PrivacyError, match="cannot protect a user"):
        train_retriever.run(
            retriever_config(
                tmp_path / "logit",
                data,
                tiny_encoder_dir,
                dp="logit",
                epsilon=4,
                privacy_unit="user",
                batch_size=3,
            )  # fmt: skip
        )
    with pytest.raises(ValidationError, match="--privacy-unit user needs --dp"):
        retriever_config(tmp_path / "x", data, tiny_encoder_dir, privacy_unit="user")


def test_query_and_user_releases_compose_as_the_query_unit(tmp_path, tiny_beir, tiny_causal_dir):
    data = with_users(tmp_path, tiny_beir)
    per_user = finetune(tmp_path, data, tiny_causal_dir, "u", epsilon=4.0, max_steps=1, batch_size=3,
                        privacy_unit="user")  # fmt: skip
    per_query = finetune(tmp_path, data, tiny_causal_dir, "q", epsilon=4.0, max_steps=1, batch_size=3)
    releases = per_user.releases + per_query.releases
    total = compose_releases(releases, [[r["id"] for r in releases]], [])
    assert total.unit == "query"  # never the stronger unit for a query-level release
    # the user-level release counts at its derived per-query ε (a removed query replaces the user's
    # contribution: the subsampled Gaussian's replace pair), never at face value
    derived = per_user.privacy.details["per_query"]
    assert derived["rule"] == "poisson-substitution"
    # never below the add/remove ε of the same noise (a user whose only query is removed); it may be
    # below the RDP ε the release prints per user, since a PLD bounds tighter than RDP
    details = per_user.privacy.details
    assert (
        derived["epsilon"]
        >= epsilon_for(
            details["noise_multiplier"],
            per_user.privacy.delta,
            details["sample_rate"],
            details["steps"],
            "prv",
        ).epsilon
    )
    assert total.epsilon == pytest.approx(derived["epsilon"] + per_query.privacy.epsilon)
    assert "compose only as the weakest" in total.note
    text = "\n".join(ledger_lines([per_query.path])).replace(str(tmp_path), "")
    assert "user" not in text  # a query-level release is never printed as per user
    assert Guarantee.non_private("x", unit="query").per_unit == "per query"
    assert math.isfinite(total.epsilon)


# The audit ---------------------------------------------------------------------------------------


def test_user_level_audit_inserts_canary_users_and_bounds_per_user(tmp_path, tiny_beir, tiny_causal_dir):
    from synthq.audit.canaries import make_one_run_canaries, per_user
    from synthq.config.audit import CanaryAuditConfig
    from synthq.stages import canary_audit

    data = with_users(tmp_path, tiny_beir)
    dataset = load_beir_dir(data)
    canaries = make_one_run_canaries(dataset, 8, seed=0, queries_per_user=2)
    users, means, coins = per_user(canaries, [float(i) for i in range(16)])
    assert len(users) == 8 and means[0] == pytest.approx(0.5)  # one score per user, their mean
    for user in users:  # one coin per user: all of a person's canaries in, or all out
        assert len({c.included for c in canaries if c.user == user}) == 1
    assert [c.secret for c in make_one_run_canaries(dataset, 8, 0)] != [c.secret for c in canaries]

    config = CanaryAuditConfig(
        data=str(data), model=str(tiny_causal_dir), out=tmp_path / "audit", canaries=8, canary_seed=0,
        epsilons=[4.0], privacy_unit="user", canary_queries_per_user=2, max_queries_per_user=3,
        retriever_audit=False, secret_references=2,
        finetune={"batch_size": 4, "max_steps": 2, "physical_batch_size": 8, "max_source_length": 32},
    )  # fmt: skip
    artifact = canary_audit.run(config)
    report = json.loads((artifact.path / "audit.json").read_text())
    included_users = sum(coins)
    assert report["privacy_unit"] == "user" and len(report["canary_users"]) == 8
    assert report["delta"] == pytest.approx(1 / (2 * (9 + included_users)))  # δ counts users
    (row,) = report["one_run"]
    assert 0 < row["proven_epsilon"] <= 4 and row["epsilon_lower_bound"] <= row["proven_epsilon"]
    assert len(report["one_run_scores"]["generator[eps=4.00]"]) == 16  # each canary pair scored
    with pytest.raises(ValidationError, match="one-run"):
        CanaryAuditConfig.model_validate({**config.model_dump(), "method": "exposure"})
    with pytest.raises(ValidationError, match="at most --max-queries-per-user"):
        CanaryAuditConfig.model_validate({**config.model_dump(), "canary_queries_per_user": 5})


def test_resume_keeps_the_users_bounded_by_the_interrupted_runs_key(tmp_path, tiny_beir, tiny_causal_dir,
                                                                    monkeypatch):  # fmt: skip
    """The K queries a user keeps follow the secret key, which a resumed run restores from its
    private checkpoint: the resumed steps sample exactly the units the first steps did."""
    from synthq.stages import finetune_lm

    data = with_users(tmp_path, tiny_beir)
    seen: list[list[list[int]]] = []
    original = finetune_lm.GeneratorTraining.step
    calls = {"n": 0}

    def interrupted(self, on_micro_batch=None):
        calls["n"] += 1
        seen.append([list(rows) for rows in self.units.rows])
        if calls["n"] == 3:
            raise KeyboardInterrupt
        return original(self, on_micro_batch)

    monkeypatch.setattr(finetune_lm.GeneratorTraining, "step", interrupted)
    options = dict(epsilon=8.0, max_steps=4, checkpoint_every=1, batch_size=3, privacy_unit="user",
                   max_queries_per_user=2)  # fmt: skip
    with pytest.raises(KeyboardInterrupt):
        finetune(tmp_path, data, tiny_causal_dir, "gen", **options)
    calls["n"] = -100  # no more interruptions
    artifact = finetune(tmp_path, data, tiny_causal_dir, "gen", **options, resume=True)
    assert artifact.privacy.unit == "user"
    assert all(units == seen[0] for units in seen)  # one bounded set of units across the restart
    assert sum(len(rows) for rows in seen[0]) < 17  # the bound dropped queries (users of 5 and 3)

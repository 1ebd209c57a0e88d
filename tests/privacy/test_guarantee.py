"""The guarantee type and composition: the ledger rules, per-unit composition of releases."""

from __future__ import annotations

import json
import math

import pytest

from synthq.privacy.guarantee import Guarantee, compose_all, compose_releases, format_epsilon, weakest_unit


def test_ledger_rules_and_json_round_trip():
    dp = Guarantee(epsilon=8.0, delta=1e-5, unit="example", mechanism="dp-adam", accountant="rdp")
    inherited = dp.inherit("abc123")
    assert inherited.epsilon == 8.0 and inherited.delta == 1e-5
    assert inherited.derived_from == ["abc123"] and "post-processing" in inherited.mechanism
    none = Guarantee.non_private("trained on private pairs without DP")
    assert math.isinf(none.epsilon) and not none.is_private
    assert math.isinf(none.inherit("x").epsilon)  # post-processing cannot create privacy
    dumped = json.loads(json.dumps(none.model_dump(mode="json")))
    assert dumped["epsilon"] == "inf"  # standard JSON, no bare Infinity
    assert math.isinf(Guarantee.from_manifest(dumped).epsilon)
    assert "∞" in none.describe() and "8.00" in dp.describe()


def test_units_are_stated_with_their_bound_and_assumptions_once():
    user = Guarantee(
        epsilon=4.0, delta=1e-6, unit="user", mechanism="dp-adam", details={"max_queries_per_user": 8}
    )
    assert user.unit_text == "user, ≤8 queries" and user.per_unit == "per user (≤ 8 queries each)"
    assert user.describe() == "ε=4.00 δ=1.0e-06 (user, ≤8 queries)"
    query = Guarantee(epsilon=4.0, delta=1e-6, unit="query", mechanism="dp-adam")
    assert query.unit_text == "query" and query.per_unit == "per query"
    assumed = query.assuming("the model is public", "", "the model is public", "the seed is secret")
    assert assumed.assumptions == ["the model is public", "the seed is secret"]
    assert assumed.describe(with_assumptions=True).endswith(
        "assuming: the model is public; the seed is secret"
    )
    assert Guarantee.public().describe() == "ε=0.00"  # no δ or unit for a public artifact
    assert weakest_unit(["user", "query"]) == "query" and weakest_unit(["query", "example"]) == "example"
    assert weakest_unit([]) == "query"
    assert [format_epsilon(e) for e in (0.5, 99.994, 1234.5, math.inf)] == ["0.50", "99.99", "1234", "∞"]
    # a positive ε below 0.005 must not print as a public artifact's 0.00
    assert [format_epsilon(e) for e in (0.0, 0.00312, 0.004999, 2e-7)] == ["0.00", "0.0031", "0.005", "2e-07"]


def _dp(epsilon: float, delta: float, unit: str = "query", **details) -> Guarantee:
    return Guarantee(
        epsilon=epsilon, delta=delta, unit=unit, mechanism="dp-adam", accountant="rdp", details=details
    )


def test_compose_all_adds_private_parts_and_keeps_the_weaker_unit():
    public = Guarantee.public().assuming("the encoder is public")
    total = compose_all([_dp(1.0, 1e-6), public, _dp(2.5, 2e-6, unit="example")], "train and tune")
    assert total.epsilon == pytest.approx(3.5) and total.delta == pytest.approx(3e-6)
    assert total.unit == "example" and total.accountant == "basic-composition"
    assert total.assumptions == ["the encoder is public"]
    assert [c["epsilon"] for c in total.details["components"]] == [1.0, 2.5]  # the public part adds nothing
    infinite = compose_all([_dp(1.0, 1e-6), Guarantee.non_private("no DP")], "with a leak")
    assert math.isinf(infinite.epsilon) and infinite.note == "no DP"
    alone = compose_all([public, _dp(1.0, 1e-6)], "one private part")
    assert (
        alone.epsilon == 1.0
        and alone.mechanism == "dp-adam"
        and alone.assumptions == ["the encoder is public"]
    )


def _release(key: str, guarantee: Guarantee) -> dict:
    return {"id": key, "guarantee": guarantee.model_dump(mode="json"), "unit": guarantee.unit}


def test_releases_compose_per_unit_over_the_groups_that_share_units():
    a, b, c = _release("a", _dp(1.0, 1e-6)), _release("b", _dp(2.0, 2e-6)), _release("c", _dp(4.0, 1e-6))
    apart = compose_releases([a, b, c], [["a", "b"], ["c"]], ["the model is public"])
    # a unit in a and b is protected at 1 + 2; one in c at 4: the worst unit's total is the headline
    assert apart.epsilon == pytest.approx(4.0) and apart.delta == pytest.approx(3e-6)
    assert apart.details["releases"] == ["a", "b", "c"] and apart.details["sharing"] == [["a", "b"], ["c"]]
    assert apart.assumptions == ["the model is public"] and apart.unit == "query"
    together = compose_releases([a, b, c], [["a", "b", "c"]], [])
    assert together.epsilon == pytest.approx(7.0) and together.delta == pytest.approx(4e-6)


def test_release_composition_edge_cases():
    nothing = compose_releases([], [], ["the corpus is public"])
    assert (
        nothing.epsilon == 0
        and nothing.mechanism == "public"
        and nothing.assumptions == ["the corpus is public"]
    )
    one = compose_releases([_release("a", _dp(1.5, 1e-6, steps=10))], [["a"]], [])
    assert one.epsilon == 1.5 and one.details == {"steps": 10, "releases": ["a"], "sharing": [["a"]]}
    leak = _release("n", Guarantee.non_private("eval read private queries without DP", unit="query"))
    infinite = compose_releases([_release("a", _dp(1.0, 1e-6)), leak], [["a"], ["n"]], [])
    assert math.isinf(infinite.epsilon) and infinite.note == "eval read private queries without DP"


def test_users_and_queries_compose_as_the_weakest_unit_with_the_loosest_bound():
    users = [
        _release("u1", _dp(1.0, 1e-6, unit="user", max_queries_per_user=3)),
        _release("u2", _dp(1.0, 1e-6, unit="user", max_queries_per_user=5)),
    ]
    both = compose_releases(users, [["u1", "u2"]], [])
    assert both.unit == "user" and both.details["max_queries_per_user"] == 5 and both.epsilon == 2.0
    # at the query unit each user-level release counts at the per-query ε it records (derived for
    # that neighbour), never at face value; one that records none fails closed
    mixed = compose_releases([*users, _release("q", _dp(1.0, 1e-6))], [["q", "u1", "u2"]], [])
    assert mixed.unit == "query" and math.isinf(mixed.epsilon)
    assert "no derived per-query guarantee" in mixed.note
    derived = [
        _release(
            r["id"],
            _dp(1.0, 1e-6, unit="user", per_query={"rule": "group-of-2", "epsilon": 2.5, "delta": 1e-6}),
        )  # fmt: skip
        for r in users
    ]
    mixed = compose_releases([*derived, _release("q", _dp(1.0, 1e-6))], [["q", "u1", "u2"]], [])
    assert mixed.unit == "query" and mixed.epsilon == 6.0 and mixed.delta == pytest.approx(3e-6)
    assert "compose only as the weakest, query" in mixed.note

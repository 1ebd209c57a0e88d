"""Fingerprints keyed by role: two inputs that trade contents make another fingerprint, and an
artifact written under the first scheme (hashes sorted without roles) stays up to date."""

from __future__ import annotations

from synthq.artifacts.freshness import (
    FINGERPRINT_TAG,
    config_fingerprint,
    fingerprint_matches,
    legacy_fingerprint,
)

CONFIG = {"data": "runs/a", "model": "runs/b", "out": "runs/c", "seed": 0}
READ = [
    {"path": "runs/a", "role": "data", "sha256": "aa" * 32},
    {"path": "runs/b", "role": "model", "sha256": "bb" * 32},
]
TRADED = [{**READ[0], "sha256": READ[1]["sha256"]}, {**READ[1], "sha256": READ[0]["sha256"]}]


def test_inputs_that_trade_contents_make_another_fingerprint():
    assert config_fingerprint(CONFIG, READ) != config_fingerprint(CONFIG, TRADED)
    assert legacy_fingerprint(CONFIG, READ) == legacy_fingerprint(CONFIG, TRADED)  # the first scheme's flaw


def test_two_inputs_of_one_role_keep_their_order():
    retrievers = [{"path": f"r{i}", "kind": "artifact", "sha256": c * 64} for i, c in enumerate("cd")]
    assert config_fingerprint(CONFIG, retrievers) != config_fingerprint(CONFIG, retrievers[::-1])


def test_the_read_order_across_roles_does_not_matter():
    assert config_fingerprint(CONFIG, READ) == config_fingerprint(CONFIG, READ[::-1])


def test_a_fingerprint_is_matched_by_the_scheme_it_was_written_in():
    current, first = config_fingerprint(CONFIG, READ), legacy_fingerprint(CONFIG, READ)
    assert current.startswith(FINGERPRINT_TAG) and not first.startswith(FINGERPRINT_TAG)
    assert fingerprint_matches(current, CONFIG, READ) and fingerprint_matches(first, CONFIG, READ)
    assert not fingerprint_matches(current, CONFIG, TRADED)
    assert not fingerprint_matches(current, {**CONFIG, "seed": 1}, READ)
    assert not fingerprint_matches(first, {**CONFIG, "seed": 1}, READ)
    assert not fingerprint_matches(None, CONFIG, READ) and not fingerprint_matches("", CONFIG, READ)
    assert config_fingerprint({**CONFIG, "out": "elsewhere"}, READ) == current  # volatile keys left out

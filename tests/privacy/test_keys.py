"""The owner's key: keyed digests that only its holder can test, and the seal of a manifest."""

from __future__ import annotations

import hashlib

import pytest

from synthq.privacy.keys import (
    KEY_BYTES,
    check_seal,
    export_key,
    import_key,
    key_id,
    key_path,
    keyed_digest,
    owner_key,
    private_data_digest,
    seal,
    unit_digests,
)
from synthq.runtime.errors import ArtifactError, SynthqError


@pytest.fixture
def other_installation(tmp_path, monkeypatch):
    """Switch to a fresh state directory (a new key) for the rest of the test."""

    def switch(name: str = "other") -> None:
        monkeypatch.setenv("SYNTHQ_STATE", str(tmp_path / name))

    return switch


def test_the_key_is_created_once_private_and_named_by_a_public_id(other_installation):
    other_installation("mine")
    key = owner_key()
    assert len(key) == KEY_BYTES and owner_key() == key
    assert key_path().read_bytes() == key and key_path().stat().st_mode & 0o777 == 0o600
    assert len(key_id()) == 16 and key_id() == key_id(key) and key.hex()[:16] != key_id()
    other_installation("theirs")
    assert owner_key() != key and key_id() != key_id(key)


def test_keyed_digests_are_stable_per_key_and_differ_across_keys(other_installation):
    other_installation("mine")
    content = hashlib.sha256(b"the private queries").hexdigest()
    mine = private_data_digest(content)
    assert mine == private_data_digest(content) and mine.startswith("hmac:")
    assert content not in mine  # the plain sha256 (a membership oracle) is not recorded
    assert keyed_digest("ab", "c") != keyed_digest("a", "bc")  # parts are separated
    assert keyed_digest("x") == keyed_digest(b"x")
    other_installation("theirs")
    assert private_data_digest(content) != mine


def test_unit_digests_are_sorted_distinct_per_kind_and_per_key(other_installation):
    other_installation("mine")
    digests = unit_digests("query", ["q2", "q1", "q2", "q3"])
    assert len(digests) == 3 * 8  # 8 bytes per distinct unit
    values = [int.from_bytes(digests[i : i + 8], "big") for i in range(0, len(digests), 8)]
    assert values == sorted(values)
    assert unit_digests("query", ["q3", "q1", "q2"]) == digests  # order of the ids does not matter
    assert unit_digests("user", ["q1"]) not in (digests[i : i + 8] for i in range(0, len(digests), 8))
    assert unit_digests("query", []) == b""
    other_installation("theirs")
    assert unit_digests("query", ["q1", "q2", "q3"]) != digests


def test_a_seal_verifies_and_any_edit_is_refused(other_installation):
    other_installation("mine")
    manifest = {"stage": "finetune-lm", "privacy": {"epsilon": 8.0, "delta": 1e-5}, "releases": []}
    manifest["seal"] = seal(manifest)
    assert check_seal(manifest, "m") is True
    assert check_seal(dict(reversed(list(manifest.items()))), "m") is True  # key order is irrelevant
    edited = {**manifest, "privacy": {"epsilon": 0.5, "delta": 1e-5}}
    with pytest.raises(ArtifactError, match="edited after synthq wrote it"):
        check_seal(edited, "m")
    with pytest.raises(ArtifactError, match="has no seal"):
        check_seal({k: v for k, v in manifest.items() if k != "seal"}, "m")
    other_installation("theirs")
    assert check_seal(manifest, "m") is False  # readable, not verifiable under another key
    assert check_seal(edited, "m") is False


def test_a_key_is_exported_and_imported_but_never_replaced_silently(tmp_path, other_installation):
    other_installation("mine")
    shared = export_key(tmp_path / "team.key")
    assert shared.stat().st_mode & 0o777 == 0o600 and shared.read_bytes() == owner_key()
    with pytest.raises(SynthqError, match="already exists"):
        export_key(shared)
    mine = key_id()
    other_installation("theirs")
    theirs = key_id()
    with pytest.raises(SynthqError, match="a different key is installed"):
        import_key(shared)
    assert key_id() == theirs
    assert import_key(shared, replace=True) == mine and key_id() == mine
    other_installation("fresh")
    assert import_key(shared) == mine  # nothing installed yet: no --replace needed
    (tmp_path / "short.key").write_bytes(b"too short")
    with pytest.raises(SynthqError, match="not a synthq key"):
        import_key(tmp_path / "short.key")
    other_installation("corrupt")
    key_path().write_bytes(b"x" * 7)
    with pytest.raises(SynthqError, match="not a synthq key"):
        owner_key()


def test_a_key_open_to_other_users_is_refused_as_ssh_refuses_one(other_installation):
    """Fault pass round 4: a world-readable owner key in a 0777 directory was used silently; whoever
    reads it can match the keyed unit sets and forge seals."""
    from synthq.privacy import keys

    other_installation("exposed")
    owner_key()
    key_path().chmod(0o644)
    keys._load_key.cache_clear()
    with pytest.raises(SynthqError, match=r"open to other users \(mode 644\).*chmod 600"):
        owner_key()
    key_path().chmod(0o600)
    keys._load_key.cache_clear()
    assert len(owner_key()) == KEY_BYTES


def test_an_empty_key_left_by_a_cut_off_write_says_what_to_do(other_installation):
    other_installation("cut-off")
    path = key_path()
    path.touch(mode=0o600)
    with pytest.raises(SynthqError, match=r"empty owner key .*sealed with it; remove it \(rm "):
        owner_key()

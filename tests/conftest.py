"""Shared fixtures: a tiny BEIR dataset and tiny models built from configs (session-scoped)."""

from __future__ import annotations

import os

import pytest

from tests import helpers

# Tests never touch the network or the user's cache.
os.environ.setdefault("HF_HUB_OFFLINE", "1")
os.environ.setdefault("TRANSFORMERS_OFFLINE", "1")
# Seeded runs are compared bit for bit: the thread count must not follow the machine's load.
os.environ.setdefault("SYNTHQ_LOAD_PROBE", "0")
# Expected minutes at the reference machine's costs: no machine probe (a test injects a factor).
os.environ.setdefault("SYNTHQ_MACHINE_PROBE", "0")


@pytest.fixture(scope="session", autouse=True)
def _isolated_state_for_the_session(tmp_path_factory):
    """The same cache and state directory for session- and module-scoped fixtures as for the tests
    (a fixture built before the per-test settings would otherwise use the user's key)."""
    base = tmp_path_factory.getbasetemp()
    saved = {name: os.environ.get(name) for name in ("SYNTHQ_CACHE", "SYNTHQ_STATE")}
    os.environ["SYNTHQ_CACHE"], os.environ["SYNTHQ_STATE"] = (
        str(base / "synthq-cache"),
        str(base / "synthq-state"),
    )
    yield
    for name, value in saved.items():
        if value is None:
            os.environ.pop(name, None)
        else:
            os.environ[name] = value


@pytest.fixture(autouse=True)
def _isolated_cache(tmp_path_factory, monkeypatch):
    """Each test session gets its own cache, except for converted packaged models (slow to redo)."""
    monkeypatch.setenv("SYNTHQ_CACHE", str(tmp_path_factory.getbasetemp() / "synthq-cache"))
    # the owner's key, unit sets and accountant memo: one per test session, never the user's
    monkeypatch.setenv("SYNTHQ_STATE", str(tmp_path_factory.getbasetemp() / "synthq-state"))


@pytest.fixture(scope="session")
def tiny_beir(tmp_path_factory):
    return helpers.write_tiny_beir(tmp_path_factory.mktemp("tiny-beir"))


@pytest.fixture(scope="session")
def tiny_t5_dir(tmp_path_factory):
    return helpers.tiny_t5(tmp_path_factory.mktemp("tiny-t5"))


@pytest.fixture(scope="session")
def tiny_causal_dir(tmp_path_factory):
    return helpers.tiny_causal(tmp_path_factory.mktemp("tiny-causal"))


@pytest.fixture(scope="session")
def tiny_encoder_dir(tmp_path_factory):
    return helpers.tiny_sentence_encoder(tmp_path_factory.mktemp("tiny-encoder") / "encoder")


@pytest.fixture
def private_data(tmp_path):
    """The tiny BEIR directory and its input record, read as private data (the privacy and ledger
    tests)."""
    from synthq.artifacts.records import data_input_record

    root = helpers.write_tiny_beir(tmp_path / "tiny")
    return root, data_input_record(root, name="tiny", private=True)

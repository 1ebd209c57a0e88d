"""Fixtures shared by the privacy tests."""

from __future__ import annotations

import pytest

from synthq.artifacts.records import data_input_record
from tests import helpers


@pytest.fixture
def private_data(tmp_path):
    """The tiny BEIR directory and its input record, read as private data."""
    root = helpers.write_tiny_beir(tmp_path / "tiny")
    return root, data_input_record(root, name="tiny", private=True)

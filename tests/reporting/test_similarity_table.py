"""The similarity table's synthetic-set ε: a foreign artifact's is recomputed, never read."""

from __future__ import annotations

import json

from synthq.artifacts.manifest import Artifact
from synthq.reporting.tables import similarity_table

GUARANTEE = {"epsilon": 8.0, "delta": 1e-5, "mechanism": "dp-adam"}
GENERATOR = {"id": "gen", "unit": "query", "guarantee": GUARANTEE}
OWN = {"id": "sim", "unit": "query", "guarantee": {"epsilon": "inf", "delta": 0.0, "mechanism": "none"}}


def _similarity(tmp_path, verified: bool) -> Artifact:
    metrics = {"synthetic_epsilon": 0.1, "bleu": 1.0, "distinct_2": 0.5, "verbatim_copy_rate": 0.0}
    manifest = {
        "stage": "similarity",
        "config": {"synthetic": str(tmp_path / "syn")},
        "metrics": metrics,
        "releases": [GENERATOR, OWN],
        "own_release": "sim",
        "privacy": OWN["guarantee"],
    }
    (tmp_path / "manifest.json").write_text(json.dumps(manifest))
    return Artifact(path=tmp_path, manifest=manifest, verified=verified)


def test_a_foreign_similarity_shows_the_epsilon_of_all_its_recorded_releases_not_its_metric(tmp_path):
    """Which release is the similarity's own read (excluded from the synthetic set's ε) is a field
    a foreign manifest's editor chooses: all of them count, its ∞ read included."""
    row = similarity_table([_similarity(tmp_path, verified=False)]).splitlines()[-1]
    assert row.startswith("| syn | ∞") and "0.1" not in row.split("|")[2]
    mine = similarity_table([_similarity(tmp_path, verified=True)]).splitlines()[-1]
    assert mine.split("|")[2].strip() == "0.10"  # this installation's metric, as it wrote it

"""Rows of an evaluation sealed elsewhere are published only with releases its manifest records."""

from __future__ import annotations

import json

import pytest

from synthq.artifacts.manifest import Artifact
from synthq.reporting.merge import merge_rows
from synthq.runtime.errors import ArtifactError

RELEASE = {"id": "r1", "stage": "finetune-lm", "unit": "query", "guarantee": {"epsilon": 8.0, "delta": 1e-5}}


def _eval(tmp_path, rows: list[dict], verified: bool) -> Artifact:
    (tmp_path / "results.json").write_text(json.dumps(rows))
    manifest = {"stage": "eval", "releases": [RELEASE], "inputs": [], "privacy": RELEASE["guarantee"]}
    (tmp_path / "manifest.json").write_text(json.dumps(manifest))
    return Artifact(path=tmp_path, manifest=manifest, verified=verified)


def _row(**changes) -> dict:
    row = {"dataset": "d", "split": "test", "retriever": "ret", "epsilon": 8.0, "ndcg@10": 0.5}
    return {**row, "releases": {"model": [RELEASE], "data": [], "selection": []}, **changes}


@pytest.mark.parametrize(
    ("row", "message"),
    [
        (_row(releases={"model": [{**RELEASE, "guarantee": {"epsilon": 0.1}}]}), "not its manifest's"),
        (_row(releases={"model": [{**RELEASE, "id": "r2"}]}), "not its manifest's"),
        ({k: v for k, v in _row(epsilon=0.1).items() if k != "releases"}, "records no releases"),
    ],
)
def test_a_foreign_evaluation_whose_rows_carry_other_releases_is_refused(tmp_path, row, message):
    with pytest.raises(ArtifactError, match=message):
        merge_rows([_eval(tmp_path, [row], verified=False)])
    merge_rows([_eval(tmp_path, [row], verified=True)])  # this installation's: its own results


def test_a_foreign_evaluation_whose_rows_carry_its_manifests_releases_is_read(tmp_path):
    rows, _ = merge_rows([_eval(tmp_path, [_row()], verified=False)])
    assert [r["retriever"] for r in rows] == ["ret"]


def test_a_foreign_row_with_thinned_releases_is_published_at_the_whole_evaluations_guarantee(tmp_path):
    """Emptied parts would compose to a smaller ε than the row rests on: a foreign row carries
    every release its evaluation's manifest records."""
    from synthq.reporting.eval_files import read_checked_rows

    thinned = _row(releases={"model": [], "data": [], "selection": []})
    (row,) = read_checked_rows(_eval(tmp_path, [thinned], verified=False))
    assert row["releases"] == {"model": [RELEASE], "data": [], "selection": []}
    (own,) = read_checked_rows(_eval(tmp_path, [thinned], verified=True))
    assert own["releases"]["model"] == []  # this installation's own rows are read as written


def test_a_foreign_row_with_a_malformed_part_is_refused(tmp_path):
    with pytest.raises(ArtifactError, match="malformed"):
        merge_rows([_eval(tmp_path, [_row(releases={"model": ["r1"]})], verified=False)])

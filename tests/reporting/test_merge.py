"""Rows of an evaluation sealed elsewhere are published only with releases its manifest records."""

from __future__ import annotations

import json

import pytest

from synthq.artifacts.manifest import Artifact
from synthq.reporting.eval_files import read_checked_rows
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
    "row",
    [
        _row(releases={"model": [{**RELEASE, "guarantee": {"epsilon": 0.1}}]}),  # an edited record
        _row(releases={"model": [{**RELEASE, "id": "r2"}]}),  # a record the manifest lacks
        {k: v for k, v in _row(epsilon=0.1).items() if k != "releases"},  # none, an edited ε
        _row(releases={"model": [], "data": [], "selection": []}),  # thinned out
        _row(releases={"model": ["r1"]}),  # malformed
    ],
)
def test_a_foreign_evaluations_row_is_published_at_its_whole_guarantee_whatever_it_carries(tmp_path, row):
    """A foreign results.json row's releases and ε are fields its editor controls: every row
    carries the one stand-in for the evaluation's releases, and its ε is recomputed from it."""
    evaluation = _eval(tmp_path, [row], verified=False)
    (published,) = read_checked_rows(evaluation)
    assert published["releases"]["model"] == [evaluation.foreign_stand_in()]
    assert published["epsilon"] == published["privacy"]["epsilon"] == pytest.approx(8.0)
    assert evaluation.unverified_assumption in published["assumptions"]
    (merged,), _ = merge_rows([evaluation])
    assert merged["epsilon"] == pytest.approx(8.0)  # what report writes to its results.json


def test_this_installations_rows_are_read_as_written(tmp_path):
    (own,) = read_checked_rows(_eval(tmp_path, [_row()], verified=True))
    assert own["releases"]["model"] == [RELEASE] and own["epsilon"] == 8.0


def test_an_unreadable_row_is_an_artifact_error(tmp_path):
    with pytest.raises(ArtifactError, match="unreadable evaluation results"):
        read_checked_rows(_eval(tmp_path, [{"dataset": "d"}], verified=True))

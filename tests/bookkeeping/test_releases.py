"""The ledger over a tiny set of hand-made artifacts: releases per private dataset, composed per
unit, what changed since, and each assumption once."""

from __future__ import annotations

import math
import shutil

import pytest

from synthq.artifacts.create import create_artifact
from synthq.artifacts.manifest import open_artifact
from synthq.bookkeeping.releases import dataset_totals, ledger, ledger_lines
from synthq.privacy.accounting import epsilon_for
from synthq.privacy.guarantee import Guarantee
from synthq.privacy.unit_sets import QUERIES_BY_ID
from synthq.runtime.errors import ArtifactError

DELTA = 1e-5


def dp_release(steps: int) -> Guarantee:
    """A DP training run's guarantee with the parameters that reproduce its ε when opened."""
    return Guarantee(
        epsilon=epsilon_for(1.0, DELTA, 0.01, steps).epsilon,
        delta=DELTA,
        unit="query",
        mechanism="dp-adam",
        accountant="rdp",
        details={"noise_multiplier": 1.0, "sample_rate": 0.01, "steps": steps, "num_units": 300},
    )


def trained(out, data: dict, guarantee: Guarantee, units: list[str], assumption: str = "") -> str:
    with create_artifact(out, "train-retriever", {"out": str(out)}, inputs=[data]) as writer:
        (writer.dir / "model.bin").write_bytes(b"weights")
        writer.release(guarantee, data, unit_ids=units)
        writer.assume(assumption)
    return str(open_artifact(out).path)


def test_releases_on_one_dataset_compose_per_unit(tmp_path, private_data):
    _, data = private_data
    first = trained(tmp_path / "a", data, dp_release(100), ["q1", "q2"], "the encoder is public")
    second = trained(tmp_path / "b", data, dp_release(200), ["q2", "q3"], "the encoder is public")
    third = trained(tmp_path / "c", data, dp_release(300), ["q9"])
    epsilons = [dp_release(steps).epsilon for steps in (100, 200, 300)]
    book = ledger([first, second, third])
    # grouped by the dataset's keyed identity (its query ids), not its directory digest
    assert list(book.datasets) == [data["identity"]] and len(book.releases) == 3 and book.changed == []
    assert data["identity"].startswith("hmac:") and data["identity"] != data["sha256"]
    # q2 is in the first two releases, q9 only in the third: the worst unit pays first + second
    worst = max(epsilons[0] + epsilons[1], epsilons[2])
    assert book.total.epsilon == pytest.approx(worst, rel=1e-9)
    assert dataset_totals([first, second, third]) == {"tiny": pytest.approx(worst, rel=1e-9)}
    lines = ledger_lines([first, second, third])
    keyed = data["identity"].removeprefix("hmac:")[:12]
    assert lines[0] == (
        f"private dataset tiny (keyed id {keyed}): {book.total.describe()} over 3 release(s), "
        "composed per query"
    )
    own = "over its query units"
    assert lines[1] == f"  - train-retriever {first}: DP release, {dp_release(100).describe()}, {own}"
    assert lines[3] == f"  - train-retriever {third}: DP release, {dp_release(300).describe()}, {own}"
    # these releases kept no query texts (the writer's fallback): matched by id, and it says so
    assert lines[4:] == [
        "assumptions:",
        "  - the encoder is public (2 artifacts)",
        f"  - {QUERIES_BY_ID} (the composed totals)",
    ]
    again = ledger([first, first])
    assert len(again.releases) == 1 and again.total.epsilon == epsilons[0]  # each release counted once


def test_a_read_without_dp_and_a_changed_dataset_are_reported(tmp_path, private_data):
    root, data = private_data
    private = trained(tmp_path / "a", data, dp_release(100), ["q1"])
    leaked = trained(tmp_path / "n", data, Guarantee.non_private("trained without DP", unit="query"), ["q1"])
    (root / "corpus.jsonl").write_text((root / "corpus.jsonl").read_text() + "\n")  # edited since
    lines = ledger_lines([private, leaked])
    assert lines[0].startswith("private dataset tiny") and "ε=∞" in lines[0]
    assert lines[2] == f"  - train-retriever {leaked}: read WITHOUT DP, ε=∞, over its query units"
    changed = [line for line in lines if line.startswith("changed since: ")]
    assert changed == [
        f"changed since: data {root} changed since {path} read it (the recorded releases still count)"
        for path in (private, leaked)
    ]
    assert math.isinf(dataset_totals([private, leaked])["tiny"])
    shutil.rmtree(root)
    assert ledger([private]).changed == [
        f"data {root} is gone {private} read it (the recorded releases still count)"
    ]


def test_a_ledger_of_public_artifacts_and_of_non_artifacts(tmp_path):
    with create_artifact(tmp_path / "p", "train-retriever", {"public": True}) as writer:
        writer.public()
    assert ledger_lines([tmp_path / "p"]) == [
        "no artifact here read private data (only public data or post-processing of nothing private)"
    ]
    (tmp_path / "plain").mkdir()
    with pytest.raises(ArtifactError, match="not an artifact"):
        ledger([tmp_path / "plain"])

"""benchmarks/pylibs_curve.py: each route's share of the non-private gain at each log size,
against a hand computation, and its plot."""

from __future__ import annotations

import json

import numpy as np
import pytest

from benchmarks import pylibs_curve


def write_eval(tmp_path, rows):
    tmp_path.mkdir(parents=True, exist_ok=True)
    scores = {
        name: {"ndcg@10": {f"q{i}": value for i, value in enumerate(values)}} for name, values in rows.items()
    }
    (tmp_path / "per_query.json").write_text(json.dumps({"pylibs": scores}))
    return tmp_path


def test_shares_are_the_gain_over_the_untrained_start_in_units_of_the_non_private_gain(tmp_path):
    rng = np.random.default_rng(1)
    start = rng.uniform(0, 1, 200)
    rows = {
        "untrained minilm-l6": start,
        "ret-np-u10": start + 0.10,
        "ret-dp-u10": start + 0.02,
        "ret-np-uall": start + 0.08,
        "ret-dp-uall": start + 0.06,
    }
    eval_dir = write_eval(tmp_path, {k: v.tolist() for k, v in rows.items()})
    curve = pylibs_curve.curve(pylibs_curve.per_query([eval_dir], "pylibs"), {"u10": 10, "uall": 1000})
    assert [(row["route"], row["users"]) for row in curve] == [("dp", 10), ("dp", 1000)]
    assert curve[0]["share_of_gain"] == pytest.approx(0.2) and curve[1]["share_of_gain"] == pytest.approx(
        0.75
    )
    assert curve[1]["share_interval"] == pytest.approx([0.75, 0.75])  # constant differences: no spread
    assert curve[1]["minus_untrained"] == pytest.approx(0.06)
    pylibs_curve.plot(curve, tmp_path / "curve.png")
    assert (tmp_path / "curve.png").stat().st_size > 1000


def test_replicate_generators_are_one_route_at_their_mean_from_a_second_evaluation(tmp_path):
    """--group syn=ret-syn-g*@uall: three generators' retrievers, scored by another evaluation of
    the same split, are one route whose per-query score is their mean; a second evaluation of
    other queries is refused."""
    start = np.linspace(0.1, 0.9, 50)
    first = write_eval(tmp_path / "curve", {"untrained minilm-l6": start.tolist(),
                                            "ret-np-uall": (start + 0.1).tolist()})  # fmt: skip
    second = write_eval(tmp_path / "syn", {f"ret-syn-g{g}": (start + 0.01 * g).tolist() for g in (1, 2, 3)})
    scores = pylibs_curve.grouped(pylibs_curve.per_query([first, second], "pylibs"), ["syn=ret-syn-g*@uall"])
    assert sorted(scores) == ["ret-np-uall", "ret-syn-uall", "untrained minilm-l6"]
    (row,) = pylibs_curve.curve(scores, {"uall": 1404})
    assert row["route"] == "syn" and row["share_of_gain"] == pytest.approx(0.2)
    other = write_eval(tmp_path / "other", {"ret-x": [0.5] * 10})
    with pytest.raises(SystemExit, match="other queries"):
        pylibs_curve.per_query([first, other], "pylibs")

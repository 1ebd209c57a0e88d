"""The bf16-on-CPU benchmark's row of the performance table, and the CPU flags it reads."""

from __future__ import annotations

from benchmarks import readme_table
from synthq.runtime import precision


def test_the_table_row_gives_each_measured_work_its_bf16_ratio_and_the_cpu_flags():
    results = {
        "generate@fp32": {"time_ratio": 1.0, "threads": 1},
        "generate@bf16": {"time_ratio": 0.5, "threads": 1},
        "finetune_dp@fp32": {"time_ratio": 1.0, "threads": 2},
        "finetune_dp@bf16": {"time_ratio": 0.625, "threads": 2},
    }
    payload = {"benchmark": "cpu_precision", "cpu_flags": ["avx512_bf16"], "load_average": [1.2]}
    payload["results"] = results
    rows = readme_table.rows({"benchmarks": {"cpu_precision[batch 16]": payload}, "collected": "2026-11-28"})
    work, measured, _, _, conditions = next(row for row in rows if "--precision bf16" in row[0])
    assert "avx512_bf16" in work
    assert measured == "time generate (sampler) 0.50×, finetune-lm DP step 0.62×"  # no retriever row measured
    assert conditions.startswith("load 1.2")


def test_native_bf16_is_read_from_the_cpu_flags(monkeypatch):
    monkeypatch.setattr(precision, "cpu_flags", lambda: ["sse2", "avx512f"])
    assert not precision.native_bf16_cpu()
    monkeypatch.setattr(precision, "cpu_flags", lambda: ["avx512f", "amx_bf16"])
    assert precision.native_bf16_cpu()

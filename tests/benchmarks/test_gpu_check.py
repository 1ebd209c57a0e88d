"""``make gpu-check``'s script on a CPU (``--cpu-smoke``): every section runs at tiny sizes, the CUDA
parts say they were skipped, the JSON and the table hold what a GPU run would report — so the
script cannot rot between the rare sessions that have a GPU."""

from __future__ import annotations

import json

import pytest
import torch

from benchmarks import gpu_check


@pytest.mark.slow
def test_the_cpu_smoke_runs_every_section(tmp_path, capsys):
    out = tmp_path / "gpu_check.json"
    # the budget guards a lent GPU's minutes; here every section must run, on however slow a CPU
    # (one without bf16 arithmetic took more than the default 420 s)
    assert gpu_check.main(["--cpu-smoke", "--budget-s", "3600", "--out", str(out)]) == 0
    results = json.loads(out.read_text())
    sections = results["sections"]
    assert list(sections) == list(gpu_check.SECTIONS)
    assert not [name for name, entry in sections.items() if "error" in entry or "skipped" in entry]
    assert sections["environment"]["opacus"] == __import__("opacus").__version__
    for rows in sections["norms"]["generators"].values():  # both engines, both precisions, both models
        assert {(r["mode"], r["precision"]) for r in rows} == {
            (m, p) for m in ("ghost", "hooks") for p in ("fp32", "bf16")
        }
        assert all(r["ok"] for r in rows)
        bf16 = [r["max_relative_norm_error"] for r in rows if r["precision"] == "bf16"]
        assert min(bf16) > 1e-5  # the bf16 rows really ran in bf16
    assert all(r["ok"] for r in sections["norms"]["retriever"])
    steps = sections["steps"]["rows"]
    assert len(steps) == 6 and all(r["dp_s"] > 0 and r["ok"] is None for r in steps)  # no aims at tiny sizes
    assert sections["generation"]["synthq_queries_per_second"] > 0
    assert sections["stages"]["torchrun"].startswith("skipped")
    chain = sections["stages"]["rows"]
    assert [r["stage"] for r in chain] == [
        "finetune-lm",
        "generate",
        "train-retriever",
        "train-retriever",
        "eval",
    ]
    assert all(r["ok"] for r in chain) and chain[0]["epsilon"] == pytest.approx(8.0, abs=0.01)
    table = capsys.readouterr().out
    assert table == results["table"] + "\n" and "| generate," in table and "**NO**" not in table


def test_refuses_unknown_sections_and_a_missing_gpu(tmp_path):
    with pytest.raises(SystemExit):
        gpu_check.main(["--cpu-smoke", "--sections", "norms,speed", "--out", str(tmp_path / "x.json")])
    if not torch.cuda.is_available():
        with pytest.raises(SystemExit):
            gpu_check.main(["--out", str(tmp_path / "x.json")])

"""benchmarks/dp_query_only.py and benchmarks/query_only_loss.py run end to end on the tiny causal model."""

from __future__ import annotations

import json
import sys

from benchmarks import dp_query_only, query_only_loss


def test_both_sides_of_the_step_benchmark_run_and_each_gets_its_micro_batch(tiny_causal_dir):
    assert dp_query_only.micro_batch(True, 384) == 21  # 1,024 tokens of 32 query + 16 invocation
    assert dp_query_only.micro_batch(False, 128) == 5  # 1,024 tokens of whole rows
    for query_only in (False, True):
        step = dp_query_only.make_step(str(tiny_causal_dir), query_only, 2, 3, 16, 2)
        step()
    assert dp_query_only.cache_seconds_per_row(str(tiny_causal_dir), 2, 2, 16) > 0


def test_loss_benchmark_prints_the_ratio(tiny_beir, tiny_causal_dir, monkeypatch, capsys):
    argv = ["query_only_loss.py", "--model", str(tiny_causal_dir), "--data", str(tiny_beir)]
    argv += [
        "--train",
        "4",
        "--held-out",
        "2",
        "--steps",
        "1",
        "--batch",
        "2",
        "--lora",
        "2",
        "--tokens",
        "16",
    ]
    monkeypatch.setattr(sys, "argv", argv)
    query_only_loss.main()
    printed = json.loads(capsys.readouterr().out)
    assert printed["benchmark"] == "query_only_loss" and printed["loss_ratio"] > 0

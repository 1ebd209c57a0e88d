"""Every Python block of the README and the docs runs as written (issue #74: the python-api page's
own example raised a validation error on ``train_retriever(data=syn.path)``).

The blocks run unchanged, in a fresh directory, with tiny stand-ins for what would take minutes on
two CPU cores: a 30-row ``log.tsv`` over the tiny test corpus, the tiny test models in place of
the aliases ``smollm2-135m`` and ``minilm-l6``, and each stage's length options cut (a stage's
options are added to the block's, never replacing the ones it states but the batch size, which on
30 rows would be refused as larger than the log). The shell blocks are not run here: each is a
full stage on a real model (minutes to hours on this machine); the end-to-end and command tests
run the same commands on tiny data.
"""

from __future__ import annotations

import re
from pathlib import Path

import pytest

import synthq
from tests.helpers import DEV_QUERIES, TEST_QUERIES, TRAIN_QUERIES

ROOT = Path(__file__).resolve().parents[1]
PAGES = [ROOT / "README.md", *sorted((ROOT / "docs").rglob("*.md"))]
BLOCK = re.compile(r"^```python\n(.*?)^```", re.DOTALL | re.MULTILINE)

# What each block is, by a line it holds: a new block must be added here (and so run).
WRITES_A_LOG = "rows = list(csv.reader(log"
CALLS_THE_API = "from synthq import evaluate, finetune_lm, generate, ledger, train_retriever"

SMALL = {
    "finetune_lm": dict(max_steps=2, batch_size=8, physical_batch_size=4, max_source_length=48),
    "generate": dict(max_new_tokens=8),
    "train_retriever": dict(max_steps=1, batch_size=4, max_query_length=16, max_doc_length=32),
    "evaluate": {},
}


def _blocks() -> list[tuple[str, str]]:
    found = []
    for page in PAGES:
        if "generated" in page.parts:
            continue
        for body in BLOCK.findall(page.read_text(encoding="utf-8")):
            found.append((str(page.relative_to(ROOT)), body))
    return found


def test_every_python_block_is_one_this_file_runs():
    blocks = _blocks()
    assert blocks, "no Python block found: the pattern is stale"
    for page, body in blocks:
        assert WRITES_A_LOG in body or CALLS_THE_API in body, f"{page}: a Python block this file does not run"


def _write_log(directory: Path) -> None:
    """``user_id, query, clicked_doc_id``: the tiny corpus's queries, two per user."""
    queries = [(text, doc) for doc, texts in TRAIN_QUERIES.items() for text in texts]
    queries += [(text, doc) for doc, text in {**TEST_QUERIES, **DEV_QUERIES}.items()]
    rows = [f"u{i // 2}\t{text}\t{doc}\n" for i, (text, doc) in enumerate(queries)]
    (directory / "log.tsv").write_text("".join(rows), encoding="utf-8")


def _with_stand_ins(monkeypatch, stand_ins: dict[str, str]) -> None:
    """``synthq.finetune_lm`` and friends, with the aliases replaced and the stage made tiny."""
    from synthq import api

    def swap(value):
        if isinstance(value, list):
            return [swap(v) for v in value]
        return stand_ins.get(value, value) if isinstance(value, str) else value

    for name, small in SMALL.items():
        real = getattr(api, name)

        def call(config=None, /, _real=real, _small=small, **options):
            options = {k: swap(v) for k, v in options.items()}
            return _real(config, **{**options, **_small})

        monkeypatch.setattr(synthq, name, call, raising=False)


@pytest.mark.slow
def test_the_blocks_run_as_written(
    tmp_path, monkeypatch, tiny_beir, tiny_causal_dir, tiny_encoder_dir, capsys
):
    monkeypatch.chdir(tmp_path)
    _write_log(tmp_path)
    _with_stand_ins(monkeypatch, {"smollm2-135m": str(tiny_causal_dir), "minilm-l6": str(tiny_encoder_dir)})
    blocks = _blocks()
    ordered = [b for b in blocks if WRITES_A_LOG in b[1]] + [b for b in blocks if CALLS_THE_API in b[1]]
    for page, body in ordered:
        exec(compile(body, f"{page} (python block)", "exec"), {"__name__": "__doc_block__"})  # noqa: S102
        if WRITES_A_LOG in body:  # the block leaves the documents to the reader
            (tmp_path / "mylog" / "corpus.jsonl").write_bytes((tiny_beir / "corpus.jsonl").read_bytes())
    assert (tmp_path / "runs" / "eval" / "results.md").is_file()
    assert "ε = " in capsys.readouterr().out

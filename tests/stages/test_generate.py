"""synthq generate on tiny generators: reproducibility, batching, padding per model kind, shards,
resume, degenerate resampling, privacy, errors.

The generators are tiny T5 / Llama models trained for a few seconds with plain Adam on the tiny
pairs (so greedy outputs are real, varied queries), saved with ``QueryGenerator.save`` and
wrapped as ``finetune-lm`` artifacts carrying a DP guarantee; the finetune stage is not needed.
"""

from __future__ import annotations

import json
import math
import shutil

import pytest
import torch
from transformers import LogitsProcessor, LogitsProcessorList

from synthq.artifacts.create import create_artifact
from synthq.artifacts.manifest import open_artifact, partial_dir
from synthq.config.generator import GenerateConfig
from synthq.models import sampling
from synthq.models.generator import QueryGenerator
from synthq.models.sampling import (
    Request,
    nucleus_draw,
    sample_queries,
    shared_prompt_state,
    stop_token_ids,
    top_p_filter,
)
from synthq.privacy.guarantee import Guarantee
from synthq.runtime.errors import ArtifactError, DataError, SynthqError
from synthq.stages import generate
from tests import helpers
from tests.helpers import accounted

GUARANTEE = accounted(epsilon=8.0, delta=1e-5, unit="example", mechanism="dp-adam", accountant="rdp")


def tiny_generator_artifact(model_dir, out, steps: int):
    records = helpers.corpus_records()
    pairs = [(records[d]["text"], q) for d, qs in helpers.TRAIN_QUERIES.items() for q in qs]
    generator = QueryGenerator.load(model_dir)
    torch.manual_seed(0)
    optimizer = torch.optim.Adam(generator.model.parameters(), lr=1e-2)
    batch = generator.training_batch([d for d, _ in pairs], [q for _, q in pairs])
    generator.model.train()
    for _ in range(steps):
        optimizer.zero_grad()
        generator.model(**batch).loss.backward()
        optimizer.step()
    generator.model.eval()
    with create_artifact(out, "finetune-lm", {"model": str(model_dir), "steps": steps}) as writer:
        generator.save(writer.dir)
        writer.privacy = GUARANTEE
    return open_artifact(out, stage="finetune-lm")


@pytest.fixture(scope="module")
def causal_generator(tmp_path_factory, tiny_causal_dir):
    return tiny_generator_artifact(tiny_causal_dir, tmp_path_factory.mktemp("gen") / "causal", steps=60)


@pytest.fixture(scope="module")
def t5_generator(tmp_path_factory, tiny_t5_dir):
    return tiny_generator_artifact(tiny_t5_dir, tmp_path_factory.mktemp("gen") / "t5", steps=80)


@pytest.fixture(params=["causal", "t5"])
def any_generator(request):
    return request.getfixturevalue(f"{request.param}_generator")


def make(tmp_path, artifact, corpus, name, **options):
    return generate.run(
        GenerateConfig(generator=artifact.path, corpus=str(corpus), out=tmp_path / name, **options)
    )


def read(artifact) -> str:
    return (artifact.path / "queries.jsonl").read_text(encoding="utf-8")


def documents() -> list[Request]:
    return [Request(doc_id, doc["text"], 0) for doc_id, doc in helpers.corpus_records().items()]


def test_output_is_a_beir_dir_and_inherits_the_guarantee(tmp_path, causal_generator, tiny_beir):
    from beir.datasets.data_loader import GenericDataLoader

    synthetic = make(tmp_path, causal_generator, tiny_beir, "syn", num_queries=2, batch_size=4)
    corpus, queries, qrels = GenericDataLoader(str(synthetic.path)).load(split="train")
    assert len(corpus) == 12 and len(queries) == 24
    for query_id, docs in qrels.items():
        (doc_id,) = docs
        assert query_id in (f"syn-{doc_id}-0", f"syn-{doc_id}-1") and docs[doc_id] == 1
    assert synthetic.privacy.epsilon == 8.0 and synthetic.privacy.delta == 1e-5
    assert len(synthetic.releases) == 1  # post-processing: the generator's release, once
    assert synthetic.releases == causal_generator.releases
    assert synthetic.inputs[0]["sha256"] == causal_generator.manifest_hash
    assert synthetic.metrics["queries"] == 24 and synthetic.timings["query_tokens_per_second"] > 0


def test_sampling_is_reproducible_and_independent_of_batch_plan(tmp_path, any_generator, tiny_beir):
    first = make(tmp_path, any_generator, tiny_beir, "a", batch_size=4, seed=3, num_queries=2)
    again = make(tmp_path, any_generator, tiny_beir, "b", batch_size=1, seed=3, num_queries=2)
    other = make(tmp_path, any_generator, tiny_beir, "c", batch_size=4, seed=4, num_queries=2)
    assert read(first) == read(again)
    assert read(first) != read(other)
    queries = [json.loads(line)["text"] for line in read(first).splitlines()]
    assert len(set(queries)) > 6  # real, varied sampled queries, not one degenerate string


def test_greedy_batched_equals_one_at_a_time(any_generator):
    """Padding on the wrong side (or positions shifted by left padding) changes greedy outputs."""
    generator = QueryGenerator.load(any_generator.path)
    requests = documents()
    together = sample_queries(generator, requests, 0, 0.8, 1.0, 24, greedy=True)
    alone = [sample_queries(generator, [r], 0, 0.8, 1.0, 24, greedy=True)[0] for r in requests]
    assert together == alone
    assert len(set(together)) >= 8 and all(together)
    expected_side = "left" if generator.kind == "causal" else "right"
    batch = generator.generation_batch([r.document for r in requests])
    padded = batch["attention_mask"][:, 0 if expected_side == "left" else -1]
    assert 0 in padded.tolist()


def test_rows_of_one_document_share_its_prompt_and_sample_the_same_queries(any_generator):
    """--num-queries k: each distinct prompt goes through the model (the encoder, or the KV-cache
    prefill) once, and the sampled queries equal those of encoding every row on its own."""
    generator = QueryGenerator.load(any_generator.path)
    requests = [Request(r.doc_id, r.document, k) for r in documents()[:4] for k in range(3)]
    alone = sample_queries(generator, requests, 5, 0.9, 1.0, 16, share_prompts=False)
    prompt_rows = []
    if generator.kind == "causal":
        module = generator.model
        record = lambda _m, args, kwargs: prompt_rows.append(  # noqa: E731
            kwargs["input_ids"].shape if kwargs["input_ids"].shape[1] > 1 else None
        )
    else:
        module = generator.model.get_encoder()
        record = lambda _m, args, kwargs: prompt_rows.append(kwargs["input_ids"].shape)  # noqa: E731
    handle = module.register_forward_pre_hook(record, with_kwargs=True)
    try:
        shared = sample_queries(generator, requests, 5, 0.9, 1.0, 16)
    finally:
        handle.remove()
    assert shared == alone and len(set(shared)) > 4
    assert [shape[0] for shape in prompt_rows if shape is not None] == [4]  # 4 documents, 12 rows
    batch = generator.generation_batch([r.document for r in requests[:3]])
    assert shared_prompt_state(generator, [r.document for r in requests[:3]], batch)[1]
    apart = generator.generation_batch([r.document for r in requests[::3]])
    assert shared_prompt_state(generator, [r.document for r in requests[::3]], apart) == (apart, {})


def test_prompts_with_a_long_common_beginning_prefill_it_once_and_sample_the_same_queries(causal_generator):
    """Private Evolution's few-shot prompts share two thirds of their tokens: that prefix runs
    once at batch size one, each row's rest after it (laid out prefix | padding | rest), and the
    queries are those of encoding every row on its own; rows of one prompt still share it too."""
    from synthq.models import sampling

    generator = QueryGenerator.load(causal_generator.path)
    shots = " ".join(f"example{i} words about a topic" for i in range(8))  # > 16 tokens in common
    bodies = [r.document for r in documents()[:5]]
    requests = [Request(f"d{i}", f"{shots} {body}", k) for i, body in enumerate(bodies) for k in range(2)]
    requests.append(Request("short", f"{shots} x", 0))  # a rest of a token or two, the widest padding
    alone = sample_queries(generator, requests, 3, 0.9, 1.0, 12, share_prompts=False)
    shapes = []
    record = lambda _m, args, kwargs: shapes.append(tuple(kwargs["input_ids"].shape))  # noqa: E731
    handle = generator.model.register_forward_pre_hook(record, with_kwargs=True)
    try:
        shared = sample_queries(generator, requests, 3, 0.9, 1.0, 12)
    finally:
        handle.remove()
    assert shared == alone and len(set(shared)) > 3
    batch = generator.generation_batch([r.document for r in requests])
    _, prefix = sampling._common_prefix_first(batch)
    assert prefix >= sampling.SHARED_PREFIX_MIN_TOKENS
    rest = batch["input_ids"].shape[1] - prefix - 1
    assert shapes[:2] == [(1, prefix), (6, rest)]  # the prefix once; 6 distinct prompts' rests
    assert all(shape[1] == 1 for shape in shapes[2:])  # then generate's one-token steps
    # prompts without a long common beginning keep the plain left-padded layout
    plain = generator.generation_batch(bodies)
    assert sampling._common_prefix_first(plain) == (plain, 0)


def test_nucleus_draw_follows_the_top_p_distribution():
    """With uniforms on a fine grid, inverse-CDF draws hit each token in proportion to its
    renormalised nucleus probability (top_p_filter + softmax, computed independently)."""
    torch.manual_seed(0)
    logits = torch.randn(3, 50) * 2
    grid = 20_000
    uniforms = (torch.arange(grid, dtype=torch.float64) + 0.5) / grid
    for top_p in (0.3, 0.8, 1.0):
        expected = top_p_filter(logits, top_p).softmax(-1)
        for row in range(3):
            for candidates in ((4,), (2, 8), (256,)):  # small tiers force the wider ones and the full sort
                chosen = nucleus_draw(logits[row].expand(grid, -1), uniforms, top_p, candidates=candidates)
                counts = torch.bincount(chosen, minlength=50).double() / grid
                assert torch.allclose(counts, expected[row].double(), atol=2 / grid)


class ReferenceSampler(LogitsProcessor):
    """The reference for synthq's decoding loop: Hugging Face ``generate`` with each row's token
    drawn from the row's own stream (one uniform a step, every row, every step) and forced as a
    one-hot score."""

    def __init__(self, seeds: list[int], top_p: float, temperature: float):
        self.streams = [torch.Generator().manual_seed(s) for s in seeds]
        self.top_p, self.temperature = top_p, temperature

    def __call__(self, input_ids: torch.LongTensor, scores: torch.FloatTensor) -> torch.FloatTensor:
        uniforms = torch.cat([torch.rand(1, generator=g, dtype=torch.float64) for g in self.streams])
        chosen = nucleus_draw(scores / self.temperature, uniforms, self.top_p)
        return torch.full_like(scores, float("-inf")).scatter_(1, chosen.unsqueeze(1), 0.0)


def reference_queries(generator, requests, seed, top_p, temperature, max_new_tokens, greedy):
    batch = generator.generation_batch([r.document for r in requests])
    seeds = [sampling.row_seed(seed, r.doc_id, r.index, r.attempt) for r in requests]
    processors = [] if greedy else [ReferenceSampler(seeds, top_p, temperature)]
    with torch.inference_mode():
        output = generator.model.generate(
            **batch, do_sample=False, num_beams=1, max_new_tokens=max_new_tokens,
            logits_processor=LogitsProcessorList(processors), pad_token_id=generator.tokenizer.pad_token_id,
            eos_token_id=stop_token_ids(generator), top_p=None, top_k=None, temperature=None,
        )  # fmt: skip
    return generator.decode_new_tokens(output, batch)


@pytest.mark.parametrize("greedy", [True, False])
def test_decoding_gives_hugging_face_generate_queries_with_stopped_rows_dropped(any_generator, greedy):
    """synthq's loop samples what ``generate`` samples with the same per-row draws, while the rows
    that have their query leave the batch (the model sees fewer rows in later steps)."""
    generator = QueryGenerator.load(any_generator.path)
    requests = [Request(r.doc_id, r.document, k) for r in documents() for k in range(2)]
    expected = reference_queries(generator, requests, 7, 0.9, 1.5, 16, greedy)
    rows = []
    module = generator.model if generator.kind == "causal" else generator.model.get_decoder()
    record = lambda _m, args, kwargs: rows.append(kwargs["input_ids"].shape)  # noqa: E731
    handle = module.register_forward_pre_hook(record, with_kwargs=True)
    try:
        ours = sample_queries(generator, requests, 7, 0.9, 1.5, 16, greedy=greedy)
    finally:
        handle.remove()
    assert ours == expected and len(set(ours)) > 4
    steps = [batch for batch, width in rows if width == 1]  # one token a row: decoding steps
    assert steps[0] == len(requests) and steps[-1] < len(requests) and steps == sorted(steps, reverse=True)


def test_each_row_draws_from_its_own_stream():
    torch.manual_seed(0)
    logits = torch.randn(4, 30)
    streams = [torch.Generator().manual_seed(s) for s in (11, 22, 33, 44)]
    uniforms = torch.cat([torch.rand(1, generator=g, dtype=torch.float64) for g in streams])
    together = nucleus_draw(logits, uniforms, 0.9)
    alone = [nucleus_draw(logits[i : i + 1], uniforms[i : i + 1], 0.9).item() for i in range(4)]
    assert together.tolist() == alone


def test_stopping_at_a_newline_changes_no_query(causal_generator, tiny_causal_dir):
    generator = QueryGenerator.load(causal_generator.path)
    stops = stop_token_ids(generator)
    texts = generator.tokenizer.batch_decode([[i] for i in range(len(generator.tokenizer))])
    assert set(stops) == {generator.tokenizer.eos_token_id} | {i for i, t in enumerate(texts) if "\n" in t}
    assert len(stops) > 1
    # An untrained model at high temperature emits newlines mid-query: cut queries must not change.
    untrained = QueryGenerator.load(tiny_causal_dir)
    requests = [Request(r.doc_id, r.document, k) for r in documents() for k in range(4)]
    stopped = sample_queries(untrained, requests, 0, 1.0, 3.0, 24)
    full = sample_queries(untrained, requests, 0, 1.0, 3.0, 24, stop_at_newline=False)
    assert stopped == full


def test_shards_merge_into_the_unsharded_set(tmp_path, causal_generator, tiny_beir):
    whole = make(tmp_path, causal_generator, tiny_beir, "whole", num_queries=2, batch_size=3)
    shards = [
        make(tmp_path, causal_generator, tiny_beir, f"shard{i}", num_queries=2, batch_size=5, shard=f"{i}/3")
        for i in range(3)
    ]
    assert sum(s.metrics["documents"] for s in shards) == 12
    merged = generate.merge([s.path for s in shards], tmp_path / "merged")
    assert read(merged) == read(whole)
    assert (merged.path / "qrels" / "train.tsv").read_text() == (
        whole.path / "qrels" / "train.tsv"
    ).read_text()
    assert (merged.path / "corpus.jsonl").read_text() == (whole.path / "corpus.jsonl").read_text()
    assert merged.privacy == whole.privacy
    assert generate.merge([s.path for s in shards], tmp_path / "merged").manifest_hash == merged.manifest_hash
    with pytest.raises(ArtifactError, match="not exactly"):
        generate.merge([s.path for s in shards[:2]], tmp_path / "incomplete")
    # whole sets were reported as "shards [None, None] are not exactly 0/1 .. 0/1" (fault pass)
    with pytest.raises(ArtifactError, match=r"whole synthetic set \(generated without --shard\)"):
        generate.merge([whole.path, whole.path], tmp_path / "wholes")
    other_seed = make(tmp_path, causal_generator, tiny_beir, "s2", num_queries=2, shard="2/3", seed=9)
    with pytest.raises(ArtifactError, match="different settings"):
        generate.merge([shards[0].path, shards[1].path, other_seed.path], tmp_path / "mixed")
    with pytest.raises(ArtifactError, match="--force"):
        generate.merge([s.path for s in shards], whole.path)
    assert read(generate.merge([s.path for s in shards], whole.path, force=True)) == read(whole)


def test_documents_stream_in_chunks_with_the_same_queries(tmp_path, causal_generator, tiny_beir, monkeypatch):
    """generate reads and length-sorts GENERATION_CHUNK documents at a time (memory bounded by a
    chunk, not the corpus); the chunking changes no query and no file of the artifact."""
    whole = make(tmp_path, causal_generator, tiny_beir, "whole", num_queries=2, batch_size=4)
    planned = []
    original = generate.length_sorted_batches

    def recording(requests, *args, **kwargs):
        planned.append(len({r.doc_id for r in requests}))
        return original(requests, *args, **kwargs)

    monkeypatch.setattr(generate, "GENERATION_CHUNK", 5)
    monkeypatch.setattr(generate, "length_sorted_batches", recording)
    chunked = make(tmp_path, causal_generator, tiny_beir, "chunked", num_queries=2, batch_size=4)
    assert planned == [5, 5, 2]  # 12 documents
    for name in ("queries.jsonl", "corpus.jsonl", "qrels/train.tsv"):
        assert (chunked.path / name).read_text() == (whole.path / name).read_text()


def test_resume_skips_finished_documents(tmp_path, causal_generator, tiny_beir, monkeypatch):
    reference = make(tmp_path, causal_generator, tiny_beir, "reference", batch_size=2)
    calls = {"n": 0}
    original = sampling.sample_queries

    def flaky(*args, **kwargs):
        calls["n"] += 1
        if calls["n"] == 3:
            raise KeyboardInterrupt
        return original(*args, **kwargs)

    monkeypatch.setattr(sampling, "sample_queries", flaky)
    config = GenerateConfig(
        generator=causal_generator.path, corpus=str(tiny_beir), out=tmp_path / "r", batch_size=2
    )
    with pytest.raises(KeyboardInterrupt):
        generate.run(config)
    assert not config.out.exists() and partial_dir(config.out).exists()
    with pytest.raises(ArtifactError, match="other settings"):
        generate.run(config.model_copy(update={"resume": True, "seed": 5}))
    calls["n"] = -100
    # A different batch size is fine: sampling is per document.
    resumed = generate.run(config.model_copy(update={"resume": True, "generation_batch_size": 3}))
    assert calls["n"] == -100 + 3  # only the 8 unfinished documents ran, in batches of 3
    assert read(resumed) == read(reference)


def test_degenerate_queries_are_resampled_and_counted(tmp_path, causal_generator, tiny_beir, monkeypatch):
    original = sampling.sample_queries

    def punctuation_first(generator, requests, *args, **kwargs):
        texts = original(generator, requests, *args, **kwargs)
        return [
            "?!" if r.attempt < 2 and r.doc_id.startswith("egg") else t
            for r, t in zip(requests, texts, strict=True)
        ]

    monkeypatch.setattr(sampling, "sample_queries", punctuation_first)
    fixed = make(tmp_path, causal_generator, tiny_beir, "fixed", max_resample=3)
    assert fixed.metrics["resampled"] == 3 and fixed.metrics["dropped_degenerate"] == 0
    assert "?!" not in read(fixed)
    dropped = make(tmp_path, causal_generator, tiny_beir, "dropped", max_resample=1)
    assert dropped.metrics["dropped_degenerate"] == 3 and dropped.metrics["queries"] == 9
    assert "syn-egg" not in read(dropped)


def test_private_queries_are_never_read(tmp_path, causal_generator, tiny_beir):
    """Only corpus.jsonl and the split's qrels are opened: unreadable query text changes nothing."""
    public = shutil.copytree(tiny_beir, tmp_path / "public-data")
    (public / "queries.jsonl").write_bytes(b"\xff\xfe not json, not utf-8 \x00")
    reference = make(tmp_path, causal_generator, tiny_beir, "reference")
    assert read(make(tmp_path, causal_generator, public, "public")) == read(reference)


def test_split_and_all_select_documents(tmp_path, causal_generator, tiny_beir):
    test_split = make(tmp_path, causal_generator, tiny_beir, "test", split="test")
    queries = [json.loads(line)["_id"] for line in read(test_split).splitlines()]
    assert queries == sorted(f"syn-{d}-0" for d in helpers.TEST_QUERIES)
    everything = make(tmp_path, causal_generator, tiny_beir, "all", split=None, limit=5)
    assert everything.metrics["documents"] == 5


def test_cli_shards_and_merge(tmp_path, causal_generator, tiny_beir):
    from typer.testing import CliRunner

    from synthq.cli.app import app

    runner = CliRunner()
    common = ["generate", "--generator", str(causal_generator.path), "--corpus", str(tiny_beir)]
    for i in range(2):
        result = runner.invoke(app, [*common, "--shard", f"{i}/2", "--out", str(tmp_path / f"s{i}")])
        assert result.exit_code == 0, result.output
    result = runner.invoke(
        app, ["generate", "--merge", str(tmp_path / "s0"), "--merge", str(tmp_path / "s1"), "--out",
              str(tmp_path / "m")]
    )  # fmt: skip
    assert result.exit_code == 0, result.output
    assert "12 synthetic queries for 12 documents" in result.output and "ε=8.00" in result.output
    assert read(open_artifact(tmp_path / "m")) == read(make(tmp_path, causal_generator, tiny_beir, "whole"))


def test_bad_input(tmp_path, causal_generator, tiny_beir):
    with pytest.raises(SynthqError, match="no such model directory"):  # neither an artifact nor a model
        make(tmp_path, type("A", (), {"path": tmp_path / "nope"})(), tiny_beir, "x")
    with pytest.raises(ValueError, match="i/n"):  # the config refuses it before any work
        make(tmp_path, causal_generator, tiny_beir, "x", shard="two")
    with pytest.raises(ValueError, match="0 <= i < n"):
        make(tmp_path, causal_generator, tiny_beir, "x", shard="3/3")
    with pytest.raises(DataError, match="no qrels for split 'nope'"):
        make(tmp_path, causal_generator, tiny_beir, "x", split="nope")
    with pytest.raises(SynthqError, match="needs the shard"):
        generate.merge([], tmp_path / "x")
    wrong_stage = tmp_path / "wrong"
    with create_artifact(wrong_stage, "eval", {}) as writer:
        (writer.dir / "x").write_text("x")
        writer.privacy = Guarantee(epsilon=math.inf)
    with pytest.raises(ArtifactError, match="expected 'finetune-lm'"):
        make(tmp_path, open_artifact(wrong_stage), tiny_beir, "x")


def test_a_public_model_writes_the_eps_0_control(tmp_path, tiny_causal_dir, tiny_beir):
    """--generator a public model (a local directory, not an artifact): no private data read, ε = 0,
    the model recorded with its public-by-assumption note; the same queries on a second run."""
    config = GenerateConfig(generator=tiny_causal_dir, corpus=str(tiny_beir), out=tmp_path / "zero", seed=3)
    control = generate.run(config)
    assert control.privacy.epsilon == 0 and control.releases == []
    assert any("is public" in a for a in control.privacy.assumptions)
    assert control.inputs[0]["kind"] == "model" and control.metrics["queries"] == 12
    again = generate.run(config.model_copy(update={"out": tmp_path / "again"}))
    assert read(again) == read(control)


def test_few_shot_prompts_show_public_pairs_and_refuse_private_ones(tmp_path, tiny_causal_dir, tiny_beir):
    from synthq.runtime.errors import PrivacyError

    config = GenerateConfig(
        generator=tiny_causal_dir, corpus=str(tiny_beir), out=tmp_path / "fs", few_shot=f"{tiny_beir}:test",
        few_shot_examples=2, seed=1,
    )  # fmt: skip
    examples, record = generate.few_shot_pairs(config)
    test_queries = set(helpers.TEST_QUERIES.values())
    assert len(examples) == 2 and {query for _, query in examples} <= test_queries
    assert record["role"] == "few-shot examples" and record["split"] == "test"
    few_shot = generate.run(config)
    assert few_shot.privacy.epsilon == 0 and any(
        i.get("role") == "few-shot examples" for i in few_shot.inputs
    )
    generator = generate._load_generator(
        config, type("Start", (), {"path": tiny_causal_dir, "artifact": None}), "cpu"
    )
    prompt = generator.source_text("a document with {braces}")
    assert prompt.count("Search query:") == 3 and all(query in prompt for _, query in examples)
    assert prompt.endswith("Document: a document with {braces}\nSearch query:")
    with pytest.raises(PrivacyError, match="not declared public"):
        generate.run(config.model_copy(update={"few_shot": f"{tiny_beir}:train", "out": tmp_path / "p"}))
    with pytest.raises(DataError, match="SOURCE:SPLIT"):
        generate.few_shot_pairs(config.model_copy(update={"few_shot": "test"}))


def test_few_shot_is_refused_for_a_trained_generator(tmp_path, causal_generator, tiny_beir):
    with pytest.raises(DataError, match="public causal model"):
        make(tmp_path, causal_generator, tiny_beir, "x", few_shot=f"{tiny_beir}:test")

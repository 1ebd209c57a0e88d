"""Defaults that fit the machine and the data (finetune-lm, generate): the document length comes
from the public corpus's documents only, an explicit value wins, the values chosen are in the
manifest's config and in the stage's first line, and a rerun of the same command is up to date."""

from __future__ import annotations

import json
import shutil

import pytest

from synthq.config.fields import DEFAULT_DOCUMENT_TOKENS, DEFAULT_QUERY_TOKENS
from synthq.config.generator import FinetuneConfig, GenerateConfig
from synthq.data.beir_io import read_corpus
from synthq.models.defaults import CPU_TOKEN_BUDGET, PHYSICAL_BATCH, document_token_length, quantile_length
from synthq.models.generator import QueryGenerator
from synthq.stages import finetune_lm, generate


def finetune_config(tmp_path, beir, model, name="gen", **options) -> FinetuneConfig:
    base = dict(batch_size=4, max_steps=1, epsilon="inf", lr=1e-3, seed=0)
    return FinetuneConfig(data=str(beir), model=str(model), out=tmp_path / name, **{**base, **options})


def with_long_private_queries(tmp_path, beir):
    """The same corpus, but every private (train) query hundreds of tokens long."""
    root = tmp_path / "long-queries"
    shutil.copytree(beir, root)
    lines = (root / "queries.jsonl").read_text().splitlines()
    rows = [json.loads(line) for line in lines]
    for row in rows:
        if row["_id"].startswith("tr-"):
            row["text"] = " ".join([row["text"]] * 60)
    (root / "queries.jsonl").write_text("\n".join(json.dumps(row) for row in rows) + "\n")
    return root


def test_quantile_length_rounds_up_and_caps():
    assert quantile_length(list(range(1, 101)), cap=384) == 96  # p95 = 95 -> 96
    assert quantile_length([3, 4, 5], cap=384) == 16  # at least one multiple
    assert quantile_length([1000] * 10, cap=384) == 384
    assert quantile_length([], cap=128) == 128


def test_document_length_reads_the_documents_only(tmp_path, tiny_beir, tiny_causal_dir, capsys):
    short = finetune_lm.run(finetune_config(tmp_path, tiny_beir, tiny_causal_dir, "short"))
    long_root = with_long_private_queries(tmp_path, tiny_beir)
    long = finetune_lm.run(finetune_config(tmp_path, long_root, tiny_causal_dir, "long"))
    generator = QueryGenerator.load(tiny_causal_dir)
    expected = document_token_length(generator.tokenizer, read_corpus(tiny_beir / "corpus.jsonl"), 384)
    assert expected < DEFAULT_DOCUMENT_TOKENS
    for artifact in (short, long):
        assert artifact.config["max_source_length"] == expected  # the queries changed nothing
        assert artifact.config["max_target_length"] == DEFAULT_QUERY_TOKENS
        assert artifact.config["physical_batch_size"] == PHYSICAL_BATCH["cpu"]  # tests see no GPU
    assert QueryGenerator.load(long.path).max_source_length == expected  # what generate will use
    first = capsys.readouterr().err.splitlines()[0]
    assert first.startswith(f"defaults: lengths {expected}/{DEFAULT_QUERY_TOKENS} (p95 of the public corpus")
    assert "physical batch 8 (cpu profile" in first


def test_a_log_without_declarations_reads_its_public_corpus_and_long_documents_fit(
    tmp_path, tiny_beir, tiny_causal_dir, capsys
):
    root = tmp_path / "log"
    shutil.copytree(tiny_beir, root)
    (root / "privacy.json").unlink()  # a query log with no declaration: every split private
    artifact = finetune_lm.run(finetune_config(tmp_path, root, tiny_causal_dir, profile="gpu"))
    generator = QueryGenerator.load(tiny_causal_dir)
    expected = document_token_length(generator.tokenizer, read_corpus(root / "corpus.jsonl"), 384)
    assert artifact.config["max_source_length"] == expected < DEFAULT_DOCUMENT_TOKENS
    assert artifact.config["physical_batch_size"] == PHYSICAL_BATCH["gpu"]
    first = capsys.readouterr().err.splitlines()[0]
    assert "documents are public in synthq's model" in first and "(gpu profile)" in first
    # on a CPU, long documents take smaller micro-batches (a bounded number of tokens each)
    long_documents = dict(profile="cpu", max_source_length=384)
    cpu = finetune_lm.run(finetune_config(tmp_path, root, tiny_causal_dir, "cpu", **long_documents))
    assert cpu.config["physical_batch_size"] == CPU_TOKEN_BUDGET // (384 + 32 + 16) == 2


def test_explicit_values_win_and_a_rerun_is_up_to_date(tmp_path, tiny_beir, tiny_causal_dir, capsys):
    options = dict(max_source_length=24, max_target_length=8, physical_batch_size=3)
    artifact = finetune_lm.run(finetune_config(tmp_path, tiny_beir, tiny_causal_dir, **options))
    assert {k: artifact.config[k] for k in options} == options
    assert "defaults:" not in capsys.readouterr().err
    chosen = finetune_lm.run(finetune_config(tmp_path, tiny_beir, tiny_causal_dir, "chosen"))
    written = (chosen.path / "manifest.json").stat().st_mtime_ns
    again = finetune_lm.run(finetune_config(tmp_path, tiny_beir, tiny_causal_dir, "chosen"))
    assert (again.path / "manifest.json").stat().st_mtime_ns == written  # skipped: the same options
    assert again.config["physical_batch_size"] == PHYSICAL_BATCH["cpu"]


@pytest.mark.parametrize("profile", ["cpu", "gpu"])
def test_generate_records_its_batch(tmp_path, tiny_beir, tiny_causal_dir, profile, capsys):
    generator = finetune_lm.run(finetune_config(tmp_path, tiny_beir, tiny_causal_dir))
    config = GenerateConfig(
        generator=generator.path, corpus=str(tiny_beir), out=tmp_path / "syn", limit=3, profile=profile
    )
    artifact = generate.run(config)
    prompt = QueryGenerator.load(generator.path).max_source_length
    expected = {"cpu": min(96, 8192 // (prompt + 16 + config.max_new_tokens)), "gpu": 64}[profile]
    assert artifact.config["generation_batch_size"] == expected
    assert f"batch {expected} documents ({profile} profile" in capsys.readouterr().err


def test_a_cpu_generation_batch_holds_a_bounded_number_of_tokens():
    from synthq.models.defaults import CPU_GENERATION_TOKENS, generation_batch

    assert generation_batch("cpu", 80, 32) == CPU_GENERATION_TOKENS // (80 + 16 + 32) == 64
    assert generation_batch("cpu", 384, 32) == CPU_GENERATION_TOKENS // (384 + 16 + 32) == 18
    assert generation_batch("cpu", 8, 8) == 96  # short prompts: capped
    assert generation_batch("cpu", 100_000, 32) == 1
    assert generation_batch("gpu", 384, 32) == 64


@pytest.mark.parametrize("epsilon", ["inf", 8.0])
def test_finetune_progress_moves_within_a_step(
    tmp_path, tiny_beir, tiny_causal_dir, epsilon, capsys, monkeypatch
):
    monkeypatch.setenv("SYNTHQ_PROGRESS_INTERVAL", "0")  # a plain line at every update
    options = dict(batch_size=8, physical_batch_size=2, epsilon=epsilon)
    artifact = finetune_lm.run(finetune_config(tmp_path, tiny_beir, tiny_causal_dir, **options))
    lines = [line for line in capsys.readouterr().err.splitlines() if line.startswith("finetune-lm")]
    done = [float(line.split(": ", 1)[1].split("/", 1)[0]) for line in lines]
    assert len(done) >= 3 and 0 < done[0] < 1 and done[-1] == 1  # micro-batches, then the step
    assert done[-2] < 1 and done.count(1) == 1  # the step is completed once, by the step itself
    assert "eta=" in lines[0] and "eta=?" not in lines[0]  # an ETA from the first micro-batch
    if epsilon != "inf":  # the line that completes the step shows the ε after it
        assert lines[-1].startswith(f"finetune-lm ε {artifact.privacy.epsilon:.2f}: 1/1")


def test_a_cpu_retriever_batch_too_large_for_memory_trains_in_gradcache_chunks(
    tmp_path, tiny_beir, tiny_encoder_dir, capsys, monkeypatch
):
    """First hour on long documents: a non-private CPU step held the whole batch's activations (9.3
    GB at 32 × 384 tokens). Unset --mini-batch-size now chooses GradCache chunks from the public
    corpus's p95 document length and a public query length; recorded, said, and a rerun is up
    to date. An explicit value wins; --dp never chunks."""
    from synthq.models import defaults
    from synthq.models.encoder import load_encoder
    from synthq.stages import train_retriever
    from tests.helpers import retriever_config

    monkeypatch.setattr(defaults, "CPU_RETRIEVER_TOKENS", 100)
    length = document_token_length(
        load_encoder(tiny_encoder_dir).tokenizer, read_corpus(tiny_beir / "corpus.jsonl"), 32
    )
    expected = max(1, 100 // (16 + length))  # queries: min(public 32, --max-query-length 16)
    config = retriever_config(tmp_path / "r", tiny_beir, tiny_encoder_dir)
    capsys.readouterr()
    artifact = train_retriever.run(config)
    assert artifact.config["mini_batch_size"] == expected < config.batch_size
    assert f"defaults: GradCache in chunks of {expected} (cpu:" in capsys.readouterr().err
    manifest = (artifact.path / "manifest.json").read_bytes()
    assert train_retriever.run(config).path == artifact.path
    assert (artifact.path / "manifest.json").read_bytes() == manifest  # up to date: not redone
    explicit = train_retriever.run(
        retriever_config(tmp_path / "e", tiny_beir, tiny_encoder_dir, mini_batch_size=3)
    )
    assert explicit.config["mini_batch_size"] == 3
    private = train_retriever.run(
        retriever_config(tmp_path / "dp", tiny_beir, tiny_encoder_dir, dp="group", epsilon=8, batch_size=8)
    )
    assert private.config["mini_batch_size"] is None


def test_the_retriever_pass_size_is_a_pure_function_of_public_lengths():
    from synthq.config.retriever import TrainRetrieverConfig
    from synthq.models.defaults import CPU_RETRIEVER_TOKENS, retriever_defaults

    config = TrainRetrieverConfig(out="o", data="d", max_doc_length=384)  # batch 32, --max-query-length 128
    assert retriever_defaults(config, "cpu", 1, lambda cap: 384, None).values == {
        "mini_batch_size": CPU_RETRIEVER_TOKENS // 416
    }
    assert retriever_defaults(config, "cpu", 1, lambda cap: 80, None).values == {}  # 32 × 112 fit: one pass
    assert retriever_defaults(config, "cuda", 1, lambda cap: 384, None).values == {}
    assert retriever_defaults(config, "cpu", 2, lambda cap: 384, None).values == {}  # torchrun shards instead
    negatives = config.model_copy(update={"hard_negatives": 2})
    assert retriever_defaults(negatives, "cpu", 1, lambda cap: 384, None).values == {
        "mini_batch_size": CPU_RETRIEVER_TOKENS // 1184
    }


def test_an_unset_document_length_is_chosen_by_device_within_the_encoder_positions():
    """Long documents on a CPU: the retriever reads at most 128 tokens (the length MiniLM-L6 was
    trained at; 384 on a GPU) unless told, never more than the encoder has positions, and the
    corpus's p95 is asked within that cap."""
    from synthq.config.fields import RETRIEVER_DOCUMENT_TOKENS
    from synthq.config.retriever import TrainRetrieverConfig
    from synthq.models.defaults import CPU_RETRIEVER_TOKENS, retriever_defaults

    config = TrainRetrieverConfig(out="o", data="d")
    asked = []
    chosen = retriever_defaults(config, "cpu", 1, lambda cap: asked.append(cap) or cap, None).values
    assert chosen["max_doc_length"] == RETRIEVER_DOCUMENT_TOKENS["cpu"] == asked[0] == 128
    assert chosen["mini_batch_size"] == CPU_RETRIEVER_TOKENS // (32 + 128)
    assert retriever_defaults(config, "cuda", 1, lambda cap: cap, None).values == {"max_doc_length": 384}
    assert retriever_defaults(config, "cuda", 1, lambda cap: cap, 128).values == {"max_doc_length": 128}
    dp = config.model_copy(update={"dp": "group"})
    assert retriever_defaults(dp, "cpu", 1, lambda cap: cap, None).values == {"max_doc_length": 128}


@pytest.mark.parametrize(("profile", "cap"), [("cpu", 128), ("gpu", DEFAULT_DOCUMENT_TOKENS)])
def test_a_generator_on_long_documents_reads_at_most_the_profile_cap(tiny_causal_dir, profile, cap):
    """First hour on long documents: on the cpu profile the generator reads at most 128 document
    tokens unless told (fine-tuning and generation of 700-token documents took hours on 2 cores),
    the paper's 384 on a GPU; short documents keep their own p95; an explicit value wins."""
    from synthq.config.fields import CPU_DOCUMENT_TOKENS
    from synthq.models.defaults import finetune_defaults

    tokenizer = QueryGenerator.load(tiny_causal_dir).tokenizer
    long_corpus = {f"d{i}": {"title": "", "text": " ".join(["word"] * 900)} for i in range(20)}
    short_corpus = {f"d{i}": {"title": "", "text": "a short document"} for i in range(20)}
    config = FinetuneConfig(data="d", model="m", out="o", profile=profile)
    chosen = finetune_defaults(config, tokenizer, long_corpus, "public", "cpu")
    assert chosen.values["max_source_length"] == cap and CPU_DOCUMENT_TOKENS == 128
    assert f"at most {cap} ({profile} profile)" in chosen.line()
    short = finetune_defaults(config, tokenizer, short_corpus, "public", "cpu").values["max_source_length"]
    assert short == document_token_length(tokenizer, short_corpus, 10_000) < 128
    explicit = config.model_copy(update={"max_source_length": 300})
    given = finetune_defaults(explicit, tokenizer, long_corpus, "public", "cpu")
    assert "max_source_length" not in given.values

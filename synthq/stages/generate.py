"""``synthq generate``: synthetic queries for public documents from a (DP) generator.

Stage 2 of Carranza et al.: for every selected document, ``--num-queries`` queries by nucleus
sampling (paper: top-p 0.8). The output is a BEIR directory — ``corpus.jsonl`` (the documents
that received queries), ``queries.jsonl`` (ids ``syn-<docid>-<k>``) and ``qrels/train.tsv`` —
so any BEIR tool, and ``synthq train-retriever``, reads it.

Privacy: the stage reads the generator and public documents only, so the artifact inherits the
generator's guarantee by post-processing. Which documents get queries must not depend on private
data either: by default every document of the public corpus, or an explicit public list
(``--documents FILE``). ``--split S`` selects the documents judged in a qrels split instead —
for a private split that set is itself a function of the private data (removing a pair can
remove its document from the release), so it is allowed only as a named assumption ("the
judged-document set of split S is public", the paper's MS MARCO setting) that the guarantee
records and every report prints.

A public model as ``--generator`` (an alias, hub id or local directory that is not a synthq
artifact) writes queries with no private data at all: the ε = 0 control that says how much of a
synthetic set's value came from the private log. ``--few-shot SOURCE:SPLIT`` shows a causal public
model ``--few-shot-examples`` public pairs in every prompt (InPars, Bonifacio et al. 2022); the
split must be declared public (fail closed), and the examples are drawn with the recorded seed.
The artifact is public (ε = 0), with the model's public-by-assumption note when it is not a
packaged alias.

Sampling is reproducible per document (see :mod:`synthq.models.sampling`), so ``--shard i/n`` runs
merged with ``--merge`` equal one unsharded run, and ``--resume`` continues from the documents
already finished. Under ``torchrun`` one command does both: each rank generates its shard and
rank 0 merges them (:func:`run_over_ranks`).
"""

from __future__ import annotations

import contextlib
import json
import random
import time
from collections import ChainMap
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from synthq.artifacts.create import create_artifact
from synthq.artifacts.freshness import (
    config_fingerprint,
    existing_result,
    find_up_to_date,
    fingerprint_matches,
)
from synthq.artifacts.locking import check_output_free
from synthq.artifacts.manifest import Artifact, open_artifact
from synthq.artifacts.process_state import may_replace, owned_by_pipeline
from synthq.bookkeeping.inputs import artifact_input, model_input, public_documents_input, public_pairs_input
from synthq.config.generator import GenerateConfig
from synthq.data.arrow_views import Corpus
from synthq.data.beir_io import read_corpus, read_qrels, read_queries
from synthq.data.pairs import document_text
from synthq.data.sources import resolve_source
from synthq.data.synthetic import (
    public_documents,
    write_synthetic,
)
from synthq.models.defaults import generate_defaults
from synthq.models.generator import QueryGenerator
from synthq.models.sampling import Request, length_sorted_batches, sample_with_retries
from synthq.models.stage_costs import expected_line, generation_seconds, parameter_count
from synthq.runtime import distributed, precision
from synthq.runtime.console import info, progress, warn
from synthq.runtime.errors import ArtifactError, DataError, SynthqError

STAGE = "generate"
FEW_SHOT_TOKENS = 96  # an example's document in a few-shot prompt, in tokens
# Documents whose texts (and prompt lengths, for length-sorted batches) are held at once.
GENERATION_CHUNK = 8192
PROGRESS_FILE = "done.jsonl"
FINGERPRINT_FILE = "fingerprint.txt"


def parse_shard(shard: str | None) -> tuple[int, int]:
    if shard is None:
        return 0, 1
    try:
        index, count = (int(x) for x in shard.split("/"))
    except ValueError:
        raise SynthqError(f"--shard must look like i/n (e.g. 0/4), got {shard!r}") from None
    if not (count >= 1 and 0 <= index < count):
        raise SynthqError(f"--shard {shard}: need 0 <= i < n")
    return index, count


def select_documents(config: GenerateConfig, root: Path) -> tuple[Corpus, list[str]]:
    """The public documents to generate for (:func:`synthq.data.synthetic.public_documents`),
    after ``--limit`` and ``--shard``. Returns the memory-mapped corpus and the selected ids;
    texts are read chunk by chunk while generating (:func:`_generate_for`), never all at once."""
    corpus, ids = public_documents(root, config.documents, config.split)
    if config.limit is not None:
        ids = ids[: config.limit]
    index, count = parse_shard(config.shard)
    selected = ids[index::count]
    if not selected:
        raise DataError("no documents selected for generation", root)
    return corpus, selected


def _generate_for(
    generator: QueryGenerator,
    corpus: Corpus,
    doc_ids: list[str],
    config: GenerateConfig,
    done: dict,
    log_path: Path,
) -> dict:
    """Fill ``done[(doc_id, k)] = {"query", "attempts"}`` batch by batch, appending to the log.

    Documents are read and length-sorted ``GENERATION_CHUNK`` at a time, so memory holds one
    chunk's texts whatever the corpus size (sampling is per document, so the chunking changes
    no query). Within a chunk the longest batch runs first (memory peaks early) and the others in
    a fixed mixed order, so the progress rate and ETA hold from the start."""
    total = sum(1 for doc_id in doc_ids for k in range(config.num_queries) if (doc_id, k) not in done)
    with progress() as bar, open(log_path, "a", encoding="utf-8") as log:
        task = bar.add_task("generating queries", total=total)
        for start in range(0, len(doc_ids), GENERATION_CHUNK):
            pending = [
                Request(doc_id, document_text(corpus[doc_id]), k)
                for doc_id in doc_ids[start : start + GENERATION_CHUNK]
                for k in range(config.num_queries)
                if (doc_id, k) not in done
            ]
            for batch in length_sorted_batches(pending, generator, config.generation_batch_size, mixed=True):
                for (doc_id, index), result in sample_with_retries(
                    generator,
                    batch,
                    config.seed,
                    config.top_p,
                    config.temperature,
                    config.max_new_tokens,
                    config.max_resample,
                ).items():
                    done[(doc_id, index)] = result
                    log.write(json.dumps({"doc_id": doc_id, "index": index, **result}) + "\n")
                log.flush()
                bar.advance(task, len(batch))
    return done


def _resume_settings(config: GenerateConfig) -> dict:
    """What a resumed run must share with the interrupted one, with its input hashes: every setting
    that changes a query (not the batch size or device: sampling is per document)."""
    return config.model_dump(mode="json", exclude={"generation_batch_size", "device", "profile"})


def resume_key(config: GenerateConfig, inputs: list[dict]) -> str:
    """The fingerprint of :func:`_resume_settings` and the inputs, written beside the progress log."""
    return config_fingerprint(_resume_settings(config), inputs)


def _resume_state(checkpoint_dir: Path, config: GenerateConfig, inputs: list[dict]) -> dict:
    """Queries an interrupted run with the same settings and inputs finished; refuses to mix
    in the log of a run with other settings (say another seed), which would silently change
    the set."""
    recorded = checkpoint_dir / FINGERPRINT_FILE
    log = checkpoint_dir / PROGRESS_FILE
    written = recorded.read_text(encoding="utf-8").strip() if recorded.is_file() else None
    if log.is_file() and not fingerprint_matches(written, _resume_settings(config), inputs):
        raise ArtifactError(
            f"{log}: the interrupted run used other settings or inputs; "
            "rerun with those settings, or drop --resume to start over"
        )
    return _read_log(log)


def _read_log(path: Path) -> dict:
    """The finished queries in the progress log. A line a killed process left unfinished (no
    newline) is cut off the file, so appending goes on from the last whole line."""
    done = {}
    if path.is_file():
        data = path.read_bytes()
        complete = data[: data.rfind(b"\n") + 1]
        if len(complete) != len(data):
            with open(path, "r+b") as handle:
                handle.truncate(len(complete))
        for line in complete.decode("utf-8").splitlines():
            if line.strip():
                row = json.loads(line)
                done[(row["doc_id"], row["index"])] = {"query": row["query"], "attempts": row["attempts"]}
    return done


def merge(shards: list[Path], out: Path, force: bool = False) -> Artifact:
    """Merge ``--shard i/n`` artifacts into one synthetic set, equal to an unsharded run.

    The shards must be exactly ``0/n .. n-1/n`` of one run: same generator and corpus (by
    hash), same sampling settings (batch size and device may differ; sampling is per
    document) and the same guarantee, which the merged set keeps (it is the union of
    post-processing outputs of one generator)."""
    if not shards:
        raise SynthqError("--merge needs the shard artifacts to merge")
    artifacts = [artifact_input(path, stage=STAGE) for path in shards]
    configs = [dict(a.config) for a in artifacts]
    whole = [str(a.path) for a, c in zip(artifacts, configs, strict=True) if c.get("shard") is None]
    if whole:  # parse_shard reads no --shard as 0/1: the message would have said "shards [None, None]"
        raise ArtifactError(
            f"{', '.join(whole)}: a whole synthetic set (generated without --shard); --merge joins the "
            "shards 0/n .. n-1/n of one run generated with --shard i/n"
        )
    shard_ids = sorted(parse_shard(c.get("shard")) for c in configs)
    count = shard_ids[0][1]
    if shard_ids != [(i, count) for i in range(count)]:
        raise ArtifactError(
            f"shards {[c.get('shard') for c in configs]} are not exactly 0/{count} .. {count - 1}/{count}"
        )
    free = ("shard", "out", "force", "resume", "generation_batch_size", "batch_size", "device", "profile")
    comparable = [{k: v for k, v in c.items() if k not in free} for c in configs]
    if any(c != comparable[0] for c in comparable):
        raise ArtifactError("the shards were generated with different settings")
    input_hashes = [sorted(record["sha256"] for record in a.inputs) for a in artifacts]
    if any(hashes != input_hashes[0] for hashes in input_hashes):
        raise ArtifactError("the shards were generated from different generators or corpora")
    if len({tuple(sorted(r["id"] for r in a.releases)) for a in artifacts}) != 1:
        raise ArtifactError("the shards carry different privacy guarantees")
    merged_config = {**comparable[0], "shard": None, "out": str(out), "merged_from": count}
    inputs = [a.input_record() for a in artifacts]
    if not force and (existing := find_up_to_date(out, STAGE, merged_config, inputs)) is not None:
        return existing
    check_output_free(out, may_replace(out, force), inputs)
    with create_artifact(out, STAGE, merged_config, inputs) as writer:
        corpus, done = ChainMap(*[read_corpus(a.path / "corpus.jsonl") for a in artifacts]), {}
        for artifact in artifacts:
            queries = read_queries(artifact.path / "queries.jsonl")
            for query_id, docs in read_qrels(artifact.path / "qrels" / "train.tsv").items():
                for doc_id in docs:
                    index = int(query_id.rsplit("-", 1)[1])
                    done[(doc_id, index)] = {"query": queries[query_id], "attempts": 1}
        statistics = write_synthetic(writer.dir, corpus, done)
        for key in ("resampled", "dropped_degenerate"):
            statistics[key] = sum(a.metrics.get(key, 0) for a in artifacts)
        writer.metrics.update(statistics)
        writer.timings["shard_generate_seconds"] = [a.timings.get("generate_seconds") for a in artifacts]
        for artifact in artifacts:
            writer.inherit(artifact)
    return open_artifact(out, STAGE)


def run_over_ranks(config: GenerateConfig) -> Artifact:
    """Under torchrun: rank ``r`` of ``N`` generates shard ``r/N`` (its own resumable artifact in
    ``.<out>.shards/``), then rank 0 merges the shards into ``out``, equal to a one-process run.

    After a worker dies, rerunning the same command skips the finished shards, resumes the
    unfinished ones from their last logged document, and merges; a rerun after success only
    verifies that everything is up to date."""
    place = distributed.topology()
    out = Path(config.out)
    shard_root = out.parent / f".{out.name}.shards"
    shard_paths = [shard_root / f"shard-{rank}-of-{place.world_size}" for rank in range(place.world_size)]
    mine = config.model_copy(
        update={"shard": f"{place.rank}/{place.world_size}", "out": shard_paths[place.rank], "resume": True}
    )
    with contextlib.ExitStack() as owned:
        if may_replace(out, force=False):  # a pipeline owns out, so the shards it is made of too
            owned.enter_context(owned_by_pipeline(*shard_paths))
        run(mine)
    distributed.barrier()
    return distributed.on_main(merge, shard_paths, out, force=config.force)


def few_shot_pairs(config: GenerateConfig) -> tuple[list[tuple[str, str]], dict]:
    """``--few-shot SOURCE:SPLIT``: ``few_shot_examples`` (document, query) pairs of a split the
    source declares public, drawn with the config's seed, and the input record of that source."""
    public = public_pairs_input(str(config.few_shot), "--few-shot")
    if len(public.pairs) < config.few_shot_examples:
        raise DataError(
            f"--few-shot: split {public.split!r} has {len(public.pairs)} pairs, "
            f"fewer than {config.few_shot_examples}"
        )
    chosen = random.Random(config.seed).sample(range(len(public.pairs)), config.few_shot_examples)
    examples = [(public.pairs[i].document, public.pairs[i].query) for i in sorted(chosen)]
    return examples, {**public.record, "role": "few-shot examples", "assumption": public.assumption}


def few_shot_template(examples: list[tuple[str, str]], template: str, tokenizer, max_tokens: int) -> str:
    """``template`` preceded by each example written in it with its query (documents cut to
    ``max_tokens`` tokens; braces escaped, so only the last ``{document}`` is filled)."""
    shown = []
    for document, query in examples:
        ids = tokenizer(document, add_special_tokens=False)["input_ids"][:max_tokens]
        text = template.format(document=tokenizer.decode(ids)) + " " + " ".join(query.split()) + "\n\n"
        shown.append(text.replace("{", "{{").replace("}", "}}"))
    return "".join(shown) + template


def _load_generator(
    config: GenerateConfig, start, device: str, examples: list[tuple[str, str]] | None = None
) -> QueryGenerator:
    """The generator: a finetune-lm artifact as trained, or a public model (with the few-shot
    prompt of ``examples`` when ``--few-shot`` asks for one)."""
    generator = QueryGenerator.load(start.path, device=device)
    if config.few_shot is None:
        return generator
    if start.artifact is not None or generator.kind != "causal":
        raise DataError(
            "--few-shot writes prompts for a public causal model; a finetune-lm generator was trained "
            "on its own prompt, and a seq2seq model reads none"
        )
    if examples is None:
        examples, _ = few_shot_pairs(config)
    generator.template = few_shot_template(examples, generator.template, generator.tokenizer, FEW_SHOT_TOKENS)
    return generator


def _template_tokens(generator: QueryGenerator) -> int:
    """Tokens of the prompt around a document (a few-shot prefix included): 0 for seq2seq."""
    if generator.kind != "causal":
        return 0
    around = generator.template.format(document="")
    return len(generator.tokenizer(around, add_special_tokens=False)["input_ids"])


@dataclass(frozen=True)
class _Sources:
    """What a run reads: the generator, the public documents (and what choosing them assumes), the
    few-shot examples."""

    start: Any  # a ModelInput: a finetune-lm artifact, or a public model
    root: Path
    records: list[dict]
    assumptions: list[str]
    examples: list[tuple[str, str]] | None


def _resolve_sources(config: GenerateConfig) -> _Sources:
    start = model_input(str(config.generator), stage="finetune-lm")
    root = resolve_source(config.corpus)
    documents, assumptions = public_documents_input(root, config.corpus, config.documents, config.split)
    records, examples = [start.record, *documents], None
    if config.few_shot is not None:
        examples, record = few_shot_pairs(config)  # read once: the record and the prompt
        records.append(record)
        assumptions.append(record["assumption"])
    return _Sources(start, root, records, assumptions, examples)


def _set_up(config: GenerateConfig, sources: _Sources, documents: int):
    """The generator in eval mode and the settings chosen for this machine, said before any work."""
    device = distributed.device_for(config.device)
    generator = _load_generator(config, sources.start, device, sources.examples)
    chosen = generate_defaults(config, device, generator.max_source_length)
    generator.model.eval()
    info(
        (chosen.line() + "; " if chosen.line() else "")
        + f"prompts: documents up to {generator.max_source_length} tokens (as the generator was trained), "
        f"queries up to {config.max_new_tokens} tokens"
    )
    seconds = generation_seconds(
        documents * config.num_queries,
        generator.max_source_length + _template_tokens(generator),
        config.max_new_tokens, parameter_count(generator.model),
    )  # fmt: skip
    info(f"{documents * config.num_queries:,} queries to write; {expected_line(seconds)}")
    return (
        generator,
        config.model_copy(update=chosen.values),
        chosen,
    )  # what runs; the fingerprint keeps config


def _generate_resumably(
    writer, config: GenerateConfig, sources: _Sources, generator, corpus, doc_ids, settings
):
    """Every query, logged as it is written so an interrupted run resumes from the log; the
    queries and the seconds this run wrote."""
    log_path = writer.checkpoint_dir / PROGRESS_FILE
    done = _resume_state(writer.checkpoint_dir, config, sources.records) if config.resume else {}
    (writer.checkpoint_dir / FINGERPRINT_FILE).write_text(
        resume_key(config, sources.records), encoding="utf-8"
    )
    if done:
        info(f"resuming: {len(done)} queries already generated")
    started, before = time.perf_counter(), set(done)
    _generate_for(generator, corpus, doc_ids, settings, done, log_path)
    return done, [done[key]["query"] for key in done if key not in before], time.perf_counter() - started


def _write(writer, config: GenerateConfig, sources: _Sources, generator, corpus, done, new, elapsed) -> None:
    """The synthetic set, its speed, and its privacy record: the generator's releases, or public."""
    writer.metrics.update(write_synthetic(writer.dir, corpus, done))
    encoded = generator.tokenizer(new, add_special_tokens=False)["input_ids"] if new else []
    tokens = sum(len(ids) for ids in encoded)
    writer.timings.update(
        {
            "generate_seconds": round(elapsed, 3),
            "queries_per_second": round(len(new) / max(elapsed, 1e-9), 3),
            # query tokens kept (cut at the newline/EOS), not the steps generate ran
            "query_tokens_per_second": round(tokens / max(elapsed, 1e-9), 3),
        }
    )
    if sources.start.artifact is not None:
        writer.inherit(sources.start.artifact)
    else:  # a public model, public examples, public documents: nothing private read (ε = 0)
        writer.assume(*sources.start.guarantee.assumptions)
        writer.public()
    if sources.assumptions:
        writer.assume(*sources.assumptions)
    if config.split is not None:
        warn(f"documents chosen by the judged set of split {config.split!r}: assumed public")


@precision.stage
def run(config: GenerateConfig) -> Artifact:
    """Resolve the generator and the public documents, load and size the generator, write every
    query (resuming a logged run), then the set: post-processing, it inherits the generator's ε."""
    if distributed.setup(config.device).world_size > 1 and config.shard is None:
        return run_over_ranks(config)
    sources = _resolve_sources(config)
    if (done_artifact := existing_result(STAGE, config, sources.records)) is not None:
        return done_artifact
    corpus, doc_ids = select_documents(config, sources.root)
    generator, settings, chosen = _set_up(config, sources, len(doc_ids))
    with create_artifact(
        config.out, STAGE, config, sources.records, resume=config.resume, keep_partial_on_error=True
    ) as writer:
        writer.config.update(chosen.values)
        done, new, elapsed = _generate_resumably(
            writer, config, sources, generator, corpus, doc_ids, settings
        )
        _write(writer, config, sources, generator, corpus, done, new, elapsed)
    return open_artifact(config.out, STAGE)

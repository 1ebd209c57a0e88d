"""The adversary's world for tests/privacy/test_adversary.py: a private dataset (query or user unit),
the same dataset minus one unit, every stage run on it with fixed secret seeds, and what the
adversary is allowed to see (every released byte) against what it is not (the private files, the
un-noised statistics, diagnostics/)."""

from __future__ import annotations

import json
import math
import re
import shutil
from collections import Counter
from dataclasses import dataclass, field
from pathlib import Path

from synthq.runtime.hashing import sha256_file, sha256_tree
from tests.helpers import write_tiny_beir

# Private users of the tiny set's 17 training queries (file order): a heavy user of 5, one of 3,
# two of 2 and singles. Distinctive ids, so a hit in a released byte is never a coincidence.
USERS = [("ulrike-7q", 5), ("bartholomew-3k", 3), ("cassiopeia-9z", 2), ("desmond-4w", 2),
         ("euphemia-2x", 1), ("fitzgerald-8v", 1), ("gwendolyn-5m", 1), ("horatio-6n", 1),
         ("isadora-1p", 1)]  # fmt: skip
PRIVATE_SPLITS = ("train", "dev")
PRIVATE_FILES = ("queries.jsonl", "qrels/train.tsv", "qrels/dev.tsv", "users.tsv")
# the one unit removed for the neighbouring dataset
REMOVED_QUERY = "tr-sleep-1-0"
REMOVED_USER = "cassiopeia-9z"


def _records(root: Path) -> list[dict]:
    return [json.loads(line) for line in (root / "queries.jsonl").read_text().splitlines() if line.strip()]


def _write_records(root: Path, records: list[dict]) -> None:
    (root / "queries.jsonl").write_text("".join(json.dumps(r) + "\n" for r in records))


def private_dataset(root: Path, unit: str, declared: bool = True) -> Path:
    """The tiny BEIR set with train and dev private and test public (``declared``: a privacy.json
    says so; else no privacy.json at all), and at the user unit a ``metadata.user_id`` on every
    training query."""
    root = write_tiny_beir(Path(root))
    if not declared:
        (root / "privacy.json").unlink()
    if unit == "user":
        records = _records(root)
        train = [r for r in records if r["_id"].startswith("tr-")]
        users = [name for name, size in USERS for _ in range(size)]
        assert len(users) == len(train)
        for record, user in zip(train, users, strict=True):
            record["metadata"] = {"user_id": user}
        _write_records(root, records)
    return root


def train_query_users(root: Path) -> dict[str, str]:
    return {r["_id"]: r["metadata"]["user_id"] for r in _records(root) if "metadata" in r}


def without_one_unit(source: Path, target: Path, unit: str) -> tuple[Path, list[str]]:
    """``source`` minus one privacy unit: one training query, or every query of one user.
    Returns the copy and the query ids removed."""
    shutil.copytree(source, target)
    if unit == "query":
        removed = [REMOVED_QUERY]
    else:
        removed = [q for q, user in train_query_users(source).items() if user == REMOVED_USER]
    assert removed
    _write_records(target, [r for r in _records(target) if r["_id"] not in removed])
    qrels = target / "qrels" / "train.tsv"
    lines = qrels.read_text().splitlines(keepends=True)
    kept = [line for line in lines if line.split("\t")[0] not in removed]
    assert len(kept) == len(lines) - len(removed)
    qrels.write_text("".join(kept))
    return target, removed


# The dev split: one dev query removed, a set of sub-datasets ----------------------------------------

REMOVED_DEV_QUERY = "dev-egg-2"  # one of the tiny set's two private dev queries
SMALL_PART, LARGE_PART = "android", "gaming"  # CQADupStack's layout: sub-forums of one dataset
REMOVED_PART_QUERY = "android-hit"  # the small sub-forum's dev query the neighbour loses


def without_one_dev_query(source: Path, target: Path, query_id: str, part: str = "") -> Path:
    """``source`` minus one query of the private dev split (its line in ``queries.jsonl`` and in
    ``qrels/dev.tsv``; of the sub-dataset ``part`` for a set of sub-datasets). Returns the copy."""
    shutil.copytree(source, target)
    root = target / part if part else target
    records = _records(root)
    _write_records(root, [r for r in records if r["_id"] != query_id])
    qrels = root / "qrels" / "dev.tsv"
    lines = qrels.read_text().splitlines(keepends=True)
    kept = [line for line in lines if line.split("\t")[0] != query_id]
    assert len(kept) == len(lines) - 1 and len(_records(root)) == len(records) - 1, query_id
    qrels.write_text("".join(kept))
    return target


def _replace_dev_split(root: Path, queries: list[tuple[str, str, str]]) -> None:
    """The dev split of the BEIR directory ``root`` replaced by ``queries`` (id, text, relevant
    document)."""
    kept = [r for r in _records(root) if not r["_id"].startswith("dev-")]
    _write_records(root, kept + [{"_id": q, "text": text} for q, text, _ in queries])
    (root / "qrels" / "dev.tsv").write_text(
        "query-id\tcorpus-id\tscore\n" + "".join(f"{q}\t{doc}\t1\n" for q, _, doc in queries)
    )


def sub_dataset_layout(root: Path) -> Path:
    """CQADupStack's layout: a directory of two BEIR sub-datasets (train and dev private, test
    public, declared by each part and by the whole), whose private dev splits hold 2 and 24
    queries (the construction of ``test_report_noisy_max_on_sub_datasets_keeps_its_epsilon_by_brute_force``).

    The small part's dev queries score apart whatever the encoder: ``android-hit`` is the text of
    its relevant document as encoders read it (ranked first: NDCG@10 = 1), ``android-decoy`` the
    text of another document (ranked above its relevant one: NDCG@10 ≤ 0.63). So a selection
    utility that weighs a small part's query by N / (P · n_p) — the mean of sub-dataset means ×
    queries — moves by more than 1 when one of them goes, for every candidate."""
    from synthq.data.pairs import document_text
    from tests.helpers import DEV_QUERIES, TEST_QUERIES, TRAIN_QUERIES, corpus_records

    root = Path(root)
    documents = corpus_records()
    small = write_tiny_beir(root / SMALL_PART)
    _replace_dev_split(small, [
        (REMOVED_PART_QUERY, document_text(documents["tax-0"]), "tax-0"),
        ("android-decoy", document_text(documents["git-1"]), "sleep-2"),
    ])  # fmt: skip
    large = write_tiny_beir(root / LARGE_PART)
    texts = [*(t for ts in TRAIN_QUERIES.values() for t in ts), *TEST_QUERIES.values(), *DEV_QUERIES.values()]
    ids = list(documents)
    _replace_dev_split(large, [(f"gaming-dev-{i}", f"{texts[i % len(texts)]} ({i})", ids[i % len(ids)])
                               for i in range(24)])  # fmt: skip
    declaration = {"private_splits": ["train", "dev"], "public_splits": ["test"]}
    (root / "privacy.json").write_text(json.dumps(declaration))  # the whole's, beside each part's
    return root


def with_reissued_pseudonyms(source: Path, target: Path) -> tuple[Path, str]:
    """``source`` (user unit) re-exported: one query of :data:`REMOVED_USER` deleted and every user
    id re-issued (``u-<n>``, numbered in reverse order of first appearance: no pseudonym of
    ``source`` survives). The same people; returns the copy and the query removed."""
    shutil.copytree(source, target)
    records = _records(target)
    removed = next(r["_id"] for r in records if r.get("metadata", {}).get("user_id") == REMOVED_USER)
    records = [r for r in records if r["_id"] != removed]
    users = list(dict.fromkeys(r["metadata"]["user_id"] for r in records if "metadata" in r))
    fresh = {user: f"u-{n}" for n, user in enumerate(reversed(users))}
    for record in records:
        if "metadata" in record:
            record["metadata"] = {"user_id": fresh[record["metadata"]["user_id"]]}
    _write_records(target, records)
    qrels = target / "qrels" / "train.tsv"
    lines = qrels.read_text().splitlines(keepends=True)
    qrels.write_text("".join(line for line in lines if line.split("\t")[0] != removed))
    return target, removed


def with_renamed_queries(source: Path, target: Path) -> Path:
    """``source`` copied with every query id renamed (``n-<i>``, in every split's qrels too) and
    every text kept: the same queries under new ids, as a re-export that re-issues ids."""
    shutil.copytree(source, target)
    records = _records(target)
    fresh = {r["_id"]: f"n-{i}" for i, r in enumerate(records)}
    _write_records(target, [{**r, "_id": fresh[r["_id"]]} for r in records])
    for qrels in (target / "qrels").glob("*.tsv"):
        lines = qrels.read_text().splitlines(keepends=True)
        qrels.write_text(
            "".join(
                line if index == 0 else "\t".join([fresh.get(line.split("\t")[0], line.split("\t")[0]),
                                                    *line.split("\t")[1:]])
                for index, line in enumerate(lines)
            )
        )  # fmt: skip
    return target


# The pipeline -----------------------------------------------------------------------------------


@dataclass
class World:
    """Everything one run of the pipeline wrote: artifacts by name, and other released
    directories (exported copies, the search bundle, the printed ledger)."""

    root: Path
    data: Path
    unit: str
    artifacts: dict[str, Path] = field(default_factory=dict)
    released: dict[str, Path] = field(default_factory=dict)
    seconds: dict[str, float] = field(default_factory=dict)
    recorded_data: Path | None = None  # where the run read the data (the manifests say so)

    def __post_init__(self):
        self.recorded_data = self.recorded_data or self.data


def relocate(world: World, source: Path, target: Path) -> World:
    """Move the directory ``source`` holding the world's data and run to ``target``, so the next
    run (a neighbouring dataset) writes to the very same paths: the two runs' manifests then
    differ by content, not by where they were written."""
    shutil.move(source, target)

    def moved(path: Path) -> Path:
        return target / Path(path).relative_to(source)

    return World(
        moved(world.root),
        moved(world.data),
        world.unit,
        {name: moved(path) for name, path in world.artifacts.items()},
        {name: moved(path) for name, path in world.released.items()},
        world.seconds,
        recorded_data=world.recorded_data,
    )


def run_world(root: Path, data: Path, unit: str, causal: Path, encoder: Path, audit: bool = True) -> World:
    """Every stage on ``data`` (train and dev private) with fixed secret seeds, tiny models, 1-2
    steps. The same call on a neighbouring dataset draws the same secret randomness."""
    import time

    from synthq.artifacts.manifest import open_artifact
    from synthq.config.audit import CanaryAuditConfig
    from synthq.config.evaluation import EvalConfig, ReportConfig, SimilarityConfig
    from synthq.config.generator import EvolveConfig, FilterConfig, FinetuneConfig, GenerateConfig
    from synthq.config.retriever import TrainRetrieverConfig
    from synthq.retrieval.cache import weights_key
    from synthq.search import bundle_directory, search
    from synthq.stages import (
        canary_audit,
        evaluate,
        finetune_lm,
        generate,
        report,
        similarity,
        train_retriever,
    )
    from synthq.stages import (
        filter as filter_stage,
    )
    from synthq.stages.evolve import recipe as evolve

    world = World(Path(root), Path(data), unit)
    arts = world.root / "artifacts"
    unit_options = {"privacy_unit": unit, "max_queries_per_user": 2} if unit == "user" else {}

    def stage(name, module, config):
        return run_stage(world, name, module, config)

    d = str(data)
    gen = stage(
        "gen",
        finetune_lm,
        FinetuneConfig(
            data=d,
            model=str(causal),
            out=arts / "gen",
            epsilon=8.0,
            max_steps=2,
            batch_size=4,
            physical_batch_size=4,
            lr=1e-2,
            max_source_length=32,
            seed=11,
            device="cpu",
            **unit_options,
        ),
    )
    syn = stage(
        "syn",
        generate,
        GenerateConfig(generator=gen, corpus=d, out=arts / "syn", max_new_tokens=4, seed=0, device="cpu"),
    )
    stage(
        "syn-split",
        generate,
        GenerateConfig(
            generator=gen,
            corpus=d,
            split="train",
            out=arts / "syn-split",
            max_new_tokens=4,
            seed=0,
            device="cpu",
        ),
    )
    stage(  # a public warm start (the test split is declared public), then DP
        "gen-warm",
        finetune_lm,
        FinetuneConfig(
            data=d, model=str(causal), out=arts / "gen-warm", epsilon=8.0, max_steps=1, batch_size=4,
            physical_batch_size=4, lr=1e-2, max_source_length=32, seed=11, device="cpu",
            warm_start=f"{d}:test", warm_start_epochs=1, **unit_options,
        ),
    )  # fmt: skip
    stage(  # the ε = 0 control: a public model, public few-shot examples, public documents
        "syn-zero",
        generate,
        GenerateConfig(generator=causal, corpus=d, few_shot=f"{d}:test", few_shot_examples=2,
                       out=arts / "syn-zero", max_new_tokens=4, seed=0, device="cpu"),
    )  # fmt: skip
    stage(
        "pe",
        evolve,
        EvolveConfig(
            data=d,
            corpus=d,
            judged_split="train",
            out=arts / "pe",
            model=str(causal),
            embedder=str(encoder),
            epsilon=4.0,
            iterations=1,
            population=2,
            max_new_tokens=4,
            max_source_length=32,
            seed=13,
            device="cpu",
            **unit_options,
        ),
    )
    filt = stage(
        "filt",
        filter_stage,
        FilterConfig(
            synthetic=syn,
            out=arts / "filt",
            method="consistency",
            retriever=str(encoder),
            top_k=12,
            holdout_documents=3,
            device="cpu",
        ),
    )

    def retriever(name, data_spec, **options):
        base = dict(encoder=str(encoder), max_steps=1, batch_size=4, max_query_length=16, max_doc_length=32,
                    seed=17, device="cpu")  # fmt: skip
        return str(
            stage(
                name,
                train_retriever,
                TrainRetrieverConfig(data=str(data_spec), out=arts / name, **{**base, **options}),
            )
        )

    syn_a = retriever("ret-syn-a", filt, lr=1e-3)
    syn_b = retriever("ret-syn-b", filt, lr=1e-5)
    dp = dict(dp="group", group_size=3, epsilon=4.0, batch_size=3, **unit_options)
    dp_a = retriever("ret-dp-a", data, lr=1e-3, **dp)
    dp_b = retriever("ret-dp-b", data, lr=1e-5, **dp)

    def evaluation(name, **options):
        return str(stage(name, evaluate, EvalConfig(out=arts / name, device="cpu", **options)))

    evaluation("ev-public", datasets=[d], untrained=[str(encoder)])  # public test split, public models
    ev_test = evaluation("ev-test", datasets=[d], retrievers=[syn_a, dp_a])
    ev_dev = evaluation("ev-dev", datasets=[d], split="dev", retrievers=[dp_a, dp_b], bm25=False)
    ev_select = evaluation("ev-select", datasets=[d], retrievers=[dp_a, dp_b], select_on=ev_dev,
                           select_epsilon=1.0)  # fmt: skip
    ev_syndev = evaluation("ev-syndev", datasets=[str(filt)], split="dev", retrievers=[syn_a, syn_b],
                           bm25=False)  # fmt: skip
    ev_synselect = evaluation("ev-synselect", datasets=[d], retrievers=[syn_a, syn_b], select_on=ev_syndev)
    sim = stage(
        "sim",
        similarity,
        SimilarityConfig(
            synthetic=syn,
            original=d,
            out=arts / "sim",
            encoder=str(encoder),
            min_samples=5,
            mauve_seeds=1,
            device="cpu",
        ),
    )
    stage("rep", report, ReportConfig(evals=[ev_test, ev_select, ev_synselect], similarity=[str(sim)],
                                      out=arts / "rep"))  # fmt: skip
    if audit:
        stage("audit", canary_audit, CanaryAuditConfig(
            data=d, model=str(causal), out=arts / "audit", canaries=8, canary_seed=0, epsilons=[4.0],
            retriever_audit=False, secret_references=2, **unit_options,
            **({"canary_queries_per_user": 2} if unit == "user" else {}),
            finetune={"batch_size": 4, "max_steps": 1, "physical_batch_size": 8, "max_source_length": 32},
        ))  # fmt: skip

    # released copies, the search bundle, the ledger as printed
    start = time.perf_counter()
    export_all(world)
    search(dp_a, d, ["how to boil an egg"], top_k=3, device="cpu")
    bundle = bundle_directory(weights_key(open_artifact(dp_a).manifest))
    assert bundle.is_dir(), "search wrote no ONNX bundle"
    shutil.copytree(bundle, world.root / "search-bundle")
    world.released["search bundle of ret-dp-a"] = world.root / "search-bundle"
    # the privacy statement a team shares: every release but the canary audit (whose numbers are
    # ε = ∞ evidence for the review, not part of what is shared)
    shared = [path for path in world.artifacts.values() if open_artifact(path).stage != "canary-audit"]
    write_ledger(world, shared)
    world.seconds["export, search, ledger"] = time.perf_counter() - start
    return world


# the noisy selection's ε: above what the candidates' training composes to per training query
# (2 × TRAIN_EPSILON), so that the ledger's total is the selection's and an understatement shows
TRAIN_EPSILON, SELECT_EPSILON = 1.0, 3.0


def run_selection_world(
    root: Path, data: Path, encoder: Path, train_on: Path | None = None, part: str = ""
) -> World:
    """What tuning on a private dev split runs, and nothing else: two direct-DP retrievers (one
    method, two learning rates: the candidates) trained on ``train_on`` (default ``data``), the
    un-noised eval of both on the private dev split of ``data`` (``ev-dev``, ε = ∞), and the eval
    on its public test split of what report-noisy-max chooses on it (``ev-select``); with
    ``part``, the same tuning on that sub-dataset alone (``ev-dev-part``, ``ev-select-part``).
    Then every exported copy, the ledger and the statement of every artifact. Fixed secret seeds;
    the noisy choice itself draws the OS's randomness."""
    from synthq.config.evaluation import EvalConfig
    from synthq.config.retriever import TrainRetrieverConfig
    from synthq.stages import evaluate, train_retriever

    world = World(Path(root), Path(data), "query")
    arts = world.root / "artifacts"
    candidates = [
        str(run_stage(world, name, train_retriever, TrainRetrieverConfig(
            data=str(train_on or data), encoder=str(encoder), out=arts / name, dp="group", group_size=3,
            epsilon=TRAIN_EPSILON, batch_size=3, max_steps=1, max_query_length=16, max_doc_length=32,
            lr=lr, seed=17, device="cpu")))
        for name, lr in (("ret-dp-a", 1e-3), ("ret-dp-b", 1e-5))
    ]  # fmt: skip
    for suffix, spec in [("", Path(data)), *([("-part", Path(data) / part)] if part else [])]:
        dev = run_stage(world, f"ev-dev{suffix}", evaluate, EvalConfig(
            out=arts / f"ev-dev{suffix}", datasets=[str(spec)], split="dev", retrievers=candidates,
            bm25=False, device="cpu"))  # fmt: skip
        run_stage(world, f"ev-select{suffix}", evaluate, EvalConfig(
            out=arts / f"ev-select{suffix}", datasets=[str(spec)], retrievers=candidates,
            select_on=str(dev), select_epsilon=SELECT_EPSILON, device="cpu"))  # fmt: skip
    export_all(world)
    write_ledger(world, list(world.artifacts.values()))
    return world


def user_level_retriever(out: Path, data: Path, encoder: Path, epsilon: float, unit: str = "user") -> Path:
    """A direct-DP retriever at the user unit (K = 2), fixed secret seed: one user-level release
    (``unit="query"``: one query-level release)."""
    from synthq.config.retriever import TrainRetrieverConfig
    from synthq.stages import train_retriever

    per_user = {"max_queries_per_user": 2} if unit == "user" else {}
    return Path(train_retriever.run(TrainRetrieverConfig(
        data=str(data), encoder=str(encoder), out=out, dp="group", group_size=3, epsilon=epsilon,
        privacy_unit=unit, batch_size=3, max_steps=1, max_query_length=16,
        max_doc_length=32, seed=17, device="cpu", **per_user)).path)  # fmt: skip


def run_stage(world: World, name: str, module, config) -> Path:
    """Run one stage into ``world`` (its artifact under ``name``, its wall time in ``seconds``)."""
    import time

    start = time.perf_counter()
    artifact = module.run(config)
    world.seconds[name] = time.perf_counter() - start
    world.artifacts[name] = Path(artifact.path)
    return Path(artifact.path)


def export_all(world: World) -> None:
    """A released copy of every artifact of ``world`` (``export NAME``)."""
    from synthq.artifacts.export import export_artifact

    for name, path in list(world.artifacts.items()):
        exported, _ = export_artifact(path, world.root / "exports" / name)
        world.released[f"export {name}"] = Path(exported.path)


def write_ledger(world: World, statement_over: list[Path]) -> None:
    """The ledger of every artifact and the privacy statement of ``statement_over``, as printed."""
    from synthq.bookkeeping.releases import ledger_lines
    from synthq.bookkeeping.statement import statement_for

    ledger_dir = world.root / "ledger"
    ledger_dir.mkdir()
    (ledger_dir / "ledger.txt").write_text("\n".join(ledger_lines(list(world.artifacts.values()))))
    (ledger_dir / "statement.md").write_text(statement_for(statement_over))
    world.released["ledger"] = ledger_dir


# What the adversary sees -------------------------------------------------------------------------


def released_files(world: World) -> dict[str, Path]:
    """Every released file, by a label naming the artifact or copy and the file: every file of
    every artifact except under diagnostics/, exported copies, the search bundle, the ledger."""
    files = {}
    for name, root in [*world.artifacts.items(), *world.released.items()]:
        for path in sorted(p for p in root.rglob("*") if p.is_file()):
            relative = path.relative_to(root).as_posix()
            if relative.startswith("diagnostics/") or relative.startswith(".") or "/." in relative:
                continue
            files[f"{name}: {relative}"] = path
    return files


# A release's unit set (``diagnostics/units.bin``) holds HMACs of the unit ids under the owner's key
# (synthq.privacy.keys.unit_digests): its plain sha256 is itself a keyed identifier, which the
# ledger records on purpose; without the key no candidate can be tested against it.
KEYED_CONTENT = ("units.bin", "units-query.bin", "units-text.bin", "units-pair.bin")  # and the links


def diagnostics_files(world: World) -> list[Path]:
    """Every private diagnostics file whose content is not already keyed."""
    return [
        p
        for root in world.artifacts.values()
        for p in sorted((root / "diagnostics").rglob("*"))
        if p.is_file() and p.name not in KEYED_CONTENT
    ]


def private_digests(world: World) -> dict[str, str]:
    """The plain digests an adversary holding candidate files would test: of each private file, of
    the private directory (as sha256_tree computes it), of every diagnostics/ file."""
    data = world.data
    digests = {}
    for relative in PRIVATE_FILES:
        if (data / relative).is_file():
            digests[sha256_file(data / relative)] = f"plain sha256 of the private file {relative}"
    digests[sha256_tree(data)] = f"plain sha256_tree of the private dataset {data.name}"
    for path in diagnostics_files(world):
        digests[sha256_file(path)] = f"plain sha256 of the private {path.relative_to(world.root)}"
    return digests


def private_queries(data: Path) -> dict[str, str]:
    """Private query id -> text (the train and dev splits)."""
    ids = set()
    for split in PRIVATE_SPLITS:
        if not (data / "qrels" / f"{split}.tsv").is_file():
            continue
        for line in (data / "qrels" / f"{split}.tsv").read_text().splitlines()[1:]:
            ids.add(line.split("\t")[0])
    return {r["_id"]: r["text"] for r in _records(data) if r["_id"] in ids}


def user_statistics(data: Path) -> dict[str, object]:
    """Un-noised per-user statistics of the training split: the count of each user, the p99 of
    queries per user (as numpy's linear percentile and as the nearest rank), the heaviest user."""
    import numpy as np

    counts = Counter(train_query_users(data).values())
    values = sorted(counts.values())
    return {
        "queries per user": dict(counts),
        "p99 (linear)": float(np.percentile(values, 99)),
        "max queries per user": max(values),
        "users": len(values),
    }


def number_forms(value: float) -> set[str]:
    """How a float may be written: repr, and 3 to 6 decimals."""
    forms = {repr(float(value))} | {f"{value:.{k}f}" for k in (3, 4, 5, 6)}
    return {f for f in forms if not re.fullmatch(r"[01]\.0*", f)}


def finite(value) -> bool:
    try:
        return math.isfinite(float(value))
    except (TypeError, ValueError):
        return False

"""Dataset sources by name: a local BEIR directory, ``embedded``, ``msmarco``, ``beir:<name>`` or
``irds:<ir_datasets id>``.

``embedded`` is the dataset shipped in ``data/embedded`` (found from a checkout or from the
installed wheel, where it lives in ``synthq/_embedded``); ``pydocs`` (the standard library's
docstrings, ``data/pydocs``) is shipped and found the same way. ``msmarco`` and ``beir:<name>`` are
fetched into the cache the first time: from the official BEIR zip, or, when that fails, from the
Hugging Face hub's copies (``BeIR/<name>`` with its ``corpus`` and ``queries`` configs and
``BeIR/<name>-qrels``) through ``datasets``, converted to the same BEIR directory (same ids and
splits; the hub's ``validation`` split is BEIR's ``dev``). Offline, the error says where to put
the unzipped directory by hand.

``irds:<id>`` takes any dataset of the ``ir_datasets`` catalogue by its own name
(``irds:msmarco-passage/dev/small``, ``irds:beir/scifact/test``): its documents, queries and
judgements are streamed once into a BEIR directory in the cache, whose qrels split is the id's
``train`` / ``dev`` / ``test`` part (``test`` when it names none), and read like any other.

Which splits are public: those fetched benchmarks are (:func:`public_benchmark`); any directory the
user gives declares its public splits in ``privacy.json`` (:func:`declared_splits`, strictly
validated), and every split it does not declare public is private (:mod:`synthq.bookkeeping.splits`).
"""

from __future__ import annotations

import importlib.resources
import json
import os
import shutil
from pathlib import Path

from synthq.data.beir_io import BeirDataset, load_beir_dir
from synthq.runtime.errors import DataError
from synthq.runtime.paths import cache_dir

BEIR_URL = "https://public.ukp.informatik.tu-darmstadt.de/thakur/BEIR/datasets/{name}.zip"
# The hub's copies: corpus and queries as configs of one repository, qrels as TSVs in another.
HUB_REPO = "BeIR/{name}"
HUB_QRELS_REPO = "BeIR/{name}-qrels"
# ``datasets`` names a ``dev.tsv`` split ``validation``.
HUB_SPLIT_NAMES = {"validation": "dev"}
# The paper's eleven BEIR datasets plus MS MARCO.
BEIR_DATASETS = (
    "msmarco",
    "arguana",
    "cqadupstack",
    "dbpedia-entity",
    "fiqa",
    "hotpotqa",
    "nfcorpus",
    "quora",
    "scidocs",
    "scifact",
    "trec-covid",
    "webis-touche2020",
)
# BEIR evaluates these with the query's own id removed from its results.
IDENTICAL_ID_DATASETS = frozenset({"arguana", "quora"})


def _shipped_dir(name: str) -> Path:
    """A shipped dataset: ``synthq/_<name>`` in a wheel, ``data/<name>`` in a checkout."""
    packaged = Path(str(importlib.resources.files("synthq"))) / f"_{name}"
    if (packaged / "corpus.jsonl").is_file():
        return packaged
    checkout = Path(__file__).resolve().parents[2] / "data" / name
    if (checkout / "corpus.jsonl").is_file():
        return checkout
    raise DataError(f"the {name} dataset is missing from this installation", checkout)


def embedded_dir() -> Path:
    """The shipped dataset: ``synthq/_embedded`` in a wheel, ``data/embedded`` in a checkout."""
    return _shipped_dir("embedded")


# The named sources synthq ships (found offline, like a directory).
SHIPPED_SOURCES = ("embedded", "pydocs", "pylibs")


def pydocs_dir() -> Path:
    """The shipped standard-library docstring set (``data/pydocs``, ``synthq/_pydocs`` in a wheel):
    summary line -> rest of the docstring, users = top-level modules, test split public."""
    return _shipped_dir("pydocs")


def pylibs_dir() -> Path:
    """The shipped scientific-Python docstring log (``data/pylibs``, ``synthq/_pylibs`` in a wheel):
    summary line -> rest of the docstring, users = defining modules (1,400+ in train), test public."""
    return _shipped_dir("pylibs")


IRDS_PREFIX = "irds:"
IRDS_SPLITS = ("train", "dev", "test")


def source_name(spec: str) -> str:
    """A short name for tables: ``embedded``, ``msmarco``, ``fiqa``, ``beir-scifact-test`` (an
    ir_datasets id), or the directory name."""
    if spec in (*SHIPPED_SOURCES, "msmarco"):
        return spec
    if spec.startswith("beir:"):
        return spec.split(":", 1)[1]
    if spec.startswith(IRDS_PREFIX):
        return spec[len(IRDS_PREFIX) :].replace("/", "-")
    return Path(spec).name


def irds_split(dataset_id: str) -> str:
    """The split an ir_datasets id names (``msmarco-passage/dev/small`` -> ``dev``), else test."""
    return next((part for part in dataset_id.split("/")[1:] if part in IRDS_SPLITS), "test")


def default_eval_split(spec: str) -> str:
    """MS MARCO is evaluated on ``dev`` (its BEIR ``test`` split has 43 queries); an ir_datasets id
    on the split it names; others on test."""
    if spec.startswith(IRDS_PREFIX):
        return irds_split(spec[len(IRDS_PREFIX) :])
    return "dev" if source_name(spec) == "msmarco" else "test"


def irds_to_beir(dataset_id: str, target: Path) -> Path:
    """Stream ``ir_datasets.load(dataset_id)`` into a BEIR directory at ``target`` (atomically):
    documents (``doc_id``, ``title`` when it has one, ``text``; other fields joined into the text
    when there is no ``text``), queries (``query_id``, ``text``) and judgements
    (``qrels/<split>.tsv``, :func:`irds_split`)."""
    try:
        import ir_datasets
    except ImportError:
        raise DataError(f"irds:{dataset_id} needs the ir_datasets package: pip install ir_datasets") from None
    try:
        dataset = ir_datasets.load(dataset_id)
    except KeyError:
        raise DataError(f"irds:{dataset_id}: not an ir_datasets id (see ir-datasets.com)") from None
    if not dataset.has_docs():
        raise DataError(f"irds:{dataset_id}: this ir_datasets entry has no documents")
    tmp = target.with_name(f".{target.name}.irds-{os.getpid()}")
    shutil.rmtree(tmp, ignore_errors=True)
    (tmp / "qrels").mkdir(parents=True)
    try:
        with open(tmp / "corpus.jsonl", "w", encoding="utf-8") as out:
            for doc in dataset.docs_iter():
                fields = doc._asdict()
                text = fields.get("text")
                if text is None:
                    text = " ".join(str(v) for k, v in fields.items() if k not in ("doc_id", "title") and v)
                record = {"_id": str(doc.doc_id), "title": fields.get("title") or "", "text": text}
                out.write(json.dumps(record, ensure_ascii=False) + "\n")
        with open(tmp / "queries.jsonl", "w", encoding="utf-8") as out:
            for query in dataset.queries_iter() if dataset.has_queries() else ():
                out.write(
                    json.dumps({"_id": str(query.query_id), "text": query.text}, ensure_ascii=False) + "\n"
                )
        if dataset.has_qrels():
            with open(tmp / "qrels" / f"{irds_split(dataset_id)}.tsv", "w", encoding="utf-8") as out:
                out.write("query-id\tcorpus-id\tscore\n")
                for judgement in dataset.qrels_iter():
                    out.write(f"{judgement.query_id}\t{judgement.doc_id}\t{int(judgement.relevance)}\n")
        target.parent.mkdir(parents=True, exist_ok=True)
        os.rename(tmp, target)
    finally:
        shutil.rmtree(tmp, ignore_errors=True)
    return target


def _irds(dataset_id: str) -> Path:
    target = cache_dir("irds") / dataset_id.replace("/", "__")
    if (target / "corpus.jsonl").is_file():
        return target
    return irds_to_beir(dataset_id, target)


def _write_hub_rows(path: Path, dataset, fields: tuple[str, ...]) -> None:
    with open(path, "w", encoding="utf-8") as handle:
        for batch in dataset.iter(batch_size=10_000):
            columns = [batch.get(f) or [""] * len(batch["_id"]) for f in fields]
            for values in zip(batch["_id"], *columns, strict=True):
                record = {
                    "_id": str(values[0]),
                    **{f: v or "" for f, v in zip(fields, values[1:], strict=True)},
                }
                handle.write(json.dumps(record, ensure_ascii=False) + "\n")


def hub_to_beir(name: str, target: Path) -> Path:
    """Convert the hub's ``BeIR/<name>`` and ``BeIR/<name>-qrels`` into a BEIR directory at ``target``.

    Rows are streamed from ``datasets``' memory-mapped download into ``corpus.jsonl``,
    ``queries.jsonl`` and ``qrels/<split>.tsv`` (ids kept as strings: the qrels are read with
    string features so numeric ids keep their leading zeros); the directory appears atomically.
    ``datasets``' own copy is removed afterwards, the BEIR directory being the exchange format."""
    import datasets

    hf_cache = cache_dir("hub-datasets", name)
    repo, qrels_repo = HUB_REPO.format(name=name), HUB_QRELS_REPO.format(name=name)
    qrels_features = datasets.Features(
        {
            "query-id": datasets.Value("string"),
            "corpus-id": datasets.Value("string"),
            "score": datasets.Value("int64"),
        }
    )
    tmp = target.with_name(f".{target.name}.hub-{os.getpid()}")
    try:
        corpus = datasets.load_dataset(repo, "corpus", split="corpus", cache_dir=str(hf_cache))
        queries = datasets.load_dataset(repo, "queries", split="queries", cache_dir=str(hf_cache))
        qrels = datasets.load_dataset(qrels_repo, features=qrels_features, cache_dir=str(hf_cache))
        shutil.rmtree(tmp, ignore_errors=True)
        (tmp / "qrels").mkdir(parents=True)
        _write_hub_rows(tmp / "corpus.jsonl", corpus, ("title", "text"))
        _write_hub_rows(tmp / "queries.jsonl", queries, ("text",))
        for split, rows in qrels.items():
            with open(
                tmp / "qrels" / f"{HUB_SPLIT_NAMES.get(split, split)}.tsv", "w", encoding="utf-8"
            ) as out:
                out.write("query-id\tcorpus-id\tscore\n")
                for batch in rows.iter(batch_size=10_000):
                    for row in zip(batch["query-id"], batch["corpus-id"], batch["score"], strict=True):
                        out.write("\t".join(map(str, row)) + "\n")
        os.rename(tmp, target)
    finally:
        shutil.rmtree(hf_cache, ignore_errors=True)
        shutil.rmtree(tmp, ignore_errors=True)
    return target


def _download_beir(name: str) -> Path:
    if name not in BEIR_DATASETS:
        raise DataError(f"unknown BEIR dataset {name!r}; known: {', '.join(BEIR_DATASETS)}")
    root = cache_dir("beir")
    target = root / name
    if (target / "corpus.jsonl").is_file():
        return target
    url = BEIR_URL.format(name=name)
    try:
        from beir import util

        extracted = Path(util.download_and_unzip(url, str(root)))
    except Exception as zip_error:
        shutil.rmtree(root / f"{name}.zip", ignore_errors=True)
        if name == "cqadupstack":  # the hub has no single cqadupstack corpus
            hub_problem = "not on the hub as one dataset"
        else:
            try:
                return hub_to_beir(name, target)
            except Exception as hub_error:
                hub_problem = type(hub_error).__name__
        raise DataError(
            f"could not download {url} ({type(zip_error).__name__}) nor the hub's "
            f"{HUB_REPO.format(name=name)} ({hub_problem}). Offline, download and unzip it "
            f"by hand so that {target}/corpus.jsonl exists, or pass the BEIR directory's path instead"
        ) from zip_error
    if name == "cqadupstack" and not (extracted / "corpus.jsonl").is_file():
        raise DataError(
            f"cqadupstack is a set of sub-forum datasets; pass one sub-directory, e.g. {extracted}/android"
        )
    return extracted


def resolve_source(spec: str) -> Path:
    """The BEIR directory that ``spec`` names (downloading it if needed)."""
    if spec == "embedded":
        return embedded_dir()
    if spec == "pydocs":
        return pydocs_dir()
    if spec == "pylibs":
        return pylibs_dir()
    if spec == "msmarco":
        return _download_beir("msmarco")
    if spec.startswith("beir:"):
        return _download_beir(spec.split(":", 1)[1])
    if spec.startswith(IRDS_PREFIX):
        return _irds(spec[len(IRDS_PREFIX) :])
    path = Path(spec).expanduser()
    if path.is_dir():
        return path
    if spec in BEIR_DATASETS:
        return _download_beir(spec)
    raise DataError(
        "not a directory or known source "
        "(use embedded, pydocs, pylibs, msmarco, beir:NAME, irds:ID or a BEIR directory)",
        spec,
    )


def _subsets(root: Path) -> list[Path]:
    """Sub-dataset directories (each with a corpus) of a directory that has no corpus itself."""
    if not root.is_dir() or (root / "corpus.jsonl").is_file():
        return []
    return sorted(p for p in root.iterdir() if (p / "corpus.jsonl").is_file())


def resolve_dataset(spec: str) -> Path:
    """The directory ``spec`` names. CQADupStack by name is the directory of its sub-forums
    (downloaded into the BEIR cache on first use), which :func:`dataset_parts` splits."""
    if source_name(spec) == "cqadupstack" and not Path(spec).expanduser().is_dir():
        cached = cache_dir("beir") / "cqadupstack"
        if not _subsets(cached):
            try:
                resolve_source(spec)
            except DataError:  # the download lands sub-forums, which resolve_source refuses
                if not _subsets(cached):
                    raise
        return cached
    return resolve_source(spec)


def dataset_parts(root: Path) -> list[tuple[str, Path]]:
    """``[("", root)]`` for a BEIR directory, ``[(name, dir), ...]`` for a set of sub-datasets."""
    if (root / "corpus.jsonl").is_file():
        return [("", root)]
    if subsets := _subsets(root):
        return [(p.name, p) for p in subsets]
    raise DataError("not a BEIR directory: no corpus.jsonl here nor in any sub-directory", root)


def load_source(spec: str, splits: list[str] | None = None) -> BeirDataset:
    """Resolve and load a dataset, validated."""
    return load_beir_dir(resolve_source(spec), splits=splits)


SPLIT_DECLARATION = "privacy.json"
# What a privacy.json may hold: the two lists, and free text for people.
_DECLARATION_LISTS = ("private_splits", "public_splits")
_DECLARATION_NOTES = ("note", "notes", "comment", "description")


def public_benchmark(spec: str) -> bool:
    """Whether ``spec`` names a published benchmark synthq fetches itself (``msmarco``,
    ``beir:NAME``, a bare BEIR name that is not a local directory, ``irds:ID``): public data,
    every split of it. Any directory the user gives — ``embedded`` included, which plays a private
    log — is not: its splits are private unless its ``privacy.json`` declares them public."""
    if spec.startswith(("beir:", IRDS_PREFIX)):
        return True
    return spec in BEIR_DATASETS and not Path(spec).expanduser().is_dir()


def qrels_splits(root: Path) -> set[str]:
    """The judged splits of a dataset (``qrels/<split>.tsv``), over its sub-datasets."""
    parts = [root] if (Path(root) / "qrels").is_dir() else _subsets(Path(root))
    return {p.stem for part in parts for p in (Path(part) / "qrels").glob("*.tsv")}


def declared_splits(root: Path) -> dict[str, str]:
    """``split -> "private" | "public"`` as a dataset declares it in ``privacy.json``
    (``{"private_splits": [...], "public_splits": [...]}``); empty when it declares nothing.

    A declaration that is not exactly that — another key (``"public_split"``), a string instead of
    a list, a split that is not one of the dataset's qrels splits (``"dve"``), a split in both
    lists — is refused: a typo must never decide what is public."""
    path = Path(root) / SPLIT_DECLARATION
    if not path.is_file():
        return {}
    try:
        declared = json.loads(path.read_text(encoding="utf-8"))
    except (ValueError, UnicodeDecodeError) as error:
        raise DataError(f"unreadable split declaration ({error})", path) from error
    if not isinstance(declared, dict):
        expected = '{"private_splits": [...], "public_splits": [...]}'
        raise DataError(f"not a split declaration: expected {expected}", path)
    unknown_keys = sorted(set(declared) - {*_DECLARATION_LISTS, *_DECLARATION_NOTES})
    if unknown_keys:
        raise DataError(
            f"unknown key {unknown_keys[0]!r} in the split declaration "
            "(expected private_splits, public_splits)",
            path,
        )
    lists = {}
    for key in _DECLARATION_LISTS:
        value = declared.get(key, [])
        if not isinstance(value, list) or not all(isinstance(s, str) for s in value):
            raise DataError(f"{key} must be a list of split names, not {json.dumps(value)}", path)
        lists[key] = value
    private, public = lists["private_splits"], lists["public_splits"]
    if set(private) & set(public):
        both = sorted(set(private) & set(public))
        raise DataError(f"splits declared both private and public: {both}", path)
    splits = qrels_splits(Path(root))
    unknown = [s for s in [*private, *public] if s not in splits]
    if unknown:
        raise DataError(
            f"split {unknown[0]!r} is not a split of this dataset (its qrels splits: "
            f"{', '.join(sorted(splits)) or 'none'})",
            path,
        )
    return {**{s: "public" for s in public}, **{s: "private" for s in private}}

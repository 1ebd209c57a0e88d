"""Dataset sources by name: a local BEIR directory, ``embedded``, ``msmarco`` or ``beir:<name>``.

``embedded`` is the dataset shipped in ``data/embedded`` (found from a checkout or from the
installed wheel, where it lives in ``synthq/_embedded``). ``msmarco`` and ``beir:<name>`` are
downloaded from the official BEIR location into the cache the first time; offline, the error
says where to put the unzipped directory by hand.
"""

from __future__ import annotations

import importlib.resources
import shutil
from pathlib import Path

from synthq.data.beir_io import BeirDataset, load_beir_dir
from synthq.errors import DataError
from synthq.paths import cache_dir

BEIR_URL = "https://public.ukp.informatik.tu-darmstadt.de/thakur/BEIR/datasets/{name}.zip"
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


def embedded_dir() -> Path:
    """The shipped dataset: ``synthq/_embedded`` in a wheel, ``data/embedded`` in a checkout."""
    packaged = Path(str(importlib.resources.files("synthq"))) / "_embedded"
    if (packaged / "corpus.jsonl").is_file():
        return packaged
    checkout = Path(__file__).resolve().parents[2] / "data" / "embedded"
    if (checkout / "corpus.jsonl").is_file():
        return checkout
    raise DataError("the embedded dataset is missing from this installation", checkout)


def source_name(spec: str) -> str:
    """A short name for tables: ``embedded``, ``msmarco``, ``fiqa``, or the directory name."""
    if spec in ("embedded", "msmarco"):
        return spec
    if spec.startswith("beir:"):
        return spec.split(":", 1)[1]
    return Path(spec).name


def default_eval_split(spec: str) -> str:
    """MS MARCO is evaluated on ``dev`` (its BEIR ``test`` split has 43 queries); others on test."""
    return "dev" if source_name(spec) == "msmarco" else "test"


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
    except Exception as error:
        shutil.rmtree(root / f"{name}.zip", ignore_errors=True)
        raise DataError(
            f"could not download {url} ({type(error).__name__}). Offline, download and unzip it "
            f"by hand so that {target}/corpus.jsonl exists, or pass the BEIR directory's path instead"
        ) from error
    if name == "cqadupstack" and not (extracted / "corpus.jsonl").is_file():
        raise DataError(
            f"cqadupstack is a set of sub-forum datasets; pass one sub-directory, e.g. {extracted}/android"
        )
    return extracted


def resolve_source(spec: str) -> Path:
    """The BEIR directory that ``spec`` names (downloading it if needed)."""
    if spec == "embedded":
        return embedded_dir()
    if spec == "msmarco":
        return _download_beir("msmarco")
    if spec.startswith("beir:"):
        return _download_beir(spec.split(":", 1)[1])
    path = Path(spec).expanduser()
    if path.is_dir():
        return path
    if spec in BEIR_DATASETS:
        return _download_beir(spec)
    raise DataError(
        "not a directory or known source (use embedded, msmarco, beir:NAME or a BEIR directory)", spec
    )


def load_source(spec: str, splits: list[str] | None = None) -> BeirDataset:
    """Resolve and load a dataset, validated."""
    return load_beir_dir(resolve_source(spec), splits=splits)

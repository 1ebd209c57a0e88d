"""BEIR-format data: reading (through a memory-mapped Arrow cache), writing, validation, named
sources and training pairs."""

from synthq.data.beir_io import (
    BeirDataset,
    load_beir_dir,
    read_corpus,
    read_qrels,
    read_queries,
    write_beir_dir,
)
from synthq.data.pairs import Pair, PairList, document_text, training_pairs
from synthq.data.sources import default_eval_split, load_source, resolve_source, source_name
from synthq.data.tables import Corpus, Qrels, Queries

__all__ = [
    "BeirDataset",
    "Corpus",
    "Pair",
    "PairList",
    "Qrels",
    "Queries",
    "default_eval_split",
    "document_text",
    "load_beir_dir",
    "load_source",
    "read_corpus",
    "read_qrels",
    "read_queries",
    "resolve_source",
    "source_name",
    "training_pairs",
    "write_beir_dir",
]

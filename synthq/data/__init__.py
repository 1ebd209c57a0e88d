"""BEIR-format data: reading, writing, validation, named sources and training pairs."""

from synthq.data.beir_io import BeirDataset, load_beir_dir, write_beir_dir
from synthq.data.pairs import Pair, document_text, training_pairs
from synthq.data.sources import default_eval_split, load_source, resolve_source, source_name

__all__ = [
    "BeirDataset",
    "Pair",
    "default_eval_split",
    "document_text",
    "load_beir_dir",
    "load_source",
    "resolve_source",
    "source_name",
    "training_pairs",
    "write_beir_dir",
]

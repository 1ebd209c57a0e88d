"""A query encoder that starts in a tenth of a second: a retriever exported to ONNX.

``synthq search`` is run many times a day; loading the encoder through sentence-transformers
imports torch, transformers and sentence-transformers (≈ 4 s on 2 cores) before the first query
is encoded. The first search with a model therefore also writes an *ONNX bundle* of it —

- ``model.onnx`` (+ ``model.onnx.data``): the whole sentence-transformers forward pass
  (transformer, pooling, any dense layers) followed by L2 normalisation, exported with
  ``torch.onnx.export`` with dynamic batch and sequence axes;
- ``tokenizer.json``: the model's fast tokenizer, with its truncation at the model's
  ``max_seq_length`` and padding to the longest text of a batch;
- ``bundle.json``: the sequence length, embedding width, input names and the format version —

and later searches encode their queries with ``onnxruntime`` and ``tokenizers`` alone
(:class:`OnnxEncoder`), which import in ≈ 0.1 s.

**Correct by check, not by hope.** A bundle is written only after it has reproduced the
sentence-transformers embeddings of a set of probe texts (short, longer than the truncation
length, padded with whitespace, upper case, non-ASCII — and the caller's own texts) to within
:data:`TOLERANCE` in every coordinate; a model whose tokenisation or forward pass the export does
not reproduce gets a ``refused.json`` marker instead and is always encoded through torch. The
bundle is derived from public weights only (a released retriever or a public encoder), so it is
post-processing and carries no privacy of its own.
"""

from __future__ import annotations

import contextlib
import hashlib
import io
import json
import logging
import os
import shutil
import warnings
from pathlib import Path

import numpy as np

BUNDLE_FORMAT = 1
BUNDLE_FILE = "bundle.json"
REFUSED_FILE = "refused.json"
# Largest difference allowed between a bundle's embedding and sentence-transformers' in any
# coordinate of a unit vector (float32 rounding of the same graph is ~1e-7).
TOLERANCE = 1e-4
PROBE_TEXTS = (
    "what is differential privacy",
    "x",
    "   padded with spaces\t ",
    "UPPER CASE Query About DP-SGD?",
    "café naïve Straße 東京 — emoji 🙂",
    " ".join(["a long text that is truncated"] * 200),
)


class OnnxEncoder:
    """Encodes texts with an ONNX bundle written by :func:`export_bundle`: the same interface as
    ``SentenceTransformer.encode`` for what synthq uses (L2-normalised float32 rows)."""

    def __init__(self, directory: str | Path):
        import onnxruntime
        from tokenizers import Tokenizer

        directory = Path(directory)
        self.meta = json.loads((directory / BUNDLE_FILE).read_text())
        self.max_seq_length = self.meta["max_seq_length"]
        self.tokenizer = Tokenizer.from_file(str(directory / "tokenizer.json"))
        options = onnxruntime.SessionOptions()
        options.log_severity_level = 3  # errors only: no graph-optimisation chatter on stderr
        self.session = onnxruntime.InferenceSession(
            str(directory / "model.onnx"), options, providers=["CPUExecutionProvider"]
        )
        self.input_names = [item.name for item in self.session.get_inputs()]

    def get_embedding_dimension(self) -> int:
        return int(self.meta["dimension"])

    def encode(self, texts: list[str], batch_size: int = 32, **_ignored) -> np.ndarray:
        """L2-normalised embeddings, row i = ``texts[i]`` (sentence-transformers' keyword
        arguments are accepted and ignored: the bundle always normalises and returns numpy)."""
        rows = []
        for start in range(0, len(texts), batch_size):
            encodings = self.tokenizer.encode_batch(
                [text.strip() for text in texts[start : start + batch_size]]
            )
            arrays = {
                "input_ids": np.array([e.ids for e in encodings], dtype=np.int64),
                "attention_mask": np.array([e.attention_mask for e in encodings], dtype=np.int64),
                "token_type_ids": np.array([e.type_ids for e in encodings], dtype=np.int64),
            }
            (vectors,) = self.session.run(None, {name: arrays[name] for name in self.input_names})
            rows.append(np.asarray(vectors, dtype=np.float32))
        if not rows:
            return np.zeros((0, self.get_embedding_dimension()), dtype=np.float32)
        return np.concatenate(rows)


def has_bundle(directory: Path) -> bool:
    """Whether ``directory`` holds a bundle of this format version (without loading it)."""
    try:
        return json.loads((directory / BUNDLE_FILE).read_text()).get("format") == BUNDLE_FORMAT
    except (OSError, json.JSONDecodeError):
        return False


def load_bundle(directory: Path) -> OnnxEncoder | None:
    """The bundle in ``directory``, or None when there is none (or it was refused, or written by
    another format version). A bundle whose files no longer match the digests written with them
    (altered or cut short in the cache: it would encode queries wrong, or into NaN) is removed,
    with a warning, so the next search exports it again."""
    if not has_bundle(directory):
        return None
    recorded = json.loads((directory / BUNDLE_FILE).read_text()).get("files")
    if recorded != _file_digests(directory):
        from synthq.runtime.console import warn

        warn(f"{directory}: the ONNX bundle's files do not match their digests; removed (exported again)")
        shutil.rmtree(directory, ignore_errors=True)
        return None
    return OnnxEncoder(directory)


def _file_digests(directory: Path) -> dict[str, str]:
    """sha256 of every file of a bundle but its ``bundle.json``."""
    digests = {}
    for path in sorted(p for p in directory.iterdir() if p.is_file() and p.name != BUNDLE_FILE):
        digest = hashlib.sha256()
        with open(path, "rb") as handle:
            for block in iter(lambda handle=handle: handle.read(1 << 22), b""):
                digest.update(block)
        digests[path.name] = digest.hexdigest()
    return digests


def was_refused(directory: Path) -> bool:
    """Whether an earlier export of this model failed its check (so torch encodes it)."""
    return (directory / REFUSED_FILE).is_file()


def export_bundle(model, directory: Path, extra_probes: list[str] = ()) -> OnnxEncoder | None:
    """Export ``model`` (a ``SentenceTransformer`` whose first module is a ``Transformer`` with a
    fast tokenizer) to an ONNX bundle in ``directory`` and check it; the bundle when it
    reproduces the model, else None (and ``directory`` records why, so the export is not tried
    again). The directory appears complete or not at all (written aside, then renamed)."""
    directory.parent.mkdir(parents=True, exist_ok=True)
    work = directory.with_name(f"{directory.name}.tmp{os.getpid()}")
    shutil.rmtree(work, ignore_errors=True)
    work.mkdir()
    try:
        try:
            _write_bundle(model, work)
            bundle = OnnxEncoder(work)
            probes = list(PROBE_TEXTS) + [text for text in extra_probes if text.strip()]
            expected = model.encode(
                probes, normalize_embeddings=True, convert_to_numpy=True, show_progress_bar=False
            )
            difference = float(np.abs(bundle.encode(probes) - expected).max())
            if not difference <= TOLERANCE:
                raise ValueError(
                    f"the export differs from the model by {difference:.2e} (tolerance {TOLERANCE:.0e})"
                )
            meta = json.loads((work / BUNDLE_FILE).read_text())
            meta["files"] = _file_digests(work)  # checked on every load
            (work / BUNDLE_FILE).write_text(json.dumps(meta, indent=2) + "\n")
        except Exception as error:  # any failure means: encode this model with torch
            shutil.rmtree(work, ignore_errors=True)
            work.mkdir()
            (work / REFUSED_FILE).write_text(json.dumps({"reason": f"{type(error).__name__}: {error}"}))
            bundle = None
        shutil.rmtree(directory, ignore_errors=True)
        os.replace(work, directory)
    finally:
        shutil.rmtree(work, ignore_errors=True)
    return load_bundle(directory) if bundle is not None else None


@contextlib.contextmanager
def _quiet(logger_name: str):
    """Errors only from ``logger_name`` and its children while the block runs."""
    logger = logging.getLogger(logger_name)
    level = logger.level
    logger.setLevel(logging.ERROR)
    try:
        yield
    finally:
        logger.setLevel(level)


def _write_bundle(model, directory: Path) -> None:
    import torch

    transformer = model[0]
    tokenizer = getattr(getattr(transformer, "tokenizer", None), "backend_tokenizer", None)
    if tokenizer is None:
        raise ValueError("the model has no fast (Rust) tokenizer")
    tokenize = getattr(model, "preprocess", None) or model.tokenize
    features = {
        key: value
        for key, value in tokenize(list(PROBE_TEXTS[:2])).items()
        if isinstance(value, torch.Tensor) and key in ("input_ids", "attention_mask", "token_type_ids")
    }
    names = list(features)

    class _Normalised(torch.nn.Module):
        def __init__(self):
            super().__init__()
            self.model = model

        def forward(self, *tensors):
            inputs = dict(zip(names, tensors, strict=True))
            return torch.nn.functional.normalize(
                self.model({**inputs, "modality": "text"})["sentence_embedding"], dim=-1
            )

    axes = {0: torch.export.Dim("batch"), 1: torch.export.Dim("tokens")}
    was_training = model.training
    model.eval()
    try:
        # The exporter reports its steps with print(): keep them (and its warnings) off stdout,
        # which carries search results.
        with (
            torch.no_grad(),
            contextlib.redirect_stdout(io.StringIO()),
            warnings.catch_warnings(),
            _quiet("torch"),
        ):
            warnings.simplefilter("ignore")
            torch.onnx.export(
                _Normalised(),
                tuple(features[name].cpu() for name in names),
                str(directory / "model.onnx"),
                input_names=names,
                dynamic_shapes=(tuple(axes for _ in names),),  # one entry: forward(*tensors)
                dynamo=True,
                verbose=False,
            )
    finally:
        model.train(was_training)
    tokenizer = type(tokenizer).from_str(tokenizer.to_str())  # a copy: the model's own stays as it is
    tokenizer.enable_truncation(max_length=int(model.max_seq_length))
    pad_id = transformer.tokenizer.pad_token_id or 0
    tokenizer.enable_padding(pad_id=pad_id, pad_token=transformer.tokenizer.pad_token or "[PAD]")
    tokenizer.save(str(directory / "tokenizer.json"))
    meta = {
        "format": BUNDLE_FORMAT,
        "max_seq_length": int(model.max_seq_length),
        "dimension": int(model.get_embedding_dimension()),
        "inputs": names,
    }
    (directory / BUNDLE_FILE).write_text(json.dumps(meta, indent=2) + "\n")

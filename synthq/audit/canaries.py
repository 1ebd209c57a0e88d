"""Canaries for auditing a query generator: secrets on the *query* side of (document, query) pairs.

Queries are what synthq protects, so every canary hides a random 10-digit secret in the query a
generator learns to produce for a document. Three shapes follow the paper's (Carranza et al.,
section 6.3), turned around so that the secret is in the query:

* ``random-query``: the document is a random query-like string of corpus words (no real
  document), and the query is the secret alone. Tests memorisation with no semantic context.
* ``real-document``: the document is a real corpus document, and the query is one of its real
  training queries followed by the secret. The hardest case to spot: a natural pair plus a secret.
* ``random-document``: the document is a random passage-length string of corpus words, and the
  query is a random short string of corpus words followed by the secret.

Each canary has ``references`` candidate queries that differ only in the secret (fresh random
10-digit strings), so ranking the true query among them measures what the model memorised
about the secret itself. Held-out canaries are built the same way and never inserted: they are
the control group.
"""

from __future__ import annotations

import random
import re
from dataclasses import dataclass, field

from synthq.data.beir_io import BeirDataset
from synthq.data.pairs import document_text
from synthq.errors import SynthqError

SHAPES = ("random-query", "real-document", "random-document")
SECRET_DIGITS = 10


@dataclass
class Canary:
    """One canary: a (document, query) pair whose query contains ``secret``."""

    canary_id: str
    shape: str
    document: str
    query_prefix: str  # the query text before the secret ("" for random-query)
    secret: str
    repetitions: int  # 0 = held out (never inserted)
    reference_secrets: list[str] = field(default_factory=list)

    def query_with(self, secret: str) -> str:
        return f"{self.query_prefix} {secret}".strip()

    @property
    def query(self) -> str:
        return self.query_with(self.secret)


def random_secret(rng: random.Random) -> str:
    return "".join(rng.choice("0123456789") for _ in range(SECRET_DIGITS))


def _vocabulary(dataset: BeirDataset) -> list[str]:
    words = sorted(
        {w for doc in dataset.corpus.values() for w in re.findall(r"[a-z]{3,}", doc["text"].lower())}
    )
    if len(words) < 50:
        raise SynthqError("the corpus is too small to draw random canary text from (fewer than 50 words)")
    return words


def _random_words(rng: random.Random, vocabulary: list[str], low: int, high: int) -> str:
    return " ".join(rng.choice(vocabulary) for _ in range(rng.randint(low, high)))


def make_canaries(
    dataset: BeirDataset,
    split: str,
    shapes: list[str],
    per_shape: int,
    repetitions: list[int],
    references: int,
    seed: int,
) -> list[Canary]:
    """``per_shape`` canaries for each shape and each repetition count, plus as many held-out
    controls (repetitions = 0) per shape. Deterministic for a seed."""
    unknown = sorted(set(shapes) - set(SHAPES))
    if unknown:
        raise SynthqError(f"unknown canary shape(s) {', '.join(unknown)}; choose from {', '.join(SHAPES)}")
    if per_shape < 1 or references < 10:
        raise SynthqError("need at least 1 canary per shape and at least 10 references")
    if any(r < 1 for r in repetitions):
        raise SynthqError(f"repetitions must be ≥ 1, got {repetitions}")
    rng = random.Random(seed)
    vocabulary = _vocabulary(dataset)
    qrels = dataset.require_split(split)
    real_pairs = sorted((q, d) for q, docs in qrels.items() for d, rel in docs.items() if rel > 0)
    canaries: list[Canary] = []
    for shape in shapes:
        for repetition in [*repetitions, 0]:
            for index in range(per_shape):
                if shape == "random-query":
                    document, prefix = _random_words(rng, vocabulary, 3, 6), ""
                elif shape == "real-document":
                    query_id, doc_id = rng.choice(real_pairs)
                    document, prefix = document_text(dataset.corpus[doc_id]), dataset.queries[query_id]
                else:
                    document = _random_words(rng, vocabulary, 40, 80)
                    prefix = _random_words(rng, vocabulary, 2, 4)
                secret = random_secret(rng)
                reference_secrets: list[str] = []
                while len(reference_secrets) < references:
                    candidate = random_secret(rng)
                    if candidate != secret and candidate not in reference_secrets:
                        reference_secrets.append(candidate)
                canaries.append(
                    Canary(
                        canary_id=f"canary-{shape}-r{repetition}-{index}",
                        shape=shape,
                        document=document,
                        query_prefix=prefix,
                        secret=secret,
                        repetitions=repetition,
                        reference_secrets=reference_secrets,
                    )
                )
    return canaries


def inserted_pair_count(canaries: list[Canary]) -> int:
    return sum(c.repetitions for c in canaries)

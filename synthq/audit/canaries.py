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

One-run canaries (:func:`make_one_run_canaries`, for :mod:`synthq.audit.one_run`) are the
``random-query`` shape — a few random corpus words as the document, the secret alone as the
query — each with its own secret coin: included once in training with probability ½.

Randomness: with ``seed=None`` secrets and coins come from the operating system
(:class:`random.SystemRandom`), so nobody can replay them; an integer seed makes the canaries
reproducible (for tests and research runs) and is then as public as the config it sits in.

Stored records (:meth:`Canary.record`) never contain private text: a ``real-document``
canary's prefix is a private training query, so only its query id is written.
"""

from __future__ import annotations

import hashlib
import random
import re
from dataclasses import dataclass, field
from typing import Any

from synthq.data.beir_io import BeirDataset
from synthq.data.pairs import document_text
from synthq.runtime.errors import SynthqError

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
    document_id: str | None = None  # real-document: the corpus document
    query_prefix_id: str | None = None  # real-document: the private query used as prefix

    def record(self) -> dict[str, Any]:
        """What the audit artifact stores: ids and the secret, never a private query's text."""
        record = {
            "canary": self.canary_id,
            "shape": self.shape,
            "secret": self.secret,
            "repetitions": self.repetitions,
        }
        if self.query_prefix_id is not None:
            record.update(document_id=self.document_id, query_prefix_id=self.query_prefix_id)
        else:
            record.update(document=self.document, query_prefix=self.query_prefix)
        return record

    def query_with(self, secret: str) -> str:
        return f"{self.query_prefix} {secret}".strip()

    @property
    def query(self) -> str:
        return self.query_with(self.secret)


def canary_rng(seed: int | None) -> random.Random:
    """Secret OS randomness for ``None``, a reproducible generator for an integer seed."""
    return random.SystemRandom() if seed is None else random.Random(seed)


def random_secret(rng: random.Random) -> str:
    return "".join(rng.choice("0123456789") for _ in range(SECRET_DIGITS))


def other_secrets(rng: random.Random, secret: str, count: int) -> list[str]:
    """``count`` distinct random secrets, none equal to ``secret``: the candidates a secret is
    ranked among (exposure) or compared with (the one-run score)."""
    others: list[str] = []
    while len(others) < count:
        candidate = random_secret(rng)
        if candidate != secret and candidate not in others:
            others.append(candidate)
    return others


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
    seed: int | None,
) -> list[Canary]:
    """``per_shape`` canaries for each shape and each repetition count, plus as many held-out
    controls (repetitions = 0) per shape. Deterministic for an integer seed."""
    unknown = sorted(set(shapes) - set(SHAPES))
    if unknown:
        raise SynthqError(f"unknown canary shape(s) {', '.join(unknown)}; choose from {', '.join(SHAPES)}")
    if per_shape < 1 or references < 10:
        raise SynthqError("need at least 1 canary per shape and at least 10 references")
    if any(r < 1 for r in repetitions):
        raise SynthqError(f"repetitions must be ≥ 1, got {repetitions}")
    rng = canary_rng(seed)
    vocabulary = _vocabulary(dataset)
    qrels = dataset.require_split(split)
    real_pairs = sorted((q, d) for q, docs in qrels.items() for d, rel in docs.items() if rel > 0)
    canaries: list[Canary] = []
    for shape in shapes:
        for repetition in [*repetitions, 0]:
            for index in range(per_shape):
                query_id = doc_id = None
                if shape == "random-query":
                    document, prefix = _random_words(rng, vocabulary, 3, 6), ""
                elif shape == "real-document":
                    query_id, doc_id = rng.choice(real_pairs)
                    document, prefix = document_text(dataset.corpus[doc_id]), dataset.queries[query_id]
                else:
                    document = _random_words(rng, vocabulary, 40, 80)
                    prefix = _random_words(rng, vocabulary, 2, 4)
                secret = random_secret(rng)
                reference_secrets = other_secrets(rng, secret, references)
                canaries.append(
                    Canary(
                        canary_id=f"canary-{shape}-r{repetition}-{index}",
                        shape=shape,
                        document=document,
                        query_prefix=prefix,
                        secret=secret,
                        repetitions=repetition,
                        reference_secrets=reference_secrets,
                        document_id=doc_id,
                        query_prefix_id=query_id,
                    )
                )
    return canaries


@dataclass
class OneRunCanary:
    """A one-run canary: random words as the document, a secret as the query, and its coin."""

    canary_id: str
    document: str
    secret: str
    included: bool
    user: str = ""  # the canary user who "wrote" it (user-level audits; one coin per user)

    @property
    def query(self) -> str:
        return self.secret

    def reference_secrets(self, count: int) -> list[str]:
        """``count`` other random secrets of the same form, drawn from a generator seeded by this
        canary's secret: fixed for the canary, independent of every coin, never the secret."""
        rng = random.Random(hashlib.sha256(f"references\x00{self.secret}".encode()).digest())
        return other_secrets(rng, self.secret, count)

    def record(self) -> dict[str, Any]:
        return {
            "canary": self.canary_id,
            "document": self.document,
            "secret": self.secret,
            "included": self.included,
            **({"user": self.user} if self.user else {}),
        }


def make_one_run_canaries(
    dataset: BeirDataset, count: int, seed: int | None, queries_per_user: int = 0
) -> list[OneRunCanary]:
    """``count`` canaries with distinct secrets, each included with probability ½ by its own coin.

    With ``queries_per_user`` m ≥ 1 (the user-level audit) the ``count`` canaries are *users*:
    each writes m canary pairs (own document, own secret) and one coin includes or excludes all
    of them, so the membership guessed is the person's. The documents are random corpus words
    (public), so no canary carries private text."""
    if count < 2:
        raise SynthqError(f"the one-run audit needs at least 2 canaries, got {count}")
    rng = canary_rng(seed)
    vocabulary = _vocabulary(dataset)
    canaries, secrets = [], set()
    for index in range(count):
        pairs = []
        for _ in range(max(queries_per_user, 1)):
            secret = random_secret(rng)
            while secret in secrets:
                secret = random_secret(rng)
            secrets.add(secret)
            pairs.append((_random_words(rng, vocabulary, 4, 8), secret))
        included = rng.random() < 0.5
        if not queries_per_user:
            canaries.append(OneRunCanary(f"canary-{index}", pairs[0][0], pairs[0][1], included))
            continue
        user = f"canary-user-{index}"
        canaries += [
            OneRunCanary(f"canary-{index}-{j}", document, secret, included, user)
            for j, (document, secret) in enumerate(pairs)
        ]
    return canaries


def per_user(canaries: list[OneRunCanary], scores) -> tuple[list[str], list[float], list[bool]]:
    """Scores of a user-level audit: each canary user's mean score over their canaries, with
    their coin (the unit the one-run bound is about). Users in first-appearance order."""
    grouped: dict[str, list[float]] = {}
    coins: dict[str, bool] = {}
    for canary, score in zip(canaries, scores, strict=True):
        grouped.setdefault(canary.user, []).append(float(score))
        coins[canary.user] = canary.included
    users = list(grouped)
    return users, [sum(grouped[u]) / len(grouped[u]) for u in users], [coins[u] for u in users]


def inserted_pair_count(canaries: list[Canary]) -> int:
    return sum(c.repetitions for c in canaries)

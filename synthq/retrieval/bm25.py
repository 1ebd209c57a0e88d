"""BM25, the lexical reference row, with the ``bm25s`` package.

Lucene's BM25 variant (k1 = 1.5, b = 0.75): ``score(q, d) = Σ_t idf(t) · tf / (tf + k1 · (1 − b
+ b · |d| / avgdl))`` with ``idf(t) = ln(1 + (N − df + 0.5) / (df + 0.5))``, over lowercased
word tokens of two or more characters with English stopwords removed, on ``title. text``.
BEIR's published BM25 numbers come from Elasticsearch's English analyzer, which also stems, so
they differ slightly from these. Documents that share no term with the query (score 0) are not
returned, as a search engine would not return them.
"""

from __future__ import annotations

import logging

from synthq.data.pairs import document_text
from synthq.runtime.errors import DataError

K1 = 1.5
B = 0.75


def bm25_search(
    corpus: dict[str, dict[str, str]],
    queries: dict[str, str],
    top_k: int,
    ignore_identical_ids: bool = False,
) -> dict[str, dict[str, float]]:
    """The ``top_k`` documents per query by BM25 score, best first.

    Args:
        corpus: ``{doc_id: {"title", "text"}}``.
        queries: ``{query_id: text}``.
        top_k: documents kept per query.
        ignore_identical_ids: drop the document with the query's own id (ArguAna, Quora).
    """
    import bm25s

    if not corpus:
        raise DataError("the corpus is empty: nothing to index for BM25")
    logging.getLogger("bm25s").setLevel(logging.WARNING)
    doc_ids = sorted(corpus)
    retriever = bm25s.BM25(k1=K1, b=B, method="lucene")
    retriever.index(
        bm25s.tokenize([document_text(corpus[d]) for d in doc_ids], stopwords="en", show_progress=False),
        show_progress=False,
    )
    query_ids = sorted(queries)
    k = min(top_k + int(ignore_identical_ids), len(doc_ids))
    tokens = bm25s.tokenize([queries[q] for q in query_ids], stopwords="en", show_progress=False)
    indices, scores = retriever.retrieve(tokens, k=k, show_progress=False)
    results = {}
    for row, query_id in enumerate(query_ids):
        hits = {}
        for index, score in zip(indices[row].tolist(), scores[row].tolist(), strict=True):
            if score <= 0 or (ignore_identical_ids and doc_ids[index] == query_id):
                continue
            hits[doc_ids[index]] = float(score)
            if len(hits) == top_k:
                break
        results[query_id] = hits
    return results

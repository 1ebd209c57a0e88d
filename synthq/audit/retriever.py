"""Membership scores from a retriever: does it rank a canary's document higher for its secret?

The end-to-end audit asks what the deployed product leaks, not the generator. Every one-run
canary is a (document, secret query) pair; after a retriever has been trained (on synthetic
queries from an audited generator, or on the private pairs directly), the canary's score is

    score_i = sim(secret_i, document_i) − mean_{j ≠ i} sim(secret_i, document_j)

with cosine similarities of the retriever's embeddings and the other canaries' documents as the
controls: how much closer the canary's own document is to its secret than the documents that
were never paired with that secret. An included canary whose secret reached the retriever
scores high; excluded canaries are the null. The scores feed :func:`synthq.audit.one_run.one_run_audit`.
"""

from __future__ import annotations

import numpy as np
import torch

from synthq.models.encoder import embed


@torch.no_grad()
def retriever_scores(
    encoder,
    queries: list[str],
    documents: list[str],
    batch_size: int = 64,
    max_query_length: int = 32,
    max_doc_length: int = 128,
) -> np.ndarray:
    """One membership score per (query, document) pair, as in the module docstring."""
    if len(queries) != len(documents) or len(queries) < 2:
        raise ValueError("need one document per query and at least two canaries")
    encoder.eval()

    def encode(texts: list[str], length: int) -> torch.Tensor:
        return torch.cat(
            [embed(encoder, texts[i : i + batch_size], length) for i in range(0, len(texts), batch_size)]
        )

    similarity = encode(queries, max_query_length) @ encode(documents, max_doc_length).T
    own = similarity.diagonal()
    others = (similarity.sum(dim=1) - own) / (len(queries) - 1)
    return (own - others).float().cpu().numpy()

"""Retrieval for evaluation: cached dense encoding, exact or FAISS search, BM25, pytrec_eval metrics.

- :mod:`synthq.retrieval.cache`: corpus embeddings cached on disk by content hash.
- :mod:`synthq.retrieval.topk`: exact chunked top-k search (CPU/GPU) and FAISS.
- :mod:`synthq.retrieval.bm25`: the BM25 reference row (``bm25s``).
- :mod:`synthq.retrieval.metrics`: NDCG@{1,3,5,10,100}, Recall@{10,100}, MRR@10, MAP.
- :mod:`synthq.retrieval.dense`: scoring a dense retriever on a dataset (encode, search, throughput).
- :mod:`synthq.retrieval.significance`: paired tests, bootstrap intervals, Holm.
- :mod:`synthq.retrieval.selection`: dev-best selection, accounted or noisy (report-noisy-max).
- :mod:`synthq.retrieval.trec`: TREC run files.
"""

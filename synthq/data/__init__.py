"""BEIR-format data: reading (through a memory-mapped Arrow cache), writing, validation, named
sources, training pairs, users and the synthetic set's payload.

* :mod:`~synthq.data.beir_io` — BEIR read/write and validation (errors by file and line).
* :mod:`~synthq.data.store`, :mod:`~synthq.data.arrow_views` — the memory-mapped Arrow cache keyed by
  file sha256, and its lazy mappings (corpus, queries, qrels).
* :mod:`~synthq.data.sources` — named sources (embedded, msmarco, beir:NAME, irds:ID, sub-datasets)
  and which splits are declared public.
* :mod:`~synthq.data.pairs` — training pairs (lazy), document text.
* :mod:`~synthq.data.users` — user ids from metadata or users.tsv, queries per user.
* :mod:`~synthq.data.summary` — ``synthq data info``.
* :mod:`~synthq.data.synthetic` — which public documents get queries, the degenerate-query rule,
  the synthetic set's BEIR payload.
"""

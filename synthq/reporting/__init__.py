"""Reporting: what ``eval`` and ``report`` print and write, with ε beside every number.

* :mod:`~synthq.reporting.eval_files` — the files an evaluation writes that other stages read
  (``results.json`` rows, ``per_query.json``, ``selection.md``): names, row fields, reading back.
* :mod:`~synthq.reporting.labels` — what a retriever is, read off its lineage: method labels,
  synthetic-set recipes, training variants.
* :mod:`~synthq.reporting.systems` — rows merged over seeds and generator replicates, and the
  composed guarantee of replicates.
* :mod:`~synthq.reporting.epsilon` — how a row's ε is shown (public rows, unaccounted selection).
* :mod:`~synthq.reporting.tables` — markdown tables: per dataset, across datasets, significance,
  paper vs ours, similarity.
* :mod:`~synthq.reporting.plot` — the privacy-utility plot.
* :mod:`~synthq.reporting.merge` — several evaluations published together: merged rows and the
  combined guarantee.
"""

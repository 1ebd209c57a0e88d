"""Reporting: what ``eval`` and ``report`` print and write, with ε beside every number.

* :mod:`~synthq.reporting.eval_files` — the files an evaluation writes that other stages read
  (``results.json`` rows, ``per_query.json``, ``selection.md``): names, row fields, reading back.
* :mod:`~synthq.reporting.labels` — what a retriever is, read off its lineage: method labels,
  synthetic-set recipes, training variants.
* :mod:`~synthq.reporting.row_privacy` — the releases a row carries (model, data, selection) and
  the two guarantees recomputed from them wherever a number is shown: the model's and the scores'.
* :mod:`~synthq.reporting.systems` — rows merged over seeds and generator replicates, their
  guarantee recomputed from the union of their releases.
* :mod:`~synthq.reporting.epsilon` — how a row's ε is shown: the model's ε column (public rows,
  unaccounted selection), the scores' ε and the sentence saying why when it differs.
* :mod:`~synthq.reporting.tables` — markdown tables: per dataset, across datasets, significance,
  paper vs ours, similarity.
* :mod:`~synthq.reporting.plot` — the privacy-utility plot.
* :mod:`~synthq.reporting.merge` — several evaluations published together: merged rows (a model
  in several of them carries the union of their releases, whatever their order) and the combined
  guarantee.
"""

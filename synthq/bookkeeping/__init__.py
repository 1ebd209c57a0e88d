"""The bookkeeping of releases: what the releases of a set of artifacts add up to (the ledger),
and how it is reported — the privacy floor above ``artifacts/`` (it opens manifests;
:mod:`synthq.privacy` below it never does). Stages, reporting and the command line read it; it
imports nothing of theirs. (Not named ``ledger``: ``synthq.ledger`` is the Python API's function.)

* :mod:`~synthq.bookkeeping.inputs` — where every input came from (starting models, data, public
  documents, public pairs), and what reading it brings into an artifact.
* :mod:`~synthq.bookkeeping.releases` — the releases behind a set of artifacts, per private
  dataset and unit: what they cost together.
* :mod:`~synthq.bookkeeping.reaccounting` — each release recomputed at other δ, and its
  Gaussian-DP μ (where exact).
* :mod:`~synthq.bookkeeping.statement` — the one-page privacy statement a reviewer signs, rendered
  from a ledger (``synthq ledger --statement``); its tables are
  :mod:`~synthq.bookkeeping.statement_tables`.
* :mod:`~synthq.bookkeeping.splits` — the privacy of evaluation scores: which splits are
  private, and the guarantee a score carries.
"""

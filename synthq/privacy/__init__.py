"""Privacy: what an artifact guarantees, the accountants behind its ε, and what a run costs.

* :mod:`~synthq.privacy.guarantee` — the (ε, δ) :class:`Guarantee` type and its composition per
  privacy unit.
* :mod:`~synthq.privacy.accounting` — Opacus' accountants: σ calibrated to a target ε, δ and budget
  checks, a recorded ε recomputed when an artifact is opened.
* :mod:`~synthq.privacy.memo` — the accountant's answers remembered (keyed, HMAC-checked) across
  commands.
* :mod:`~synthq.privacy.keys` — the data owner's secret key: keyed digests of private data and the
  seal of every manifest.
* :mod:`~synthq.privacy.unit_sets` — the unit sets of releases and which releases share privacy units.
* :mod:`~synthq.privacy.inputs` — where every input came from (starting models, data, public
  documents), and what reading it brings into an artifact.
* :mod:`~synthq.privacy.ledger` — what a set of artifacts costs together, per private dataset.
* :mod:`~synthq.privacy.reaccounting` — each release recomputed at other δ, and its Gaussian-DP μ
  (where exact).
* :mod:`~synthq.privacy.statement` — the one-page privacy statement a reviewer signs, rendered
  from a ledger (``synthq ledger --statement``); its tables are
  :mod:`~synthq.privacy.statement_tables`.
* :mod:`~synthq.privacy.splits` — the privacy of evaluation scores: which splits are private, and
  the guarantee a score carries.
"""

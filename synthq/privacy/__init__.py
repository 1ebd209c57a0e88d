"""Privacy, the lower floor: what one release guarantees, the accountants behind its ε, and the
owner's secrets. Nothing here opens an artifact; ``artifacts/`` is built on it, and what composes
and reports the releases of many artifacts lives a floor higher, in :mod:`synthq.bookkeeping`.

* :mod:`~synthq.privacy.guarantee` — the (ε, δ) :class:`Guarantee` type and its composition per
  privacy unit.
* :mod:`~synthq.privacy.accounting` — Opacus' accountants: σ calibrated to a target ε, δ and budget
  checks, a recorded ε recomputed when an artifact is opened.
* :mod:`~synthq.privacy.sampled_gaussian` — the σ search's guide: Opacus' RDP sums of the subsampled
  Gaussian vectorised over orders, and Opacus' own analysis (without torch) for the exact check.
* :mod:`~synthq.privacy.events` — a release's accounting event, typed (σ, q, steps, δ; selections;
  compositions), read from the recorded details: what ε is recomputed from.
* :mod:`~synthq.privacy.substitution` — the ε of a Poisson-subsampled Gaussian release when one
  unit's data is replaced rather than removed (a user-level release seen per query).
* :mod:`~synthq.privacy.memo` — the accountant's answers remembered (keyed, HMAC-checked) across
  commands.
* :mod:`~synthq.privacy.keys` — the data owner's secret key: keyed digests of private data and the
  seal of every manifest.
* :mod:`~synthq.privacy.digests` — the digest of anything an artifact records: keyed for private
  data, plain sha256 for public files.
* :mod:`~synthq.privacy.unit_sets` — the unit sets of releases and which releases share privacy units.
"""

"""Direct DP training of dual encoders with the in-batch softmax loss: the paper's baselines.

Each mechanism turns one Poisson-sampled batch of (query, document) pairs into a clipped
gradient sum whose ℓ2 sensitivity it states; :func:`privatize` then adds Gaussian noise with
standard deviation ``σ × sensitivity``, where σ comes from the accountant for the sampling rate
and step count. The privacy unit is stated once, below.

The four mechanisms differ in what they clip, which decides the sensitivity (see Wang et al.,
"DP-GCL", section 2.3, Kong et al., "Logit-DP", and Carranza et al., section 5.3.2):

* :class:`SampleClipping` — per-query clipping (the paper's DP-SGD baseline): ``(2B − 1)C``.
* :class:`BatchClipping` — clip the whole batch gradient (DP-CLIP / "Naive-DP"): ``2C``.
* :class:`GroupClipping` — DP-GCL: groups with in-group negatives, each group clipped: ``2C``.
* :class:`~synthq.dp.contrastive.logit.LogitClipping` — Logit-DP: per-pair similarity gradients
  clipped: ``(G1 + G2 + (B − 1)L)·C`` (constants derived there for cosine / temperature).

The privacy unit is one query id with all of its pairs, or under ``--privacy-unit user`` one user
with all of their kept queries' pairs (:class:`synthq.dp.privacy_units.PrivacyUnits`): units are
Poisson-sampled, and a unit with ``k`` pairs gives each of its rows weight ``1/k`` where rows are
clipped one by one. The proofs below say "query"; each holds word for word for the user unit,
because they use only that a unit's rows enter together, carry weights summing to 1, and (group
clipping) share one keyed group draw (:attr:`Example.unit_id`). Logit-DP's proof needs one row
per unit, so it refuses users with several pairs. ``B`` is a cap on the number of sampled units
for the mechanisms whose sensitivity grows with the batch; an over-full batch is replaced by an empty one
(:func:`synthq.dp.privacy_units.poisson_units`), so δ needs no tail term. Each mechanism registers
itself (``--dp NAME``) and has a neighbouring-batch test of its bound (tests/dp).

* :mod:`~synthq.dp.contrastive.examples` — the examples the mechanisms read, the encoder as a
  function of texts, group clipping's augmentation;
* :mod:`~synthq.dp.contrastive.batch`, :mod:`~synthq.dp.contrastive.group`,
  :mod:`~synthq.dp.contrastive.sample`, :mod:`~synthq.dp.contrastive.logit` — one registered
  mechanism each;
* :mod:`~synthq.dp.contrastive.per_group` — per-group gradients of a batch in one backward pass
  (by the layer rules of :mod:`synthq.dp.layer_rules`);
* :mod:`~synthq.dp.contrastive.sample_vmap` — ``--dp sample``'s per-query clipped sum (the query
  side per chunk, the documents looped or vmapped).
"""

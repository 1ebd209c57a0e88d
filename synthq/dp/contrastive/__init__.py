"""Direct DP training of a dual-encoder retriever with in-batch softmax: the baselines.

* :mod:`~synthq.dp.contrastive.mechanisms` — the registered ``batch``, ``group`` and ``sample``
  clipping mechanisms and the examples they read;
* :mod:`~synthq.dp.contrastive.logit` — Logit-DP (``logit``): clipping the gradients of the logits;
* :mod:`~synthq.dp.contrastive.per_group` — per-group gradients of a batch in one backward pass
  (a registry of layer rules);
* :mod:`~synthq.dp.contrastive.sample_vmap` — ``--dp sample``'s per-query clipped sum (the query
  side per chunk, the documents looped or vmapped).
"""

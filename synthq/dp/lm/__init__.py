"""DP fine-tuning of query generators (language models): per-query and per-user clipping.

* :mod:`~synthq.dp.lm.per_query`, :mod:`~synthq.dp.lm.per_user` — the registered mechanisms,
  one a module;
* :mod:`~synthq.dp.lm.step` — :class:`DPStep`, one logical DP step over micro-batches (Poisson
  sampling, clipping, noise once);
* :mod:`~synthq.dp.lm.clippers` — the per-example clipping engines by ``grad_sample_mode``
  (ghost, hooks, vmap);
* :mod:`~synthq.dp.lm.hooks` — Opacus' per-example gradients and ghost clipping as clippers;
* :mod:`~synthq.dp.lm.ghost` — ghost norms (mixed per layer, tied embeddings exact, a unit's
  combined gradient);
* :mod:`~synthq.dp.lm.grad_samplers` — the grad samplers Opacus lacks (RMS norms, T5's relative
  attention bias);
* :mod:`~synthq.dp.lm.training` — the generator's training state (DP or not): step, save, resume;
* :mod:`~synthq.dp.lm.learning_check` — did fine-tuning learn (weights moved, public held-out loss).
"""

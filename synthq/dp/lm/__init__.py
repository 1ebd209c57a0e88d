"""DP fine-tuning of query generators (language models): per-query and per-user clipping.

* :mod:`~synthq.dp.lm.mechanisms` — the registered mechanisms (``per-query``, ``per-user``), the
  vmap clipper and :class:`DPStep`, one logical step over micro-batches;
* :mod:`~synthq.dp.lm.hooks` — Opacus' per-example gradients and ghost clipping as clippers;
* :mod:`~synthq.dp.lm.ghost` — ghost norms (mixed per layer, tied embeddings exact, a unit's
  combined gradient);
* :mod:`~synthq.dp.lm.grad_samplers` — the grad samplers Opacus lacks (RMS norms, T5's relative
  attention bias);
* :mod:`~synthq.dp.lm.training` — the generator's training state (DP or not): step, save, resume;
* :mod:`~synthq.dp.lm.learning_check` — did fine-tuning learn (weights moved, public held-out loss).
"""

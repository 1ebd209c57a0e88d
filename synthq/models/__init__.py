"""Models: resolution (aliases, local dirs, hub ids), the query generator and its sampling, the
dual encoders.

* :mod:`~synthq.models.resolve` — aliases, hub ids, directories, devices.
* :mod:`~synthq.models.generator` — :class:`QueryGenerator` (causal or seq2seq, LoRA).
* :mod:`~synthq.models.sampling` — per-document seeded nucleus sampling in synthq's own decoding
  loop.
* :mod:`~synthq.models.sequence_loss` — the per-sequence loss every clipper differentiates.
* :mod:`~synthq.models.training_step` — the non-private generator step (the DP step's twin).
* :mod:`~synthq.models.encoder`, :mod:`~synthq.models.lm_encoder`,
  :mod:`~synthq.models.onnx_encoder` — sentence-transformers encoders, a mean-pooled encoder from a
  language model's first blocks, and the checked ONNX export search serves from.
"""

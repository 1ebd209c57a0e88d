"""Differentially private training: the engine (mechanism registry, privacy plan), privacy units
and Poisson sampling, secret randomness and noise, clipping primitives, and the registered
mechanisms — per-query clipping of query generators (``lm*``, ``generator_training``), the
retriever baselines (``contrastive*``) and Private Evolution's vote (``evolution``) — and the check
that fine-tuning learned (``learning_check``)."""

"""Differentially private training: the engine (mechanism registry, privacy plan), privacy units
and Poisson sampling, secret randomness and noise, clipping primitives, and the registered
mechanisms by family — the query generators' clipping (:mod:`synthq.dp.lm`), the retriever
baselines (:mod:`synthq.dp.contrastive`) and Private Evolution's vote (``evolution``) — with
``--batch-size auto`` (``batch_choice``) and ``synthq plan`` (``route_plans``)."""

"""synthq: private synthetic-query retrieval.

Fine-tune a query generator with differential privacy, sample synthetic queries for public
documents, train a dual encoder on them (DP post-processing keeps the guarantee), evaluate it,
and audit what the generator leaks. The README shows the commands; docs/ARCHITECTURE.md maps the
code.

The stages are callable from Python too (:mod:`synthq.api`, loaded on first use so that
``import synthq`` stays light)::

    from synthq import finetune_lm, generate, train_retriever, evaluate
"""

from synthq._version import __version__

API = (
    "finetune_lm", "generate", "filter_queries", "evolve", "train_retriever", "evaluate",
    "report", "similarity", "canary_audit", "run_stage", "open_artifact", "ledger",
)  # fmt: skip
__all__ = ["__version__", *API]


def __getattr__(name: str):
    if name in API:
        from synthq import api

        return getattr(api, name)
    raise AttributeError(f"module 'synthq' has no attribute {name!r}")

"""Empirical privacy audits of ``synthq canary-audit``: the canaries (``canaries``), the audited
training set (``training_set``), scoring models (``scoring``, ``retriever``), the bounds
(``one_run``, ``exposure``), and the report with its tables and plots (``report``, ``tables``)."""

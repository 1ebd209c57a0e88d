"""synthq: private synthetic-query retrieval.

Fine-tune a query generator with differential privacy, sample synthetic queries for public
documents, train a dual encoder on them (DP post-processing keeps the guarantee), evaluate it,
and audit what the generator leaks. The README shows the commands; docs/ARCHITECTURE.md maps the
code.
"""

__version__ = "0.2.0"

"""Pipelines, ``synthq run PIPELINE.yaml``: chain stages through their public ``run``, skipping what is done.

- :mod:`~synthq.pipeline.plan`: read a pipeline file, expand sweeps, variables and ``@stage`` references,
  validate every config, know which stages are up to date.
- :mod:`~synthq.pipeline.expand`: sweeps, ``{var}`` and ``@stage`` references in one ``stages:`` entry.
- :mod:`~synthq.pipeline.inputs`: inputs that are not there (paths read against the current directory)
  and that no earlier stage writes: listed by ``--dry-run``, refused before a real run starts.
- :mod:`~synthq.pipeline.progress`: the ``--dry-run`` description, time estimates, time by stage kind.
- :mod:`~synthq.pipeline.run`: run a plan stage by stage, stopping if synthq's source changes underneath.
- :mod:`~synthq.pipeline.check`: ``--check``, the ``expected:`` figures against the artifacts' metrics.
- :mod:`~synthq.pipeline.schema`: ``--schema``, the JSON Schema of a pipeline file for editors.
"""

"""Stage configs: one pydantic model per stage, loadable from YAML with ``key=value`` overrides.

These models are the single source of truth for every option: the command line derives its
options from the fields (:mod:`synthq.cli.options`), and pipelines build the same objects from
YAML.

- :mod:`synthq.config.fields`: shared field types, defaults and ``StageConfig``, the base of all
- :mod:`synthq.config.generator`: finetune-lm, generate, evolve, filter
- :mod:`synthq.config.retriever`: train-retriever
- :mod:`synthq.config.evaluation`: eval, report, similarity
- :mod:`synthq.config.audit`: canary-audit
- :mod:`synthq.config.search`: ``synthq search`` (not a stage)
- :mod:`synthq.config.plan`: ``synthq plan`` (not a stage)
- :mod:`synthq.config.loading`: YAML files, ``key=value`` overrides, validation errors as one line
- :mod:`synthq.config.registry`: stage name -> stage module and config class
"""

"""``synthq evolve``, a stage package: Private Evolution (a public model writes, the private pairs
only vote). Import from the concrete modules:

- ``recipe``: the stage itself, ``run(config)`` as named phases (set up, first population or its
  checkpoint, the noisy votes with selection and variation between them, the set written);
- ``population``: the candidates per document, their votes and the survivors;
- ``prompts``: the public model's prompts (a query for a document, a variation of a query).
"""

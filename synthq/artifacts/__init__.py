"""The artifact contract: every stage writes exactly one directory holding ``manifest.json``.

An artifact is created atomically (written into a hidden sibling ``.<name>.partial`` and renamed
into place only when the stage succeeded), opened with verification (schema, stage and every
payload hash; the guarantee recomputed from its releases), and linked to its inputs by the sha256
of their manifests. A stage skips when the same config on the same inputs was already computed.

* :mod:`~synthq.artifacts.manifest` — :class:`Artifact`, opening and verifying a manifest, writing
  one sealed; the schema version and the stage names;
* :mod:`~synthq.artifacts.records` — lineage records of inputs, and an input's hash now;
* :mod:`~synthq.artifacts.freshness` — fingerprints, up-to-date checks, resumability, and
  ``existing_result``, what every stage calls first;
* :mod:`~synthq.artifacts.checkpoint` — a stage's private, resumable checkpoint, written atomically;
* :mod:`~synthq.artifacts.locking` — the output lock, and what an output may replace;
* :mod:`~synthq.artifacts.writer` — ``ArtifactWriter``, what a stage fills: payload, metrics,
  private diagnostics and the privacy record;
* :mod:`~synthq.artifacts.create` — ``create_artifact``: atomic creation, finishing the manifest;
* :mod:`~synthq.artifacts.on_main` — ``artifact_on_main``: rank 0's artifact in a torchrun job;
* :mod:`~synthq.artifacts.export` — ``export_artifact``: a release copy without private diagnostics;
* :mod:`~synthq.artifacts.process_state` — the process-global record of outputs seen, being
  written, finished and failed;
* :mod:`~synthq.artifacts.model_card` — Hugging Face model cards for model artifacts.
"""

"""Artifacts in a torchrun job: rank 0 creates the artifact, the other ranks write to a throwaway.

Kept out of :mod:`synthq.runtime.distributed` so the runtime layer need not know artifacts.
"""

from __future__ import annotations

import contextlib
import shutil
import tempfile
from collections.abc import Iterator, Sequence
from pathlib import Path
from typing import Any

from synthq.artifacts.create import create_artifact
from synthq.artifacts.freshness import config_fingerprint
from synthq.artifacts.writer import ArtifactWriter
from synthq.runtime import distributed


@contextlib.contextmanager
def artifact_on_main(out, stage: str, config: Any, inputs: Sequence[dict] = (), **options) -> Iterator:
    """:func:`~synthq.artifacts.create.create_artifact` on rank 0; a throwaway writer elsewhere.

    Every rank runs the same stage code inside the block; only rank 0's output becomes the
    artifact (``writer.primary`` tells a stage whether a large save is worth doing). The world
    size is recorded in the manifest. All ranks wait for rank 0 to finish the artifact before
    leaving, so a caller can open it next.
    """
    place = distributed.topology()
    if place.is_main:
        with create_artifact(out, stage, config, inputs, **options) as writer:
            writer.extra["distributed"] = place.describe()
            yield writer
    else:
        scratch = Path(tempfile.mkdtemp(prefix=f"synthq-rank{place.rank}-"))
        try:
            yield ArtifactWriter(
                path=Path(out),
                dir=scratch,
                stage=stage,
                config={},
                inputs=list(inputs),
                fingerprint=config_fingerprint(config, list(inputs)),
                primary=False,
            )
        finally:
            shutil.rmtree(scratch, ignore_errors=True)
    distributed.barrier()

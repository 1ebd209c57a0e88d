"""TREC run files: the ranked lists behind ``synthq eval``'s numbers, in the format IR tools read.

One line per retrieved document, six space-separated columns::

    query-id Q0 doc-id rank score tag

ranks from 1 in decreasing score (ties broken by document id, so a file is a deterministic function
of the scores), ``tag`` naming the system. ``trec_eval``, ``ir_measures``, ``ranx`` and pyserini
read it, so every number synthq prints can be recomputed — or compared with another system's run —
outside synthq.
"""

from __future__ import annotations

import re
from pathlib import Path

from synthq.runtime.errors import DataError

RUN_SUFFIX = ".trec"


def run_tag(label: str) -> str:
    """A system label as a TREC tag and file stem: no whitespace (a column separator) and nothing a
    file name cannot hold (``untrained minilm-l6`` -> ``untrained_minilm-l6``)."""
    return re.sub(r"[^A-Za-z0-9._+-]+", "_", label).strip("_") or "run"


def run_lines(results: dict[str, dict[str, float]], tag: str) -> list[str]:
    """The run file's lines for ``results`` (query id -> {doc id: score}), in query-id order."""
    lines = []
    for query_id in sorted(results):
        ranked = sorted(results[query_id].items(), key=lambda item: (-item[1], item[0]))
        for rank, (doc_id, score) in enumerate(ranked, 1):
            if any(c.isspace() for c in query_id + doc_id):
                raise DataError(f"query {query_id!r}, document {doc_id!r}: a TREC run cannot hold spaces")
            lines.append(f"{query_id} Q0 {doc_id} {rank} {score:.6f} {tag}")
    return lines


def write_run(path: Path, results: dict[str, dict[str, float]], tag: str) -> Path:
    """Write ``results`` as a TREC run file at ``path`` (parents created)."""
    path = Path(path)
    path.parent.mkdir(parents=True, exist_ok=True)
    lines = run_lines(results, tag)
    path.write_text("\n".join(lines) + ("\n" if lines else ""), encoding="utf-8")
    return path

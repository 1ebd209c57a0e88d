"""Write a public list of N document ids of a BEIR corpus, in a salted hash order.

    .venv/bin/python data/sample_documents.py pylibs --documents 2000 --out runs/logs/pylibs-docs-2000.txt

``synthq generate --documents`` writes synthetic queries only for the listed documents: on 2 CPU
cores a pylibs generator writes for 2,000 of its 8,962 documents in minutes, not an hour. The list
depends only on the corpus ids and a fixed salt (no query, no judgement, no private split), so it
is as public as the corpus; the same N gives the same documents and a shorter list is a prefix of a
longer one.
"""

from __future__ import annotations

import argparse
import hashlib
import json
import sys
from pathlib import Path

SALT = "synthq-documents"


def document_order(ids: list[str]) -> list[str]:
    return sorted(ids, key=lambda doc: hashlib.sha256(f"{SALT}:{doc}".encode()).hexdigest())


def sample(root: Path, out: Path, documents: int) -> dict:
    """Write the first ``documents`` corpus ids of ``root`` in the salted order to ``out``."""
    ids = []
    with open(root / "corpus.jsonl", encoding="utf-8") as handle:
        for line in handle:
            if line.strip():
                ids.append(json.loads(line)["_id"])
    if documents > len(ids):
        raise SystemExit(f"{root} has {len(ids)} documents, fewer than {documents}")
    out.parent.mkdir(parents=True, exist_ok=True)
    tmp = out.with_name(out.name + ".partial")
    tmp.write_text("\n".join(document_order(ids)[:documents]) + "\n", encoding="utf-8")
    tmp.replace(out)
    return {"source": str(root), "documents": documents, "out": str(out)}


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("source", help="A BEIR directory, or a name synthq ships (pylibs, pydocs).")
    parser.add_argument("--documents", type=int, required=True)
    parser.add_argument("--out", type=Path, required=True)
    args = parser.parse_args()
    from synthq.data.sources import resolve_source

    print(json.dumps(sample(Path(resolve_source(args.source)), args.out, args.documents)), file=sys.stdout)


if __name__ == "__main__":
    main()

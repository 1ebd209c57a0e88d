"""Every digest that goes into an artifact: keyed for anything private, plain sha256 for public files.

A manifest is released; a plain sha256 of private content in it is a membership oracle at ε = ∞
(anyone holding candidate copies — a click log but one click, a hypothesised dev set scored by the
released retrievers — tests them against it). So one function, :func:`artifact_digest`, makes every
content digest an artifact records:

* **private** — a private dataset (its directory or any file under it), a private split's
  derivative, any ``diagnostics/`` file (computed from private data without noise): the keyed
  digest ``"hmac:" + HMAC(owner key, sha256)`` (:func:`synthq.privacy.keys.private_data_digest`),
  stable for the owner (up-to-date checks, resume, the ledger, verifying diagnostics), untestable
  without the key;
* **public** — a public corpus, a public document list, a packaged or assumed-public model, a
  payload file (the released bytes themselves): the plain sha256, which anyone can check.

What ``generate --split S`` / ``evolve --judged-split S`` assume public is the *set* of documents
judged in S, not the (query, document) pairing of its qrels: :func:`judged_set_record` records the
digest of that set (its sorted ids), never of the qrels file.

A read of a *public* split (declared public, or a public benchmark) is recorded by what it reads and
nothing else — the corpus, that split's qrels file and that split's queries
(:func:`public_split_record`, plain: public by the declaration) — so a public-split evaluation does
not depend on the private splits beside it. Reads of private data keep the keyed record of the
whole directory (:func:`data_record`) and its identity.

Privacy unit and sensitivity: none (no release; identifiers only). Imports only
:mod:`synthq.runtime.hashing` (which imports nothing of synthq) and :mod:`synthq.privacy.keys`.
"""

from __future__ import annotations

import hashlib
from collections.abc import Iterable
from pathlib import Path

from synthq.privacy.keys import keyed_digest, private_data_digest
from synthq.runtime.hashing import file_digest, sha256_tree

KEYED_PREFIX = "hmac:"
JUDGED_SET = "judged-set"  # the kind of a lineage record naming a split's judged-document set
PUBLIC_SPLIT = "public-split"  # the kind of a lineage record naming what a read of a public split reads


def is_keyed(digest: str) -> bool:
    return str(digest).startswith(KEYED_PREFIX)


def plain_digest(path: Path) -> str:
    """sha256 of a file's content, or of a directory tree (relative paths and contents)."""
    path = Path(path)
    return sha256_tree(path) if path.is_dir() else file_digest(path)


def artifact_digest(path: Path, private: bool) -> str:
    """THE digest an artifact records for the file or directory at ``path``: keyed when it is
    ``private`` (private data, a private derivative, a ``diagnostics/`` file), plain sha256 when
    public."""
    plain = plain_digest(path)
    return private_data_digest(plain) if private else plain


def matches(path: Path, recorded: str) -> bool:
    """Whether the content at ``path`` is what ``recorded`` (plain or keyed) names, under this
    installation's key."""
    return artifact_digest(path, private=is_keyed(recorded)) == recorded


def file_record(path: Path, name: str, private: bool) -> dict:
    """Lineage entry for a single file a stage reads."""
    record = {"path": str(path), "kind": "data", "name": name, "sha256": artifact_digest(path, private)}
    if private:
        record["private"] = True
    return record


def data_record(root: Path, name: str, private: bool) -> dict:
    """Lineage entry for a data directory (a BEIR dir that is not an artifact): keyed when it
    holds private data, so a candidate dataset cannot be tested against it. ``sha256`` covers the
    whole directory (what up-to-date and resume checks compare); a private dataset also carries its
    ``identity`` (:func:`dataset_identity`), what the ledger groups its releases by."""
    record = {"path": str(root), "kind": "data", "name": name, "sha256": artifact_digest(root, private)}
    if private:
        record["private"] = True
        if (identity := dataset_identity(root)) is not None:
            record["identity"] = identity
    return record


def set_digest(ids: Iterable[str]) -> str:
    """sha256 of a set of ids: the sorted unique ids joined by newlines."""
    return hashlib.sha256("\n".join(sorted(set(ids))).encode()).hexdigest()


judged_set_digest = set_digest  # the judged-document set of a split (assumed public)


def dataset_identity(root: Path) -> str | None:
    """Which private dataset this is, for the ledger's per-dataset totals: keyed, over its query
    ids only — so no unrelated edit (a privacy.json or users.tsv added, a typo fixed in the corpus
    or a query, user metadata added) splits one dataset's releases into two "datasets" whose totals
    would each understate. A set of sub-datasets (CQADupStack's layout) is named by the union of its
    parts' query ids, each prefixed by its part; ``None`` where there are no queries at all."""
    from synthq.data.beir_io import read_queries

    root = Path(root)
    files = [("", root / "queries.jsonl")] if (root / "queries.jsonl").is_file() else []
    if not files and root.is_dir():
        files = [(f"{part.name}/", part / "queries.jsonl") for part in sorted(root.iterdir())]
        files = [(prefix, path) for prefix, path in files if path.is_file()]
    if not files:
        return None
    ids = [prefix + query_id for prefix, path in files for query_id in read_queries(path)]
    return KEYED_PREFIX + keyed_digest("private-dataset", set_digest(ids))


def judged_set_record(qrels_path: Path, split: str) -> dict:
    """Lineage entry for the judged-document set of ``split`` (assumed public, stated as such):
    the digest of the set of ids, not of the private qrels file."""
    from synthq.data.synthetic import judged_documents

    return {
        "path": str(qrels_path),
        "kind": JUDGED_SET,
        "name": f"documents judged in split {split}",
        "split": split,
        "sha256": judged_set_digest(judged_documents(qrels_path)),
    }


def public_split_digest(root: Path, split: str) -> str | None:
    """Plain sha256 of exactly what a read of the public ``split`` of the BEIR directory ``root``
    reads, and nothing else: per (sub-)dataset, the digest of ``corpus.jsonl`` (public documents),
    of ``qrels/<split>.tsv`` and of the sorted (id, text) of the queries that qrels file names.
    Plain, not keyed: all of it is public by the declaration (or the benchmark). No other split's
    queries or qrels, no ``users.tsv``: a public-split read does not depend on private data, so its
    record is the same for D and D minus one private query or user. ``None`` when a file is
    missing (the read would fail)."""
    import json

    from synthq.data.beir_io import read_qrels, read_queries
    from synthq.data.sources import dataset_parts
    from synthq.runtime.errors import DataError

    try:
        parts = dataset_parts(Path(root))
    except DataError:
        return None
    entries = []
    for part, part_root in parts:
        corpus, queries = part_root / "corpus.jsonl", part_root / "queries.jsonl"
        qrels = part_root / "qrels" / f"{split}.tsv"
        if not (corpus.is_file() and queries.is_file() and qrels.is_file()):
            return None
        texts = read_queries(queries)
        judged = [(qid, texts[qid]) for qid in sorted(set(read_qrels(qrels))) if qid in texts]
        entries.append(
            {
                "part": part,
                "corpus": file_digest(corpus),
                "qrels": file_digest(qrels),
                "queries": hashlib.sha256(json.dumps(judged, ensure_ascii=False).encode()).hexdigest(),
            }
        )
    return hashlib.sha256(json.dumps({"split": split, "parts": entries}, sort_keys=True).encode()).hexdigest()


def public_split_record(root: Path, name: str, split: str) -> dict | None:
    """Lineage entry for a read of the public ``split`` of the dataset at ``root``
    (:func:`public_split_digest`, which :func:`current_digest` recomputes from the recorded
    ``split``); ``None`` when the split's files are not all there."""
    digest = public_split_digest(root, split)
    if digest is None:
        return None
    return {"path": str(root), "kind": PUBLIC_SPLIT, "name": name, "split": split, "sha256": digest}


def current_digest(record: dict) -> str | None:
    """The digest a non-artifact lineage record would have *now* (``None`` if the input is gone),
    computed the way it was recorded (a judged set, keyed or plain content)."""
    path = Path(record["path"])
    if record.get("kind") == JUDGED_SET:
        from synthq.data.synthetic import judged_documents

        return judged_set_digest(judged_documents(path)) if path.is_file() else None
    if record.get("kind") == PUBLIC_SPLIT:
        return public_split_digest(path, record["split"]) if path.is_dir() else None
    if not path.exists():
        return None
    private = bool(record.get("private")) or is_keyed(record.get("sha256", ""))
    return artifact_digest(path, private)

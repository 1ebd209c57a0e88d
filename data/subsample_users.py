"""Write a copy of a BEIR log whose training split keeps only its first N users.

    .venv/bin/python data/subsample_users.py pylibs --users 100 --out runs/pylibs-u100

The curve of what a private log buys against its size (docs/results.md) trains on logs of 100,
1,000 and all users of ``pylibs``; this writes those logs. Users are taken in the order of a
salted sha256 of their id, so the same N gives the same users and a smaller log is a subset of a
larger one; every query of a kept user stays. Which users make the first N depends on who else is
in the source, so a DP row trained on the subsample is private with respect to the subsample (the
log it was given), not to the source it was cut from. The corpus, the
queries file, ``privacy.json`` and every other split are copied unchanged, so evaluations on dev
and test are the same as on the full log.
"""

from __future__ import annotations

import argparse
import hashlib
import json
import shutil
import sys
from pathlib import Path

SALT = "synthq-subsample"


def user_order(users: set[str]) -> list[str]:
    return sorted(users, key=lambda user: hashlib.sha256(f"{SALT}:{user}".encode()).hexdigest())


def subsample(root: Path, out: Path, users: int, split: str = "train") -> dict:
    """Copy ``root`` to ``out`` with ``split`` cut to the first ``users`` users; the counts kept."""
    owner = {}
    with open(root / "queries.jsonl", encoding="utf-8") as handle:
        for line in handle:
            if line.strip():
                record = json.loads(line)
                owner[record["_id"]] = (record.get("metadata") or {}).get("user_id")
    lines = (root / "qrels" / f"{split}.tsv").read_text(encoding="utf-8").splitlines()
    header, rows = lines[0], [line for line in lines[1:] if line.strip()]
    missing = sorted({row.split("\t")[0] for row in rows if not owner.get(row.split("\t")[0])})
    if missing:
        raise SystemExit(f"{len(missing)} queries of {split} have no metadata.user_id (first: {missing[0]})")
    present = {owner[row.split("\t")[0]] for row in rows}
    if users > len(present):
        raise SystemExit(f"{root} has {len(present)} users in {split}, fewer than {users}")
    kept = set(user_order(present)[:users])
    tmp = out.with_name(out.name + ".partial")
    shutil.rmtree(tmp, ignore_errors=True)
    shutil.copytree(root, tmp)
    kept_rows = [row for row in rows if owner[row.split("\t")[0]] in kept]
    (tmp / "qrels" / f"{split}.tsv").write_text("\n".join([header, *kept_rows]) + "\n", encoding="utf-8")
    (tmp / "README.md").unlink(missing_ok=True)  # the datasheet's counts describe the full log
    shutil.rmtree(out, ignore_errors=True)
    tmp.rename(out)
    return {"source": str(root), "split": split, "users": users, "judgements": len(kept_rows)}


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("source", help="A BEIR directory, or a name synthq ships (pylibs, pydocs).")
    parser.add_argument("--users", type=int, required=True)
    parser.add_argument("--out", type=Path, required=True)
    parser.add_argument("--split", default="train")
    args = parser.parse_args()
    from synthq.data.sources import resolve_source

    print(
        json.dumps(subsample(Path(resolve_source(args.source)), args.out, args.users, args.split)),
        file=sys.stdout,
    )


if __name__ == "__main__":
    main()

"""Give every private training query of ``data/embedded`` a user id (``metadata.user_id``).

Run from the repository root: ``python data/make_embedded_users.py``. Deterministic (seed 2026);
the datasheet (``data/embedded/README.md``) describes the result. The distribution imitates a
query log: most people type one to three queries, a few type dozens, and a heavy user's queries
cluster around the topics they care about.

* Heavy users (20+ queries) take runs of consecutive training queries (the file is ordered by
  passage and topic, so a run is topically related), e.g. a home baker's 20-odd baking queries.
* Medium users (4-12) take a shorter run plus a few queries from anywhere.
* Everyone else (1-3 queries) takes queries at random.
"""

from __future__ import annotations

import json
import random
from pathlib import Path

ROOT = Path(__file__).parent / "embedded"
HEAVY = [45, 38, 31, 27, 24, 22, 21, 20]  # the tail: eight users with 20+ queries
MEDIUM_SIZES = (4, 5, 6, 7, 8, 10, 12)
MEDIUM_USERS = 40
LIGHT_SIZES, LIGHT_WEIGHTS = (1, 2, 3), (0.62, 0.25, 0.13)


def assign(train_ids: list[str], rng: random.Random) -> dict[str, str]:
    free = list(train_ids)  # in file order (passage, then topic)
    users: dict[str, str] = {}
    counter = iter(range(1, 10**6))

    def take_run(size: int) -> list[str]:
        start = rng.randrange(0, len(free) - size)
        run = free[start : start + size]
        del free[start : start + size]
        return run

    for size in HEAVY:
        name = f"u{next(counter):04d}"
        users.update(dict.fromkeys(take_run(size), name))
    for _ in range(MEDIUM_USERS):
        name, size = f"u{next(counter):04d}", rng.choice(MEDIUM_SIZES)
        run = take_run(size - 2)
        scattered = [free.pop(rng.randrange(len(free))) for _ in range(2)]
        users.update(dict.fromkeys(run + scattered, name))
    rng.shuffle(free)
    while free:
        size = min(len(free), rng.choices(LIGHT_SIZES, LIGHT_WEIGHTS)[0])
        name = f"u{next(counter):04d}"
        users.update(dict.fromkeys(free[:size], name))
        del free[:size]
    return users


def main() -> None:
    path = ROOT / "queries.jsonl"
    records = [json.loads(line) for line in path.read_text(encoding="utf-8").splitlines() if line.strip()]
    train_ids = [line.split("\t")[0] for line in (ROOT / "qrels" / "train.tsv").read_text().splitlines()[1:]]
    train_ids = list(dict.fromkeys(train_ids))
    users = assign(train_ids, random.Random(2026))
    with open(path, "w", encoding="utf-8") as handle:
        for record in records:
            record.pop("metadata", None)
            if record["_id"] in users:
                record["metadata"] = {"user_id": users[record["_id"]]}
            handle.write(json.dumps(record, ensure_ascii=False) + "\n")


if __name__ == "__main__":
    main()

"""Build ``data/pylibs-long``: pylibs' recipe with whole docstrings, at the size of the README
guide's log — the shipped corpus of long documents on which the first hour is measured.

    .venv/bin/python data/build_pylibs_long.py            # writes data/pylibs-long
    .venv/bin/python data/build_pylibs_long.py --out DIR

``data/build_pylibs.py`` truncates documents at 128 words, so no shipped corpus had documents as
long as a user's (man pages, product pages, support articles: hundreds of tokens). This set is
the same walk of the same packages with three changes: documents keep up to
:data:`MAX_DOC_WORDS` words (SmolLM2's tokens per document: p95 above 300), the targets are the
guide's size (:data:`TRAIN_TARGET` private training queries, a private dev and a public test
split), and no distractors are kept (so every document is judged and the corpus stays small
enough for the guide's ``generate --num-queries 3`` over all of it). Users are ordered by their
own salt, so this set's splits are not pylibs' splits: do not mix the two.
"""

from __future__ import annotations

import argparse
import json
import os
import sys
from pathlib import Path

HERE = Path(__file__).resolve().parent
sys.path.insert(0, str(HERE))
import build_pydocs as pydocs  # noqa: E402
import build_pylibs as pylibs  # noqa: E402  (the walk, the rules, the split rule, the files)

DEFAULT_OUT = HERE / "pylibs-long"
MAX_DOC_WORDS = 384
DEV_TARGET = 60  # queries
TEST_TARGET = 150
TRAIN_TARGET = 400
SPLIT_SALT = "pylibs-long-2026"


def configure() -> None:
    """pylibs' builder at this set's length, targets and salt (its functions read these names)."""
    pylibs.MAX_DOC_WORDS = MAX_DOC_WORDS
    pylibs.DEV_TARGET, pylibs.TEST_TARGET, pylibs.TRAIN_TARGET = DEV_TARGET, TEST_TARGET, TRAIN_TARGET
    pylibs.SPLIT_SALT = SPLIT_SALT


def counts_block(root: Path) -> str:
    """The datasheet's counts, recomputed from the files (the test compares it to README.md)."""
    block = pydocs.counts_block(root)
    return block.replace(f"truncated at {pydocs.MAX_DOC_WORDS}", f"truncated at {MAX_DOC_WORDS}")


def datasheet(root: Path, info: dict) -> str:
    versions = ", ".join(f"{name} {version}" for name, version in sorted(info["packages"].items()))
    walk = ", ".join(f"{k}: {v:,}" for k, v in sorted(info["walk"].items()))
    return f"""\
# The pylibs-long dataset — datasheet

**Long documents at the size of the README guide's log**: the docstrings of {versions}, as in
[pylibs](../pylibs/README.md) (the query is a docstring's one-line summary, the document the rest
of it, the user the module that defines it), with documents kept up to {MAX_DOC_WORDS} words
instead of 128. Shipped to measure the guide's commands on documents of the length users have
(`benchmarks/first_hour.py --data data/pylibs-long`; docs/performance.md). It is a path in the
repository, not a named source: `synthq data info data/pylibs-long` prints its counts, and
`tests/data/test_pylibs_long.py` checks them and the document lengths.

## Counts

{pylibs.COUNTS_START}
{counts_block(root)}
{pylibs.COUNTS_END}

## How it was built

`python data/build_pylibs_long.py` (Python {info["python"]}): pylibs' walk and rules
(`data/build_pylibs.py`), then users ordered by a sha256 salted `{SPLIT_SALT}` fill `dev` to
{DEV_TARGET:,} queries, `test` to {TEST_TARGET:,} and `train` to {TRAIN_TARGET:,}; the rest are left
out whole. A module keeps at most {pylibs.MAX_PAIRS_PER_USER} pairs; no distractors are kept.
Bodies under {pydocs.MIN_BODY_WORDS} words are dropped, as in pylibs.

Walk statistics: {walk}.

## Licence and limits

As pylibs: each text is its package's, under that package's licence (BSD-style; matplotlib's
PSF-based licence). The queries are summaries written by the document's author, not searches;
every document carries its module as `metadata.user_id`, so the corpus tells which modules are in
which split: fine for timing and memory, not for membership or canary audits. Tied to the package
versions above.
"""


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--out", type=Path, default=DEFAULT_OUT)
    args = parser.parse_args()
    os.environ.setdefault("MPLBACKEND", "Agg")
    configure()
    info = pylibs.build(
        args.out, sheet=datasheet, distractors_kept=False, builder="data/build_pylibs_long.py"
    )
    print(json.dumps(info, indent=2), file=sys.__stdout__)


if __name__ == "__main__":
    main()

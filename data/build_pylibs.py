"""Build ``data/pylibs``: a retrieval log of thousands of authors from the docstrings of the
scientific Python stack (NumPy, SciPy, pandas, scikit-learn, SymPy, NetworkX, matplotlib, PyTorch).

    .venv/bin/python data/build_pylibs.py            # writes data/pylibs (BEIR layout + datasheet)
    .venv/bin/python data/build_pylibs.py --out DIR

pydocs' recipe (``data/build_pydocs.py``: the query is a docstring's one-line summary, the
document the rest of it) on third-party packages, with a finer author unit: the **user** of a
query is the module that *defines* the function, class or method (``scipy.optimize._minimize``,
``sympy.polys.polytools``): one source file, written by a few people in a shared style. That
gives well over a thousand users, where pydocs' standard library gives 44 private ones.

Only the packages of :data:`PACKAGES` are read, at the versions installed in the interpreter
that runs the builder (recorded in ``build.json`` and the datasheet). Each package's public
modules are walked in sorted order (private parts, test suites, benchmarks and ``testing``
pruned before import), every public member whose ``__module__`` belongs to the package is read
once (the first module in walk order that exposes it), and a module keeps at most
:data:`MAX_PAIRS_PER_USER` pairs (the first by name) so that the log is many authors rather
than a few giants. Users ordered by a salted sha256 fill dev, then test, then train; users past
the train target are left out whole (their documents too), to keep the set small enough to
ship and to encode on 2 cores.
"""

from __future__ import annotations

import argparse
import importlib
import importlib.metadata
import inspect
import json
import os
import re
import sys
from collections import Counter
from pathlib import Path

HERE = Path(__file__).resolve().parent
sys.path.insert(0, str(HERE))
import build_pydocs as pydocs  # noqa: E402  (the shared recipe: docstring -> pair, splits, files)

DEFAULT_OUT = HERE / "pylibs"
# import name -> distribution name (for the version recorded in build.json)
PACKAGES = {
    "matplotlib": "matplotlib",
    "networkx": "networkx",
    "numpy": "numpy",
    "pandas": "pandas",
    "scipy": "scipy",
    "sklearn": "scikit-learn",
    "sympy": "sympy",
    "torch": "torch",
}
# pybind11 signatures print default objects with their memory address ("<... object at 0x7f..>"):
# dropped, so that two builds write the same bytes.
ADDRESS = re.compile(r" at 0x[0-9a-fA-F]+")
SKIP_PARTS = {"testing", "conftest", "benchmarks", "tests", "test"}
MAX_DOC_WORDS = 128
MAX_PAIRS_PER_USER = 12
DEV_TARGET = 500  # queries
TEST_TARGET = 1_050
TRAIN_TARGET = 6_000
SPLIT_SALT = "pylibs-2026"
COUNTS_START, COUNTS_END = "<!-- counts: written by data/build_pylibs.py -->", pydocs.COUNTS_END


def skipped(name: str) -> bool:
    parts = name.split(".")
    return any(p.startswith("_") or pydocs.SKIP_PART.match(p) or p in SKIP_PARTS for p in parts)


def walk_package(package: str) -> list[str]:
    """The package's public module names in sorted order, pruned before import."""
    top = pydocs._quiet_import(package)
    if top is None:
        raise SystemExit(f"{package} is not importable in {sys.executable}: install it first")
    return [package, *pydocs.walk_tree(list(top.__path__), package + ".", skipped)]


def owns(package: str, home) -> bool:
    return isinstance(home, str) and (home == package or home.startswith(package + "."))


def members(module, package: str):
    """``(qualified name, defining module, object)`` for the public functions, classes and methods
    that ``module`` exposes and ``package`` defines (re-exports of other packages are skipped)."""
    for name, obj in sorted(vars(module).items()):
        home = getattr(obj, "__module__", None)
        if name.startswith("_") or not owns(package, home):
            continue
        if inspect.isclass(obj):
            yield f"{home}.{obj.__qualname__}", home, obj
            for attr, member in pydocs.public_methods(obj):
                yield f"{home}.{obj.__qualname__}.{attr}", home, member
        elif inspect.isroutine(obj):
            yield f"{home}.{getattr(obj, '__qualname__', name)}", home, obj


def collect() -> tuple[list[dict], dict, dict]:
    pairs, seen_names, seen_objects, stats, modules = [], set(), set(), Counter(), []
    versions = {}
    for package, distribution in sorted(PACKAGES.items()):
        versions[distribution] = importlib.metadata.version(distribution)
        for modname in walk_package(package):
            module = pydocs._quiet_import(modname)
            if module is None:
                stats["modules not importable"] += 1
                continue
            stats["modules read"] += 1
            modules.append(module)  # kept alive: ids of their objects stay unique
            for qualname, home, obj in members(module, package):
                if qualname in seen_names or id(obj) in seen_objects:
                    continue
                seen_names.add(qualname)
                seen_objects.add(id(obj))
                clean = lambda doc: ADDRESS.sub("", doc)  # noqa: E731
                pydocs.add_pair(pairs, stats, qualname, obj, user=home, max_words=MAX_DOC_WORDS, clean=clean)
    pairs.sort(key=lambda p: p["name"])
    return pairs, dict(stats), versions


def cap_per_user(queried: list[dict], distractors: list[dict], stats: dict) -> tuple[list[dict], list[dict]]:
    """At most MAX_PAIRS_PER_USER pairs of each user (the first by name), and at most as many
    distractors of a user as it keeps pairs; the rest leave the set."""
    kept, seen = [], Counter()
    for pair in queried:
        seen[pair["user"]] += 1
        if seen[pair["user"]] <= MAX_PAIRS_PER_USER:
            kept.append(pair)
    stats[f"left out: pairs past {MAX_PAIRS_PER_USER} of a module"] = len(queried) - len(kept)
    quota, spare = Counter(p["user"] for p in kept), []
    for pair in distractors:
        if quota[pair["user"]] > 0:
            quota[pair["user"]] -= 1
            spare.append(pair)
    stats["left out: distractors past a module's pairs"] = len(distractors) - len(spare)
    return kept, spare


def assign_splits(counts: Counter) -> dict[str, str]:
    """pydocs' split rule at this set's targets and salt, then train filled to TRAIN_TARGET in the
    same hash order; users past it are ``"left out"``."""
    splits = pydocs.assign_splits(counts, dev=DEV_TARGET, test=TEST_TARGET, salt=SPLIT_SALT)
    filled = 0
    for user in sorted(counts, key=lambda u: pydocs.user_hash(u, SPLIT_SALT)):
        if splits[user] != "train":
            continue
        if filled >= TRAIN_TARGET:
            splits[user] = "left out"
        else:
            filled += counts[user]
    return splits


def build(
    out: Path, sheet=None, distractors_kept: bool = True, builder: str = "data/build_pylibs.py"
) -> dict:
    """Walk the packages and write the set to ``out``, with ``sheet(out, build_info)`` (default:
    :func:`datasheet`) as its README; ``distractors_kept=False`` keeps judged documents only
    (``data/build_pylibs_long.py`` builds its set through here)."""
    pairs, stats, versions = collect()
    queried, distractors = pydocs.deduplicate(pairs, stats)
    queried, distractors = cap_per_user(queried, distractors, stats)
    if not distractors_kept:
        stats["left out: distractors (none kept)"] = len(distractors)
        distractors = []
    splits = assign_splits(Counter(p["user"] for p in queried))
    stats["left out: users past the train target"] = sum(1 for s in splits.values() if s == "left out")
    included = {user for user, split in splits.items() if split != "left out"}
    queried = [p for p in queried if p["user"] in included]
    distractors = [p for p in distractors if p["user"] in included]
    documents = sorted(queried + distractors, key=lambda p: p["name"])
    note = (
        "train plays the private query log and dev is held out from it (both private); test is "
        "public. Users are the modules that define each object; no user is in two splits."
    )
    pydocs.write_dataset(out, documents, queried, splits, note)
    build_info = {
        "python": sys.version.split()[0],
        "implementation": sys.implementation.name,
        "packages": versions,
        "builder": builder,
        "walk": stats,
    }
    (out / "build.json").write_text(json.dumps(build_info, indent=2) + "\n", encoding="utf-8")
    (out / "README.md").write_text((sheet or datasheet)(out, build_info), encoding="utf-8")
    return build_info


def counts_block(root: Path) -> str:
    """The datasheet's counts, recomputed from the files (the test compares it to README.md)."""
    block = pydocs.counts_block(root)
    return block.replace(f"truncated at {pydocs.MAX_DOC_WORDS}", f"truncated at {MAX_DOC_WORDS}")


def packages_block(root: Path) -> str:
    """Queries per split and package (the first part of a user's module name)."""
    _, queries, qrels = pydocs.read_rows(root)
    users = {q["_id"]: q["metadata"]["user_id"] for q in queries}
    lines = ["| package | train | dev | test | users |", "|---|---|---|---|---|"]
    per = {split: Counter(users[q].split(".")[0] for q, _ in rows) for split, rows in qrels.items()}
    people = Counter(u.split(".")[0] for u in set(users.values()))
    for package in sorted(people):
        lines.append(
            f"| {package} | {per['train'][package]:,} | {per['dev'][package]:,} | "
            f"{per['test'][package]:,} | {people[package]:,} |"
        )
    return "\n".join(lines)


PACKAGES_START, PACKAGES_END = "<!-- packages: written by data/build_pylibs.py -->", "<!-- end packages -->"

# Measured by hand after building (the builder does not run models): update when rebuilding.
MEASURED = """\
## Zero-shot baselines on test, and the room above them

Measured 2026-11-27 on this build, CPU (2 cores shared with other jobs: no timings here; scores are
deterministic), `pipelines/pylibs-curve.yaml`'s `eval-room`: retrievers read 128 document tokens.

| retriever | NDCG@10 | Recall@10 |
|---|---|---|
| BM25 | 0.496 | 0.655 |
| untrained minilm-l6 (all-MiniLM-L6-v2, zero-shot) | 0.564 | 0.747 |
| minilm-l6 trained on the 6,002 private train queries without DP (1 epoch, lr 3e-5) | 0.625 | 0.807 |

Non-private training gains **+0.061** NDCG@10 over the untrained start (paired over the 1,056 test
queries: standard error 0.0085, z = 7.2): there is room for a private log to teach the retriever
something, which is what this set is for. Per-query NDCG@10 has standard deviation 0.41, so a
paired difference of about 0.015 is at the edge of what the split resolves."""


def datasheet(root: Path, info: dict) -> str:
    walk = info["walk"]
    versions = ", ".join(f"{name} {version}" for name, version in sorted(info["packages"].items()))
    return f"""\
# The pylibs dataset — datasheet

A query log of **thousands of authors** built from text that is on every machine with the
scientific Python stack and that no one on this project wrote: **the docstrings of {versions}**.
As in pydocs, the query is a docstring's one-line summary and the document the rest of that
docstring. Shipped so that the question "how much of a private log's value survives DP at the
size real logs have?" can be measured offline: pydocs has 44 private users, this set has more
than a thousand. `synthq data info pylibs` prints its counts; `tests/data/test_pylibs.py`
checks what can be checked (the counts block is recomputed from the files).

## What it is

Files: `corpus.jsonl` (`_id` = the qualified name where it is defined, e.g.
`scipy.optimize._minimize.minimize`; `title` empty; `text`; `metadata.user_id`),
`queries.jsonl` (`_id`, `text`, `metadata.user_id` on every split), `qrels/train.tsv`,
`qrels/dev.tsv`, `qrels/test.tsv` (one relevant document per query, relevance 1),
`privacy.json` (train and dev private, test public), `build.json` (the versions read and the
walk's statistics).

## Counts

{COUNTS_START}
{counts_block(root)}
{COUNTS_END}

{PACKAGES_START}
{packages_block(root)}
{PACKAGES_END}

## Users

The **user** of a query is the module that defines the object (`sympy.polys.polytools`,
`sklearn.preprocessing._data`, `torch.nn.modules.conv`; for objects a package declares under its
public name, such as pandas' `pandas.DataFrame`, that name): one source file, written by a few
people in a shared style — a proxy for the author unit of a query log, finer than pydocs'
top-level packages. Splits are by user, no user in two splits: users ordered by a salted sha256
of their name fill `dev` to {DEV_TARGET:,} queries, then `test` to {TEST_TARGET:,} (a user that
alone would overshoot a target by a tenth is skipped), then `train` to {TRAIN_TARGET:,}; the
users after that are left out whole, documents included, to keep the set small.

## How it was built

`python data/build_pylibs.py` with the project's `.venv` (Python {info["python"]}; the versions
above; {walk.get("modules read", 0):,} modules read). For each package, its public modules are
walked in sorted order, pruning before import every private part (a leading `_`), test suites,
`testing` and `benchmarks`; every public function, class and method with its own docstring whose
`__module__` belongs to the package is read once, under the first module that exposes it. Then
pydocs' rules: a leading signature paragraph dropped; the summary is the first paragraph if it
has at most {pydocs.MAX_QUERY_WORDS} words, else its first sentence, with at least
{pydocs.MIN_QUERY_WORDS} words; bodies under {pydocs.MIN_BODY_WORDS} words, bodies that contain the
summary, and repeated bodies are dropped; a summary shared by several docstrings makes them
distractors. Then this set's own: a module keeps at most {MAX_PAIRS_PER_USER} pairs (the first by
name) and as many distractors; documents are truncated to {MAX_DOC_WORDS} words.

Walk statistics: {", ".join(f"{k}: {v:,}" for k, v in sorted(walk.items()))}.

Titles are left empty, as in pydocs (the qualified name names the user and repeats the
summary's words).

{MEASURED}

## Licence

Each document and query is text of the package it comes from, redistributed under that
package's licence: NumPy, SciPy, pandas, scikit-learn, SymPy, NetworkX and PyTorch under
BSD-style licences, matplotlib under the matplotlib (PSF-based) licence. This set is a derived
selection of that text under the same terms; the builder itself is the project's (Apache-2.0).

## Intended use

The size axis of the private-log question: subsample train's users (100, 1,000, all) and
compare DP routes against non-private training and ε = 0 controls, from a strong public start,
on a public test split of 1,000+ queries, on 2 CPU cores.

## Known biases and limitations

- The queries are not searches: they are summaries written by the author of the document
  ("Return the ...", "Compute the ..."), and the body was written knowing the summary.
- The "user" is a source file, not a person; a file's docstrings share a vocabulary (and the
  module name often appears in them). Most users are light (a few queries), as in a real log.
- NumPy-style docstrings put "Parameters" and "Returns" sections first, so a 128-word document is
  often mostly its parameter list.
- One relevant document per query: another docstring that also answers it (the same method on a
  sibling class) counts as wrong.
- Every document carries its module as `metadata.user_id`, and a judged document's module is its
  query's user: the public corpus tells which modules are in train and dev and how many documents
  each has (pydocs is built the same way). Fine for measuring what DP training buys; do not use
  this set for membership or canary audits, whose secret must not be readable from the corpus.
- Tied to the package versions in `build.json`: other versions give a different set; rebuild
  rather than mix.
"""


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--out", type=Path, default=DEFAULT_OUT)
    args = parser.parse_args()
    os.environ.setdefault("MPLBACKEND", "Agg")
    info = build(args.out)
    print(json.dumps(info, indent=2), file=sys.__stdout__)


if __name__ == "__main__":
    main()

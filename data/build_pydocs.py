"""Build ``data/pydocs``: a retrieval set from the Python standard library's own docstrings.

    .venv/bin/python data/build_pydocs.py            # writes data/pydocs (BEIR layout + datasheet)
    .venv/bin/python data/build_pydocs.py --out DIR

For every public function, class and method of the standard library that has a docstring of
substance, the query is the docstring's one-line summary and the document is the rest of the
docstring (title empty: see the datasheet). The user of a query is the top-level module or
package that defines it (``email.message.Message.get_payload`` -> ``email``): the author unit.
Users are split into train / dev (private) and test (public) by a hash of their name.

Deterministic for a given Python build: modules are walked in sorted order, everything else is
sorted, and the split is a function of user names only. The Python version is recorded in
``build.json`` and in the datasheet. Only the standard library directory, its ``lib-dynload``
and the built-in modules are read, never site-packages. Modules are imported (that is how their
docstrings are read) with warnings silenced and stdout/stderr captured; modules with side
effects on import (windows, prints, easter eggs) and test suites are never imported.
"""

from __future__ import annotations

import argparse
import contextlib
import hashlib
import importlib
import inspect
import io
import json
import pkgutil
import re
import sys
import sysconfig
import warnings
from collections import Counter
from pathlib import Path
from statistics import mean, median

HERE = Path(__file__).resolve().parent
DEFAULT_OUT = HERE / "pydocs"

# Never imported: side effects on import, GUIs, test suites, demos, deprecated tooling.
SKIP_TOP = {
    "antigravity",  # opens a web browser
    "this",  # prints the Zen of Python
    "idlelib",
    "turtledemo",
    "tkinter",
    "turtle",  # tkinter-based
    "lib2to3",  # deprecated; mostly its own test fixtures and grammar
    "test",
    "ensurepip",  # bundles and may run pip
    "readline",  # may write terminal escapes on import in some terminals
    "pydoc_data",  # data, no API
    "xxlimited",
    "xxlimited_35",
    "xxsubtype",
    "__phello__",
    "__hello__",
    "msilib",
    "winreg",
    "winsound",
    "nt",
    "msvcrt",
}
SKIP_PART = re.compile(r"^(test|tests|test_.*|.*_test|__main__|idle_test)$")

MIN_BODY_WORDS = 20
MAX_DOC_WORDS = 200
MIN_QUERY_WORDS = 3
MAX_QUERY_WORDS = 30
DEV_TARGET = 200  # queries
TEST_TARGET = 1_020  # queries; the fill stops at the first user past it, so >= 1,020
MAX_CORPUS = 8_000
SIGNATURE = re.compile(r"^[\w.]+\s*\(.*\)\s*(->.*)?$|^[\w.]+\s*->")
SPLIT_SALT = "pydocs-2026"


# ---------------------------------------------------------------------------- walking the stdlib


def stdlib_dirs() -> list[str]:
    stdlib = Path(sysconfig.get_paths()["stdlib"])
    dirs = [str(stdlib)]
    if (stdlib / "lib-dynload").is_dir():
        dirs.append(str(stdlib / "lib-dynload"))
    return dirs


def skipped(name: str) -> bool:
    parts = name.split(".")
    return parts[0] in SKIP_TOP or any(p.startswith("_") or SKIP_PART.match(p) for p in parts)


def _quiet_import(name: str):
    with (
        warnings.catch_warnings(),
        contextlib.redirect_stdout(io.StringIO()),
        contextlib.redirect_stderr(io.StringIO()),
    ):
        warnings.simplefilter("ignore")
        try:
            return importlib.import_module(name)
        except BaseException:  # ImportError, SystemExit, platform errors: skip the module
            return None


def walk_modules() -> list[str]:
    """Public stdlib module names, sorted. ``pkgutil.walk_packages`` would import every package to
    recurse into it (``test``, ``idlelib`` included), so this is its walk with the excluded
    packages pruned *before* import (:func:`walk_tree`)."""
    names = {n for n in sys.builtin_module_names if not skipped(n)}
    return sorted(names | set(walk_tree(stdlib_dirs(), "", skipped)))


def walk_tree(path: list[str], prefix: str, skip) -> list[str]:
    """Module names below ``path`` in depth-first sorted order, ``pkgutil.iter_modules`` per
    level; a name ``skip`` refuses is pruned before it (or anything below it) is imported."""
    names = []
    for info in sorted(pkgutil.iter_modules(path, prefix), key=lambda i: i.name):
        if skip(info.name):
            continue
        names.append(info.name)
        if info.ispkg:
            sub = getattr(_quiet_import(info.name), "__path__", None)
            if sub:
                names += walk_tree(sorted(sub), info.name + ".", skip)
    return names


def _members(module):
    """``(qualified name, object)`` for the public functions, classes and methods ``module``
    defines itself (re-exports are read where they are defined)."""
    modname = module.__name__
    out = [(modname, module)]  # the module's own docstring
    for name, obj in sorted(vars(module).items()):
        if name.startswith("_") or modname not in public_homes(getattr(obj, "__module__", None)):
            continue
        if inspect.isclass(obj):
            out.append((f"{modname}.{name}", obj))
            out += [(f"{modname}.{name}.{attr}", member) for attr, member in public_methods(obj)]
        elif inspect.isroutine(obj):
            out.append((f"{modname}.{name}", obj))
    return out


def public_methods(cls) -> list[tuple[str, object]]:
    """``(name, function)`` of the methods ``cls`` defines itself, sorted: public ones, and the
    special methods written in Python (``__init__`` & co.); static and class methods unwrapped,
    properties read through their getter."""
    methods = []
    for attr, member in sorted(vars(cls).items()):
        special = attr.startswith("__") and attr.endswith("__") and inspect.isfunction(member)
        if attr.startswith("_") and not special:
            continue
        if isinstance(member, staticmethod | classmethod):
            member = member.__func__
        if isinstance(member, property):
            member = member.fget
        if member is not None and inspect.isroutine(member):
            methods.append((attr, member))
    return methods


def public_homes(defined_in) -> set[str]:
    """The public modules an object defined in module ``defined_in`` is read under: that module,
    or for a private implementation module the public one it implements (``_io`` -> ``io``,
    ``concurrent.futures._base`` -> ``concurrent.futures``)."""
    if not isinstance(defined_in, str):
        return set()
    *parents, last = defined_in.split(".")
    if not last.startswith("_") or last.startswith("__"):
        return {defined_in}
    return {".".join([*parents, last.lstrip("_")]), ".".join(parents)} - {""}


def _own_doc(obj) -> str | None:
    doc = vars(obj).get("__doc__") if inspect.isclass(obj) else getattr(obj, "__doc__", None)
    return doc if isinstance(doc, str) else None


# ---------------------------------------------------------------------------- docstring -> pair


def words(text: str) -> list[str]:
    return text.split()


def normalise(text: str) -> str:
    return " ".join(text.lower().split())


def split_docstring(doc: str) -> tuple[str, str] | None:
    """``(summary, body)``: the summary is the first paragraph when it is one sentence-sized line
    of thought (<= MAX_QUERY_WORDS words), else its first sentence; a leading signature paragraph
    (``dumps(obj, ...) -> str``, as C functions have) is dropped first."""
    paragraphs = [p.strip() for p in re.split(r"\n\s*\n", inspect.cleandoc(doc)) if p.strip()]
    while paragraphs and all(SIGNATURE.match(line.strip()) for line in paragraphs[0].splitlines()):
        paragraphs.pop(0)
    if len(paragraphs) < 1:
        return None
    first = " ".join(paragraphs[0].split())
    rest = paragraphs[1:]
    if len(words(first)) > MAX_QUERY_WORDS:
        match = re.match(r"(.+?[.!?])\s+(?=[A-Z`(])", first)
        if not match:
            return None
        summary, remainder = match.group(1), first[match.end() :]
        rest = [remainder, *rest]
    else:
        summary = first
    body = "\n\n".join(rest).strip()
    return summary.strip(), body


def make_pair(
    qualname: str, doc: str, user: str | None = None, max_words: int = MAX_DOC_WORDS
) -> dict | None:
    """A query-document pair, or a distractor document (``query`` None) when the docstring has a
    substantial body but no usable summary, or None when it is trivial. ``user`` defaults to the
    top-level module of ``qualname``; the document keeps the body's first ``max_words`` words."""
    user = user or qualname.split(".")[0]
    parts = split_docstring(doc)
    if parts is None:
        return None
    summary, body = parts
    if len(words(body)) < MIN_BODY_WORDS:
        return None
    text = " ".join(words(body)[:max_words])
    usable = MIN_QUERY_WORDS <= len(words(summary)) <= MAX_QUERY_WORDS
    if usable and normalise(summary).rstrip(".") in normalise(body):
        usable = False
    return {"name": qualname, "user": user, "query": summary if usable else None, "text": text}


def collect() -> tuple[list[dict], dict]:
    pairs, seen_names, seen_objects, stats = [], set(), set(), Counter()
    modules = []
    for modname in walk_modules():
        module = _quiet_import(modname)
        if module is None:
            stats["modules not importable"] += 1
            continue
        stats["modules read"] += 1
        modules.append(module)  # kept alive: ids of their objects stay unique
        for qualname, obj in _members(module):
            if qualname in seen_names or id(obj) in seen_objects:
                continue
            seen_names.add(qualname)
            seen_objects.add(id(obj))
            add_pair(pairs, stats, qualname, obj)
    pairs.sort(key=lambda p: p["name"])
    return pairs, dict(stats)


def add_pair(
    pairs: list[dict], stats: Counter, qualname: str, obj, user: str | None = None,
    max_words: int = MAX_DOC_WORDS, clean=lambda doc: doc,
) -> None:  # fmt: skip
    """Read ``obj``'s own docstring (``clean``-ed) into ``pairs`` as a pair or a distractor, counting
    what it keeps and drops in ``stats``."""
    doc = _own_doc(obj)
    if not doc:
        return
    stats["docstrings"] += 1
    pair = make_pair(qualname, clean(doc), user=user, max_words=max_words)
    if pair is None:
        stats[f"dropped: body under {MIN_BODY_WORDS} words"] += 1
        return
    if pair["query"] is None:
        stats["distractors: no usable summary"] += 1
    pairs.append(pair)


# ---------------------------------------------------------------------------- dataset


def user_hash(user: str, salt: str = SPLIT_SALT) -> str:
    return hashlib.sha256(f"{salt}:{user}".encode()).hexdigest()


def assign_splits(
    query_counts: dict[str, int], dev: int = DEV_TARGET, test: int = TEST_TARGET, salt: str = SPLIT_SALT
) -> dict[str, str]:
    """user -> split. Users in the order of a salted sha256 of their name fill dev to ``dev``
    queries, then test to ``test``, skipping users so heavy that they alone would overshoot the
    split's target by a tenth; everyone else is train. A function of the names and their counts
    only: stable across runs and machines."""
    order = sorted(query_counts, key=lambda user: user_hash(user, salt))
    assignment, filled = {}, {"dev": 0, "test": 0}
    for split, target in (("dev", dev), ("test", test)):
        for user in order:
            if user in assignment or filled[split] >= target:
                continue
            if filled[split] + query_counts[user] > target * 1.1:
                continue
            assignment[user] = split
            filled[split] += query_counts[user]
    return {u: assignment.get(u, "train") for u in order}


def build(out: Path) -> dict:
    pairs, stats = collect()
    queried, distractors = deduplicate(pairs, stats)
    splits = assign_splits(Counter(p["user"] for p in queried))
    documents = sorted(queried + distractors, key=lambda p: p["name"])[:MAX_CORPUS]
    note = (
        "train plays the private query log and dev is held out from it (both private); "
        "test is public. Users are stdlib top-level modules; no user is in two splits."
    )
    write_dataset(out, documents, queried, splits, note)
    build_info = {
        "python": sys.version.split()[0],
        "implementation": sys.implementation.name,
        "stdlib": sysconfig.get_paths()["stdlib"],
        "builder": "data/build_pydocs.py",
        "walk": stats,
    }
    (out / "build.json").write_text(json.dumps(build_info, indent=2) + "\n", encoding="utf-8")
    (out / "README.md").write_text(datasheet(out, build_info), encoding="utf-8")
    return build_info


def deduplicate(pairs: list[dict], stats: dict) -> tuple[list[dict], list[dict]]:
    """``(queried, distractors)``: the same body twice (aliases, copied docstrings) keeps the
    first by name; a summary that is not unique is an ambiguous query, so its pairs become
    distractor documents. Counts what it drops in ``stats``."""
    by_body, unique = set(), []
    for pair in pairs:
        key = normalise(pair["text"])
        if key in by_body:
            stats["dropped: duplicate body"] = stats.get("dropped: duplicate body", 0) + 1
            continue
        by_body.add(key)
        unique.append(pair)
    summary_counts = Counter(normalise(p["query"]) for p in unique if p["query"])
    queried = [p for p in unique if p["query"] and summary_counts[normalise(p["query"])] == 1]
    distractors = [p for p in unique if p not in queried]
    stats["distractors: summary shared with another docstring"] = sum(
        1 for p in distractors if p["query"] is not None
    )
    return queried, distractors


def write_dataset(
    out: Path, documents: list[dict], queried: list[dict], splits: dict[str, str], note: str
) -> None:
    """The BEIR directory at ``out``: ``documents`` as the corpus, each pair of ``queried`` whose
    document is kept as a query of its user's split (ids ``<split>-<n>`` in name order), one
    relevant document each, and ``privacy.json`` (train and dev private, test public)."""
    kept = {p["name"] for p in documents}

    out.mkdir(parents=True, exist_ok=True)
    (out / "qrels").mkdir(exist_ok=True)
    with open(out / "corpus.jsonl", "w", encoding="utf-8") as handle:
        for p in documents:
            record = {"_id": p["name"], "title": "", "text": p["text"], "metadata": {"user_id": p["user"]}}
            handle.write(json.dumps(record, ensure_ascii=False) + "\n")
    numbers = Counter()
    rows: dict[str, list[tuple[str, str]]] = {"train": [], "dev": [], "test": []}
    with open(out / "queries.jsonl", "w", encoding="utf-8") as handle:
        for split in ("train", "dev", "test"):
            for p in queried:
                if splits[p["user"]] != split or p["name"] not in kept:
                    continue
                numbers[split] += 1
                query_id = f"{split}-{numbers[split]:05d}"
                record = {"_id": query_id, "text": p["query"], "metadata": {"user_id": p["user"]}}
                handle.write(json.dumps(record, ensure_ascii=False) + "\n")
                rows[split].append((query_id, p["name"]))
    for split, judged in rows.items():
        with open(out / "qrels" / f"{split}.tsv", "w", encoding="utf-8") as handle:
            handle.write("query-id\tcorpus-id\tscore\n")
            handle.writelines(f"{q}\t{d}\t1\n" for q, d in judged)
    privacy = {"private_splits": ["train", "dev"], "public_splits": ["test"], "note": note}
    (out / "privacy.json").write_text(json.dumps(privacy, indent=2) + "\n", encoding="utf-8")


# ---------------------------------------------------------------------------- datasheet


def read_rows(root: Path) -> tuple[list[dict], list[dict], dict[str, list[tuple[str, str]]]]:
    """The dataset's files as plain rows (no synthq import: the test calls this too)."""

    def jsonl(path: Path) -> list[dict]:
        return [json.loads(line) for line in path.read_text(encoding="utf-8").splitlines() if line]

    qrels = {}
    for split in ("train", "dev", "test"):
        lines = (root / "qrels" / f"{split}.tsv").read_text(encoding="utf-8").splitlines()[1:]
        qrels[split] = [tuple(line.split("\t")[:2]) for line in lines if line]
    return jsonl(root / "corpus.jsonl"), jsonl(root / "queries.jsonl"), qrels


def percentile(values: list[int], q: float) -> float:
    """numpy's default (linear) percentile, so the datasheet agrees with ``synthq data info``;
    the builder needs nothing outside the standard library."""
    ordered = sorted(values)
    position = (len(ordered) - 1) * q / 100
    low = int(position)
    high = min(low + 1, len(ordered) - 1)
    return ordered[low] + (ordered[high] - ordered[low]) * (position - low)


def counts_block(root: Path) -> str:
    """The datasheet's counts, recomputed from the files (the test compares it to README.md)."""
    corpus, queries, qrels = read_rows(root)
    users = {q["_id"]: q["metadata"]["user_id"] for q in queries}
    texts = {q["_id"]: q["text"] for q in queries}
    judged = {d for rows in qrels.values() for _, d in rows}
    doc_words = [len(d["text"].split()) for d in corpus]
    lines = [
        f"- {len(corpus):,} documents: {len(judged):,} judged for a query, "
        f"{len(corpus) - len(judged):,} distractors (no query); "
        f"{min(doc_words)}–{max(doc_words)} words each (mean {mean(doc_words):.0f}, "
        f"truncated at {MAX_DOC_WORDS}).",
        "",
        "| split | queries | judgements | users | queries per user: min / median / p99 / max "
        "| mean words per query |",
        "|---|---|---|---|---|---|",
    ]
    for split, label in (("train", "train (private)"), ("dev", "dev (private)"), ("test", "test (public)")):
        rows = qrels[split]
        per_user = sorted(Counter(users[q] for q in {q for q, _ in rows}).values())
        query_words = mean([len(texts[q].split()) for q, _ in rows])
        lines.append(
            f"| {label} | {len({q for q, _ in rows}):,} | {len(rows):,} | {len(per_user)} | "
            f"{per_user[0]} / {median(per_user):g} / {percentile(per_user, 99):.1f} / "
            f"{per_user[-1]} | {query_words:.1f} |"
        )
    return "\n".join(lines)


def users_block(root: Path) -> str:
    """Which top-level modules are in which split, heaviest first."""
    _, queries, qrels = read_rows(root)
    users = {q["_id"]: q["metadata"]["user_id"] for q in queries}
    lines = []
    for split in ("train", "dev", "test"):
        per_user = Counter(users[q] for q, _ in qrels[split])
        listed = ", ".join(f"{u} {n}" for u, n in sorted(per_user.items(), key=lambda kv: (-kv[1], kv[0])))
        lines.append(f"- **{split}**: {listed}.")
    return "\n".join(lines)


COUNTS_START, COUNTS_END = "<!-- counts: written by data/build_pydocs.py -->", "<!-- end counts -->"
USERS_START, USERS_END = "<!-- users: written by data/build_pydocs.py -->", "<!-- end users -->"

# Measured by hand after building (the builder does not run models): update when rebuilding.
MEASURED = """\
Measured 2026-11-26 on this build (Python 3.11.7), CPU, on a machine whose 2 cores were shared
with other jobs (timings are not comparable; scores are deterministic):
`synthq eval --datasets pydocs --untrained minilm-l6` (encoding the 1,839 documents took ~2 min).

| retriever | NDCG@10 | Recall@10 |
|---|---|---|
| BM25 | 0.446 | 0.622 |
| untrained minilm-l6 (all-MiniLM-L6-v2, zero-shot) | 0.506 | 0.711 |

Zero-shot MiniLM is far from 1: there is room to improve. Over the 1,029 test queries the
per-query NDCG@10 has standard deviation 0.40 (standard error of a score 0.012); the paired
difference MiniLM − BM25 is 0.060 with standard error 0.012. Two versions of the same encoder
(fine-tuned vs zero-shot) agree more per query than these two unrelated systems, so their paired
standard error is smaller: a difference of 0.02 is at the edge of what this split resolves
with a paired test, not comfortably inside it; use synthq's paired tests, never unpaired CIs."""


def datasheet(root: Path, info: dict) -> str:
    walk = info["walk"]
    return f"""\
# The pydocs dataset — datasheet

A retrieval set built from text that is on every machine and that no one on this project wrote:
**the docstrings of the Python {info["python"]} standard library**. The query is a docstring's
one-line summary, the document is the rest of that docstring. Shipped so that a retriever's
score can be compared with a strong public start on more than a thousand public test queries
with no network. `synthq data info pydocs` prints its counts; `tests/data/test_pydocs.py` checks
everything below that can be checked (the counts block is recomputed from the files).

## What it is

Files: `corpus.jsonl` (`_id` = the qualified name, e.g. `json.dumps`; `title` empty; `text`;
`metadata.user_id`), `queries.jsonl` (`_id`, `text`, `metadata.user_id` on every split),
`qrels/train.tsv`, `qrels/dev.tsv`, `qrels/test.tsv` (one relevant document per query, relevance
1), `privacy.json` (train and dev private, test public), `build.json` (the Python version and
the walk's statistics).

Example: the query `Serialize ``obj`` to a JSON formatted ``str``.` (from `json.dumps`) has as
its relevant document the rest of that docstring ("If ``skipkeys`` is true then ``dict`` keys
that are not basic types ... will be skipped instead of raising a ``TypeError`` ...").

## Counts

{COUNTS_START}
{counts_block(root)}
{COUNTS_END}

## Users

The **user** of a query is the top-level module or package that defines the function, class or
method (everything under `email.*` is one user, `collections` another, `os.path` functions are
`posixpath`'s): a proxy for the author unit of a query log — a package is written by a small
group of people in a shared style, and some write much more than others, so there are heavy and
light users as in a real log. It is a proxy: docstrings were not typed as searches, and a
package's docstrings were written by many contributors over decades. Every query (all splits)
carries `metadata.user_id`.

Splits are by user, no user in two splits: users ordered by a salted sha256 of their name fill
`dev` to {DEV_TARGET:,} queries, then `test` to {TEST_TARGET:,} (a user that alone would overshoot a
target by a tenth is skipped), and all other users are `train`. So the three splits cover
different parts of the library, as a new user's queries would.

{USERS_START}
{users_block(root)}
{USERS_END}

## How it was built

`python data/build_pydocs.py` (deterministic for a given Python build; this copy: Python
{info["python"]} ({info["implementation"]}), {walk.get("modules read", 0)} modules read). It walks the
standard library directory, its `lib-dynload` and the built-in modules in sorted order — never
site-packages — pruning before import: test suites (`test`, `*.test(s)`, `test_*`), `idlelib`,
`tkinter`, `turtle`, `turtledemo`, `lib2to3`, `ensurepip`, `antigravity`, `this`, `readline`,
`__main__` modules, the `xx*` examples, and every private module (a part starting with `_`).
Each remaining module is imported with warnings silenced and output captured. For the module
itself and each public function, class and method with its own docstring — no leading underscore
except Python-written special methods (`__init__`, `__getitem__`); read in the module that
defines it, or for a private implementation module in the public module it implements (`_io` ->
`io`, `concurrent.futures._base` -> `concurrent.futures`), so every object counts once:

1. A leading signature paragraph (`sqrt(x) -> float`, as C functions have) is dropped.
2. The summary is the first paragraph if it has at most {MAX_QUERY_WORDS} words, else its first
   sentence; it must have at least {MIN_QUERY_WORDS} words. The body is everything after it.
3. Dropped: bodies under {MIN_BODY_WORDS} words; bodies that contain the summary verbatim;
   a body seen before (aliases, copied docstrings: the first qualified name in sorted order is
   kept).
4. A summary shared by several docstrings ("Return a copy of the list.") would be an ambiguous
   query: those docstrings stay in the corpus as distractors with no query.
5. Documents are truncated to {MAX_DOC_WORDS} words; whitespace is collapsed.

Walk statistics: {", ".join(f"{k}: {v:,}" for k, v in sorted(walk.items()))}.

**Titles are left empty.** The qualified name (`json.dumps`) is a natural title, but the
summaries often repeat words of the name ("Return the ... of the *Path*", "*dumps* ...") and the
name identifies the module, i.e. the user: with titles much of the task becomes name matching.
The `_id` keeps the name for people. Measured when deciding (bm25s, this build, test split):
BM25 NDCG@10 0.446 with empty titles, 0.525 with the qualified name as title (dots and
underscores as spaces) — the name alone is worth 0.08, so it is left out.

## Zero-shot baselines on test

{MEASURED}

## Licence

The docstrings are part of CPython and are distributed under the **PSF License Agreement**
(Python Software Foundation License Version 2, with the CPython licence stack; copyright the
Python Software Foundation). This dataset is a derived selection of that text, redistributed
under the same terms; the builder itself is the project's (Apache-2.0, as synthq).

## Intended use

Comparing retrievers — above all a private-data method against a strong public start — on a
public test split of 1,000+ queries (one relevant document each), built to resolve NDCG@10
differences of about 0.02 with a paired test (see the baselines above for how close it comes),
on 2 CPU cores. train plays a private query log with users (for
`--privacy-unit user`); dev is held out from it for selection; test is public.

## Known biases and limitations

- The queries are not searches: they are summaries written by the author of the document
  ("Return the ...", "Create a new ..."), imperative and technical, and the body was written
  knowing the summary. Real users' queries are shorter and vaguer.
- **The private train split is smaller than planned.** The aim was 1,500–3,000 train queries
  beside a public test of 1,000+; the whole Python 3.11 standard library yields only about
  1,700 usable pairs (of ~6,600 public docstrings, ~4,600 have a body under {MIN_BODY_WORDS} words,
  most of them a summary line alone), so once test has 1,000+ queries and dev 200, train keeps
  the rest (see Counts). Enough to check that training on it moves a retriever; too few for
  DP training at small ε to show much. The body threshold is {MIN_BODY_WORDS} words, not 30, for
  the same reason.
- The "user" is a module, not a person; heavy users are the big packages (`email`, `asyncio`,
  `multiprocessing`, `xml`, ...), and a user's queries share a vocabulary.
- One relevant document per query: another docstring that also answers it (overloads, the same
  method on sibling classes) counts as wrong.
- English only; code identifiers, reStructuredText markup (``` `` ```, `:func:`) and doctest
  fragments are kept as written.
- Tied to the Python build: another 3.11.x patch release or 3.12 gives a slightly different
  set (the version is recorded in `build.json`); rebuild rather than mix. Debian's
  `/usr/bin/python3` (3.11.2) reads two more modules and yields a few different pairs: this copy
  was built with the project's `.venv` (3.11.7).
- C modules and platform-specific modules depend on how the interpreter was built (this copy:
  Linux, x86-64).
"""


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--out", type=Path, default=DEFAULT_OUT)
    args = parser.parse_args()
    info = build(args.out)
    print(json.dumps(info, indent=2), file=sys.__stdout__)


if __name__ == "__main__":
    main()

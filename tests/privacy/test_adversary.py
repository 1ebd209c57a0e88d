"""The adversary inside the test suite: every stage run on a private dataset, at the
query and at the user unit, then attacked the way a reviewer does.

(a) every released byte (manifests, payloads, tables, runs, cards, plots, exported copies, the
    search bundle, the printed ledger and privacy statement — everything but ``diagnostics/``) is
    scanned for a plain digest of a private file, of the private directory or of a diagnostics
    file; for a private query's text or id or a private user id; for un-noised statistics
    (per-user counts, the p99 of queries per user, the dev scores behind a noisy selection);
(b) the same pipeline on the dataset minus one unit (a training query; a user), with the same
    secret seeds: every released file that differs belongs to an artifact whose ledger holds a
    release that read the removed unit (its keyed unit set holds it: a release of the same dataset
    that never read the unit explains nothing), and a public-split eval of BM25 and a public
    encoder is identical; no released file holds a time of day, a DP stage's timings stay private
    and an exported copy carries one fixed file time;
(c) the dataset directory edited the ways the issue lists: nothing turns public.

A new stage joins :func:`tests.privacy.adversary_fixture.run_world` to land (see
``test_every_stage_is_attacked``). Failure messages name the leaking file and what leaked.

Judgements written down: a private query's id or text is a leak in any released file, an ε = ∞
artifact's included (its per-query results belong in ``diagnostics/``); the plain sha256 of a
release's unit set (``diagnostics/units.bin``) is not, since that file holds HMACs under the
owner's key; a keyed digest that differs between D and D minus one unit counts as a difference
(a public-split eval must not depend on the private queries at all). About 6 minutes on one busy
core: two worlds (query, user), each run twice.
"""

from __future__ import annotations

import contextlib
import json
import math
import re
import shutil
from pathlib import Path

import pytest

from synthq.config.registry import STAGES
from synthq.privacy.ledger import ledger
from tests.privacy import adversary_fixture as af

pytestmark = pytest.mark.slow

UNITS = ["query", "user"]
TEXT_SUFFIXES = {".json", ".jsonl", ".md", ".txt", ".tsv", ".trec", ".csv", ".yaml"}


@pytest.fixture(scope="module", params=UNITS)
def worlds(request, tmp_path_factory, tiny_causal_dir, tiny_encoder_dir):
    """The pipeline on D and on D minus one unit with the same secret seeds, each run at the same
    paths (then moved apart), so their manifests differ by content only."""
    unit = request.param
    base = tmp_path_factory.mktemp(f"adversary-{unit}")
    work = base / "world"
    data = af.private_dataset(work / "data", unit)
    full = af.run_world(work / "run", data, unit, tiny_causal_dir, tiny_encoder_dir)
    full = af.relocate(full, work, base / "full")
    _, removed = af.without_one_unit(full.data, work / "data", unit)
    neighbour = af.run_world(work / "run", work / "data", unit, tiny_causal_dir, tiny_encoder_dir)
    neighbour = af.relocate(neighbour, work, base / "minus-one")
    return full, neighbour, removed


def test_every_stage_is_attacked(worlds):
    full, _, _ = worlds
    from synthq.artifacts.manifest import open_artifact

    stages = {open_artifact(path).stage for path in full.artifacts.values()}
    missing = set(STAGES) - stages
    assert not missing, f"stages the adversary test does not run (add them to run_world): {sorted(missing)}"


# (a) every released byte --------------------------------------------------------------------------


def _find(haystack: bytes, needle: str) -> bool:
    return needle.encode() in haystack or json.dumps(needle).strip('"').encode() in haystack


def test_no_released_byte_holds_a_private_digest_text_id_or_statistic(worlds):
    full, _, _ = worlds
    from synthq.artifacts.manifest import open_artifact

    released = af.released_files(full)
    assert len(released) > 100 and any("search bundle" in label for label in released)
    secrets: dict[str, str] = dict(af.private_digests(full))
    for query_id, text in af.private_queries(full.data).items():
        secrets[text] = f"the text of private query {query_id}"
        secrets[query_id] = "the id of a private query"
    if full.unit == "user":
        for user in af.train_query_users(full.data).values():
            secrets[user] = "the id of a private user"
    leaks = []
    infinite = {
        name for name, root in full.artifacts.items() if math.isinf(open_artifact(root).privacy.epsilon)
    }
    for label, path in released.items():
        content = path.read_bytes()
        owner = label.split(":")[0].removeprefix("export ")
        note = (
            " (an ε = ∞ artifact, but private data never goes outside diagnostics/)"
            if owner in infinite
            else ""
        )
        for needle, what in secrets.items():
            if _find(content, needle):
                leaks.append(f"{label} holds {what} ({needle!r}){note}")
    # un-noised statistics of the users: the p99 of queries per user beside its name, the data
    # summary's per-user distribution, the count of queries the bound K dropped
    if full.unit == "user":
        stats = af.user_statistics(full.data)
        p99 = stats["p99 (linear)"]
        patterns = [rf"p99\D{{0,12}}{re.escape(form)}" for form in af.number_forms(p99)]
        patterns.append(r'"queries_per_user"\s*:\s*\{')  # the data summary's per-user distribution
        patterns.append(r"pairs_dropped_by_user_bound")  # how many queries the heavy users lost
        planted = json.dumps({"users": {"p99": p99}, "queries_per_user": {"max": 5}})
        assert any(re.search(p, planted) for p in patterns[:-2]) and re.search(patterns[-2], planted)
        for label, path in released.items():
            text = path.read_bytes().decode(errors="ignore")
            for pattern in patterns:
                if re.search(pattern, text):
                    leaks.append(f"{label} holds an un-noised per-user statistic (matches {pattern!r})")
    # the un-noised dev scores behind the noisy selection (the private dev eval's means), in the
    # noisy selection and the report that publishes it (ε finite): text files, apart from values
    # the artifact computes on the public test split anyway (a coincidence is not a leak)
    dev_rows = json.loads((full.artifacts["ev-dev"] / "results.json").read_text())
    dev_scores = {
        form
        for row in dev_rows
        for value in (row.get("metrics") or {}).values()
        if af.finite(value) and 0 < float(value) < 1
        for form in af.number_forms(float(value))
    }
    assert dev_scores, "the private dev eval scored nothing: the check is vacuous"
    value = next(
        float(v) for row in dev_rows for v in row["metrics"].values() if af.finite(v) and 0 < float(v) < 1
    )
    planted = f"| dev ndcg@10 | {value:.4f} |"  # as a selection table would print it: the check can fire
    assert any(re.search(_number(form), planted) for form in dev_scores)
    assert math.isfinite(open_artifact(full.artifacts["ev-select"]).privacy.epsilon)
    for name in ("ev-select", "rep"):  # (the report's headline is ∞: it holds the similarity stage)
        candidates = dev_scores - _public_numbers(full.artifacts[name])
        for label, path in af.released_files(_only(full, name)).items():
            if path.suffix not in TEXT_SUFFIXES:
                continue
            text = path.read_text(errors="ignore")
            for form in sorted(candidates):
                if re.search(_number(form), text):
                    leaks.append(f"{label} holds the un-noised dev score {form} of the private dev split, "
                                 "behind a noisy selection")  # fmt: skip
    assert not leaks, "the adversary reads private data in released files:\n" + "\n".join(sorted(set(leaks)))


def _number(form: str) -> str:
    """A number written exactly so, not as part of a longer one."""
    return rf"(?<![\d.]){re.escape(form)}(?!\d)"


def _only(world: af.World, name: str) -> af.World:
    """The world restricted to one artifact and its exported copy."""
    view = af.World(world.root, world.data, world.unit)
    view.artifacts = {name: world.artifacts[name]}
    view.released = {k: v for k, v in world.released.items() if k == f"export {name}"}
    return view


def _public_numbers(root) -> set[str]:
    """Numbers an artifact legitimately prints: its public-split metrics and per-query scores (a
    coincidence of one with a dev score is not a leak of it)."""
    values: set[str] = set()

    def collect(value):
        if isinstance(value, dict):
            for inner in value.values():
                collect(inner)
        elif isinstance(value, list):
            for inner in value:
                collect(inner)
        elif isinstance(value, int | float) and not isinstance(value, bool) and math.isfinite(value):
            values.update(af.number_forms(float(value)))

    if (root / "results.json").is_file():
        collect([row.get("metrics") for row in json.loads((root / "results.json").read_text())])
    if (root / "per_query.json").is_file():
        collect(json.loads((root / "per_query.json").read_text()))
    return values


DP_TRAINING = ("finetune-lm", "train-retriever", "evolve")


def test_no_released_file_or_file_time_measures_private_work(worlds):
    """A DP stage's wall time grows with the pairs it sampled, an un-noised count. No released
    file holds a time of day (in a pipeline, two manifests' stamps give the stage between them by
    difference), a DP training stage's timings stay in diagnostics/, and every file and folder of
    an exported copy carries the one fixed release time (a copy with the run's file times would
    publish them)."""
    from synthq.artifacts.export import RELEASE_FILE_TIME

    full, _, _ = worlds
    time_of_day = re.compile(rb"\d{4}-\d{2}-\d{2}[T ]\d{2}:\d{2}")
    for label, path in af.released_files(full).items():
        if path.suffix in TEXT_SUFFIXES:
            found = time_of_day.search(path.read_bytes())
            assert found is None, f"{label}: a time of day {found.group().decode()!r}"
    dp_stages = 0
    for name, root in full.artifacts.items():
        manifest = json.loads((root / "manifest.json").read_text())
        own = manifest.get("own_privacy") or {}
        if manifest["stage"] in DP_TRAINING and math.isfinite(float(own.get("epsilon", math.inf))):
            dp_stages += 1
            assert not manifest.get("timings"), f"{name}: a DP stage's wall time in its manifest"
    assert dp_stages >= 3
    exports = [root for label, root in full.released.items() if label.startswith("export ")]
    assert exports
    for root in exports:
        for path in [root, *root.rglob("*")]:
            assert path.stat().st_mtime == RELEASE_FILE_TIME, f"{path}: the run's file time, exported"


def test_every_artifact_carries_the_releases_of_what_it_read(worlds):
    """A released file is a function of every artifact its stage read (every candidate of a
    selection, every eval of a report): their releases are its releases, except the un-noised dev
    read a noisy selection replaces by its report-noisy-max release."""
    from synthq.artifacts.manifest import open_artifact

    full, _, _ = worlds
    opened = {name: open_artifact(path) for name, path in full.artifacts.items()}
    missing = []
    for name, artifact in opened.items():
        own = {r["id"] for r in artifact.releases}
        noisy = any(r["guarantee"]["mechanism"] == "report-noisy-max" for r in artifact.releases)
        for record in artifact.inputs:
            source = opened.get(Path(record["path"]).name) if record.get("kind") == "artifact" else None
            if source is None:
                continue
            for release in source.releases:
                replaced = (
                    noisy
                    and source.stage == "eval"
                    and not math.isfinite(float(release["guarantee"]["epsilon"]))
                )
                if release["id"] not in own and not replaced:
                    missing.append(f"{name} read {source.path.name} but not its release {release['stage']} "
                                   f"{Path(release['path']).name} ({release['guarantee']['mechanism']}, "
                                   f"ε = {float(release['guarantee']['epsilon']):.2f})")  # fmt: skip
    assert not missing, "releases dropped on the way:\n" + "\n".join(missing)


# (b) D and D minus one unit ---------------------------------------------------------------------


def test_what_differs_without_one_unit_is_a_release_the_ledger_names(worlds):
    full, neighbour, removed = worlds
    assert set(full.artifacts) == set(neighbour.artifacts)
    normalise = _Normaliser(full, neighbour)
    owners = _owners(full)
    named: dict[str, bool] = {}

    def accounted(name: str) -> bool:
        if name not in named:
            named[name] = _a_release_read_the_removed_unit(owners.get(name), full.unit, removed)
        return named[name]

    unaccounted, differing = [], []
    for label, path in af.released_files(full).items():
        other = neighbour.root / path.relative_to(full.root)
        name = label.split(":")[0]
        if other.is_file() and normalise(path, full) == normalise(other, neighbour):
            continue
        differing.append(label)
        if not accounted(name):
            what = "is missing" if not other.is_file() else "differs"
            unaccounted.append(f"{label} {what} without {removed}, and no release in the ledger of {name} "
                               "read that unit")  # fmt: skip
    extra = set(af.released_files(neighbour)) - set(af.released_files(full))
    unaccounted += [f"{label} exists only without {removed}, and no release in the ledger of "
                    f"{label.split(':')[0]} read that unit" for label in sorted(extra)
                    if not accounted(label.split(":")[0])]  # fmt: skip
    assert differing, "the DP artifacts must differ without a unit: the comparison is vacuous"
    assert any(label.startswith("gen:") for label in differing)
    assert not unaccounted, "released files that depend on a unit without a recorded release:\n" + "\n".join(
        unaccounted
    )
    # a public-split eval of BM25 and a public encoder is identical, whatever the private data
    public = [label for label in differing if label.split(":")[0] in ("ev-public", "export ev-public")]
    assert not public, (
        f"an eval of public models on the public test split depends on a private unit: {public}"
    )


def _owners(world: af.World) -> dict:
    """Label prefix -> the artifacts whose ledger accounts for it (an export is its source's
    re-sealed copy; the search bundle is its retriever's; the printed ledger is all of them)."""
    owners = {name: [path] for name, path in world.artifacts.items()}
    owners.update({name: [path] for name, path in world.released.items() if name.startswith("export ")})
    owners["search bundle of ret-dp-a"] = [world.artifacts["ret-dp-a"]]
    owners["ledger"] = list(world.artifacts.values())
    return owners


def _a_release_read_the_removed_unit(artifacts, unit: str, removed: list[str]) -> bool:
    """Whether a release behind ``artifacts`` read the removed unit: its keyed unit set holds the
    removed user (a user-level release) or one of the removed queries (a query-level one). A
    release of the same dataset that never read that unit (a read of the dev split, say) does not
    explain a difference; nor does a release whose unit set cannot be read."""
    from synthq.privacy.keys import unit_digests
    from synthq.privacy.units import load_unit_set

    if not artifacts:
        return False

    def digests(data: bytes) -> set[bytes]:
        return {data[i : i + 8] for i in range(0, len(data), 8)}

    targets = {"query": digests(unit_digests("query", removed))}
    if unit == "user":
        targets["user"] = digests(unit_digests("user", [af.REMOVED_USER]))
    for release in ledger(artifacts).releases:
        units = release.get("units") or {}
        data = load_unit_set(units, release.get("path"))
        if data is not None and digests(data) & targets.get(units.get("kind"), set()):
            return True
    return False


class _Normaliser:
    """A released file's content with what legitimately varies between two runs replaced (both
    runs wrote to the same paths): timings and creation times, seals, random release ids, and the
    manifest hashes of the run's artifacts (which carry those), named by artifact instead."""

    # "fingerprint" hashes the config and the inputs' identifiers, both compared in the clear
    # no creation stamp: a released time of day is a difference (and a leak) of its own
    VOLATILE = {"fingerprint", "timings", "timing", "seconds", "seal", "wall_seconds", "elapsed",
                "duration"}  # fmt: skip

    def __init__(self, *worlds: af.World):
        from synthq.artifacts.hashing import sha256_file

        self.names: dict[str, dict[str, str]] = {}
        for world in worlds:
            names = {}
            for name, root in [*world.artifacts.items(), *world.released.items()]:
                if (root / "manifest.json").is_file():
                    names[sha256_file(root / "manifest.json")] = f"<manifest {name}>"
            self.names[str(world.root)] = names

    def __call__(self, path, world: af.World) -> bytes:
        content = path.read_bytes()
        try:
            text = content.decode()
        except UnicodeDecodeError:
            return content
        if path.suffix == ".json":
            with contextlib.suppress(json.JSONDecodeError):
                text = json.dumps(self._strip(json.loads(text)), sort_keys=True)
        for digest, name in self.names[str(world.root)].items():
            text = text.replace(digest, name)
        ids = re.findall(r'"id": "([0-9a-f-]{8,})"', text)
        for index, release_id in enumerate(dict.fromkeys(ids)):
            text = text.replace(release_id, f"<release {index}>")
        return re.sub(r"\d+(\.\d+)? ?(s|ms|seconds|min)\b", "<time>", text).encode()

    def _strip(self, value):
        if isinstance(value, dict):
            return {k: self._strip(v) for k, v in value.items() if k not in self.VOLATILE}
        if isinstance(value, list):
            return [self._strip(v) for v in value]
        return value


# (c) edits of the dataset directory -----------------------------------------------------------


def _users_tsv(root):
    train = [q for q in af.private_queries(root) if q.startswith("tr-")]
    (root / "users.tsv").write_text(
        "query-id\tuser-id\n" + "".join(f"{q}\tperson-{i % 3}\n" for i, q in enumerate(train))
    )


def _dev_alone(root):
    for split in ("train", "test"):
        (root / "qrels" / f"{split}.tsv").unlink()


def _typo(root):
    corpus = root / "corpus.jsonl"
    corpus.write_text(corpus.read_text().replace("Boil eggs", "Boil the eggs"))


# edit of the directory -> (the edit, the split evaluated, on a colleague's installation)
EDITS = {
    "privacy.json declaring only test public": (
        lambda root: (root / "privacy.json").write_text(json.dumps({"public_splits": ["test"]})),
        "train",
        False,
    ),
    "a users.tsv": (_users_tsv, "train", False),
    "a typo fixed in the corpus": (_typo, "train", False),
    "a fresh copy in another directory": (lambda root: None, "train", False),
    "a colleague's installation (another key, no registry)": (lambda root: None, "train", True),
    "the dev split kept in its own directory": (_dev_alone, "dev", False),
}


@pytest.fixture(scope="module")
def trained_on_undeclared(tmp_path_factory, tiny_encoder_dir):
    """A DP retriever trained on a dataset with no privacy.json: every split of it is private
    (fail closed)."""
    from synthq.config.retriever import TrainRetrieverConfig
    from synthq.stages import train_retriever

    base = tmp_path_factory.mktemp("adversary-edits")
    data = af.private_dataset(base / "data", "query", declared=False)
    retriever = train_retriever.run(TrainRetrieverConfig(
        data=str(data), encoder=str(tiny_encoder_dir), out=base / "ret-dp", dp="group", group_size=3,
        epsilon=4.0, batch_size=3, max_steps=1, max_query_length=16, max_doc_length=32, seed=17,
        device="cpu"))  # fmt: skip
    assert math.isfinite(retriever.privacy.epsilon)
    return base, data, retriever


@pytest.mark.parametrize("edit", list(EDITS))
def test_no_edit_of_the_dataset_turns_its_private_queries_public(trained_on_undeclared, edit, monkeypatch):
    from synthq.artifacts.hashing import sha256_file, sha256_tree
    from synthq.config.evaluation import EvalConfig
    from synthq.stages import evaluate

    base, data, retriever = trained_on_undeclared
    change, split, elsewhere = EDITS[edit]
    edited = base / f"edited-{re.sub(r'[^a-z]+', '-', edit)}" / "data"
    shutil.copytree(data, edited)
    change(edited)
    if elsewhere:
        monkeypatch.setenv("SYNTHQ_STATE", str(edited.parent / "colleague-state"))
    result = evaluate.run(EvalConfig(out=edited.parent / "ev", datasets=[str(edited)], split=split,
                                     retrievers=[str(retriever.path)], device="cpu"))  # fmt: skip
    rows = json.loads((result.path / "results.json").read_text())
    shown = {row.get("retriever"): row.get("epsilon") for row in rows}
    assert math.isinf(result.privacy.epsilon), (
        f"after {edit}, eval --split {split} of the DP retriever prints ε = {result.privacy.epsilon} "
        f"on private queries (rows: {shown})"
    )
    assert all(math.isinf(float(row["epsilon"])) for row in rows), f"after {edit}: rows {shown}"
    view = af.World(edited.parent, edited, "query", artifacts={"ev-train": result.path})
    leaks = []
    plain = {sha256_tree(edited): "plain sha256_tree of the edited private dataset"}
    for relative in af.PRIVATE_FILES:
        if (edited / relative).is_file():
            plain[sha256_file(edited / relative)] = f"plain sha256 of private {relative}"
    for label, path in af.released_files(view).items():
        content = path.read_bytes()
        leaks += [f"{label} holds the {what}" for digest, what in plain.items() if _find(content, digest)]
    assert not leaks, f"after {edit}:\n" + "\n".join(leaks)

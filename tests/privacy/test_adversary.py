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
    and an exported copy carries one fixed file time. Three more worlds run only the stages they
    need (tiny models, a few seconds a stage):
    - minus one private *dev* query, read by tuning (two direct-DP retrievers, their dev eval,
      report-noisy-max on it): a released file that differs belongs to an artifact whose ledger
      holds a *finite* release whose unit set holds that query (the noisy selection's; an ε = ∞
      artifact, the dev eval, is held to a release that read it); the selection's utility falls by
      between 0 and its recorded sensitivity (1) without that query and without any other dev
      query, and the choice's exact privacy loss stays within its ε; the ledger and the statement
      print at least the ε the selection spends;
    - the same in CQADupStack's layout (a directory of sub-datasets with 2 and 24 dev queries,
      minus one of the small one's), where the mean of sub-dataset means would move by more than
      1; the selection tuned on the whole and on the small part alone;
    - a user-level log and its re-export minus one query with every pseudonym re-issued: the
      ledger and the statement over both worlds' user-level releases compose them as the same
      people (their ε adds up), though no unit set and no dataset identity can tell;
(c) the dataset directory edited the ways the issue lists: nothing turns public.

A new stage joins :func:`tests.privacy.adversary_fixture.run_world` to land (see
``test_every_stage_is_attacked``). Failure messages name the leaking file and what leaked.

Judgements written down: a private query's id or text is a leak in any released file, an ε = ∞
artifact's included (its per-query results belong in ``diagnostics/``); the plain sha256 of a
release's unit set (``diagnostics/units.bin``) is not, since that file holds HMACs under the
owner's key; a keyed digest that differs between D and D minus one unit counts as a difference
(a public-split eval must not depend on the private queries at all). One decision, stated in
the threat model: a retriever trained on the train split records the keyed digest and identity of
the whole directory, so those two identifiers change with a dev query no release of it read; the
dev worlds compare them by name. Both are HMACs under the owner's key: without it they are
indistinguishable from random in either world, and they name the dataset version on purpose (the
ledger groups by it, freshness checks compare it). A second
finding is mended: a sub-dataset's query was one unit ("part/id") when the whole was read and
another ("id") when the part was read alone, so two releases that read it did not compose; eval
now records each query as its own directory names it. About 6 minutes on one busy core
for the two pipeline worlds (query, user), each run twice; under 40 s for each dev world (run
twice) and 25 s for the pseudonyms.
"""

from __future__ import annotations

import contextlib
import json
import math
import re
import shutil
from pathlib import Path

import pytest

from synthq.bookkeeping.releases import ledger
from synthq.config.registry import STAGES
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


def test_a_synthetic_set_declared_public_opens_no_public_pairs(worlds, tmp_path, tiny_causal_dir):
    """Review round 5, flow 1, in the adversary's world: the world's DP synthetic set with a
    privacy.json declaring its pairs public is refused as a warm start (the "ε = 0 control") and as
    few-shot examples (an "ε = 0" set), so nothing of it is ever written at ε = 0."""
    from synthq.config.generator import FinetuneConfig, GenerateConfig
    from synthq.runtime.errors import PrivacyError
    from synthq.stages import finetune_lm, generate

    full, _, _ = worlds
    forged = tmp_path / "syn"
    shutil.copytree(full.artifacts["syn"], forged)
    (forged / "privacy.json").write_text(json.dumps({"public_splits": ["train"]}))
    with pytest.raises(PrivacyError, match="no privacy.json can make them public"):
        finetune_lm.run(FinetuneConfig(data=str(full.data), model=str(tiny_causal_dir),
                                       out=tmp_path / "control", warm_start=f"{forged}:train", max_steps=0,
                                       device="cpu"))  # fmt: skip
    with pytest.raises(PrivacyError, match="no privacy.json can make them public"):
        generate.run(GenerateConfig(generator=tiny_causal_dir, corpus=str(full.data),
                                    few_shot=f"{forged}:train", few_shot_examples=2, out=tmp_path / "zero",
                                    device="cpu"))  # fmt: skip
    assert not (tmp_path / "control").exists() and not (tmp_path / "zero").exists()


def test_a_retracted_declaration_leaves_no_public_figure_standing(worlds):
    """Review round 5, flow 3, in the adversary's world: once the world's dataset no longer
    declares its test split public, the ledger and the statement over everything the world wrote
    refuse (naming the warm start, the few-shot set and the evals that read it) rather than print
    their old ε; declared public again, they compose. With the dataset not where it was read (the
    world was moved), the ledger says the declaration is not checked."""
    from synthq.bookkeeping.releases import ledger_lines
    from synthq.bookkeeping.statement import statement_for
    from synthq.runtime.errors import PrivacyError

    full, _, _ = worlds
    paths = [path for name, path in full.artifacts.items() if name != "audit"]
    assert not full.recorded_data.exists()  # the world was moved after it ran
    assert any(line.startswith("not checked: split 'test'") for line in ledger_lines(paths))
    shutil.copytree(full.data, full.recorded_data)  # the dataset back where the manifests read it
    try:
        declaration = full.recorded_data / "privacy.json"
        declared = declaration.read_text()
        assert ledger(paths).datasets
        declaration.write_text(json.dumps({"private_splits": ["train", "dev", "test"]}))
        with pytest.raises(PrivacyError, match="no longer declares it public"):
            ledger(paths)
        with pytest.raises(PrivacyError, match="no longer declares it public"):
            statement_for(paths)
        for name in ("gen-warm", "syn-zero", "ev-public", "ev-test", "rep"):
            with pytest.raises(PrivacyError, match="no longer declares it public"):
                ledger([full.artifacts[name]])
        declaration.write_text(declared)
        assert ledger(paths).datasets
    finally:
        shutil.rmtree(full.recorded_data)


# (b) D and D minus one unit ---------------------------------------------------------------------


def test_what_differs_without_one_unit_is_a_release_the_ledger_names(worlds):
    full, neighbour, removed = worlds
    assert set(full.artifacts) == set(neighbour.artifacts)
    owners = _owners(full)
    targets = _removed_units(full.unit, removed)
    named: dict[str, bool] = {}

    def accounted(name: str) -> bool:
        if name not in named:
            named[name] = _a_release_read(owners.get(name), targets)
        return named[name]

    differing, unexplained = _differences(full, neighbour, _Normaliser(full, neighbour), accounted)
    unaccounted = [f"{label} {what} without {removed}, and no release in the ledger of {label.split(':')[0]} "
                   "read that unit" for label, what in unexplained]  # fmt: skip
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


def _differences(full: af.World, neighbour: af.World, normalise, explained) -> tuple[list[str], list]:
    """The released files of ``full`` that differ in ``neighbour`` (or are missing there), and, as
    (label, what happened), those of them and of the files only ``neighbour`` has whose artifact
    ``explained(name)`` does not account for."""
    differing, unexplained = [], []
    for label, path in af.released_files(full).items():
        other = neighbour.root / path.relative_to(full.root)
        if other.is_file() and normalise(path, full) == normalise(other, neighbour):
            continue
        differing.append(label)
        if not explained(label.split(":")[0]):
            unexplained.append((label, "is missing" if not other.is_file() else "differs"))
    extra = set(af.released_files(neighbour)) - set(af.released_files(full))
    unexplained += [(label, "exists only") for label in sorted(extra) if not explained(label.split(":")[0])]
    return differing, unexplained


def _owners(world: af.World) -> dict:
    """Label prefix -> the artifacts whose ledger accounts for it (an export is its source's
    re-sealed copy; the search bundle is its retriever's; the printed ledger is all of them)."""
    owners = {name: [path] for name, path in world.artifacts.items()}
    owners.update({name: [path] for name, path in world.released.items() if name.startswith("export ")})
    if "search bundle of ret-dp-a" in world.released:
        owners["search bundle of ret-dp-a"] = [world.artifacts["ret-dp-a"]]
    owners["ledger"] = list(world.artifacts.values())
    return owners


def _digests(data: bytes) -> set[bytes]:
    """The 8-byte keyed digests of a unit set."""
    return {data[i : i + 8] for i in range(0, len(data), 8)}


def _removed_units(unit: str, removed: list[str]) -> dict[str, set[bytes]]:
    """Unit kind -> the keyed digests of the removed unit: the removed queries, and at the user
    unit the removed user."""
    from synthq.privacy.keys import unit_digests

    targets = {"query": _digests(unit_digests("query", removed))}
    if unit == "user":
        targets["user"] = _digests(unit_digests("user", [af.REMOVED_USER]))
    return targets


def _a_release_read(artifacts, targets: dict[str, set[bytes]], finite: bool = False) -> bool:
    """Whether a release behind ``artifacts`` read the removed unit: its keyed unit set holds one
    of ``targets`` (:func:`_removed_units`), with ``finite`` a release of finite ε. A release of
    the same dataset that never read that unit (a read of the dev split, say) does not explain a
    difference; nor does a release whose unit set cannot be read."""
    from synthq.privacy.unit_sets import load_unit_set

    if not artifacts:
        return False
    for release in ledger(artifacts).releases:
        if finite and not math.isfinite(float(release["guarantee"]["epsilon"])):
            continue
        units = release.get("units") or {}
        data = load_unit_set(units, release.get("path"))
        if data is not None and _digests(data) & targets.get(units.get("kind"), set()):
            return True
    return False


class _Normaliser:
    """A released file's content with what legitimately varies between two runs replaced (both
    runs wrote to the same paths): timings and creation times, seals, random release ids (in JSON
    and in a model card's tables), and the manifest hashes of the run's artifacts (which carry
    those), named by artifact instead. A manifest's digests of the files it lists are compared by
    those files' contents as compared here: a payload file normalised as above, a private
    diagnostics file (its keyed digest) timings aside — a training stage's diagnostics hold its
    wall time. ``keyed_datasets``: the keyed identifiers of the private dataset read (its directory's
    keyed digest and its identity, of the whole and of each sub-dataset) are named instead, for a
    world whose removed unit some stage reads with the rest of the directory without releasing it
    (see ``test_a_retriever_that_never_read_the_dev_split_differs_without_a_dev_query_only_by_keyed_ids``)."""

    # "fingerprint" hashes the config and the inputs' identifiers, both compared in the clear
    # no creation stamp: a released time of day is a difference (and a leak) of its own
    VOLATILE = {"fingerprint", "timings", "timing", "seconds", "seal", "wall_seconds", "elapsed",
                "duration", "train_seconds", "seconds_per_step", "pairs_per_second"}  # fmt: skip

    def __init__(self, *worlds: af.World, keyed_datasets: bool = False):
        from synthq.runtime.hashing import sha256_file

        self.names: dict[str, dict[str, str]] = {}
        self.keyed: dict[str, dict[str, str]] = {}
        self.release_ids: set[str] = set()
        self.diagnostics: dict[str, Path] = {}  # a manifest's directory -> where its diagnostics are
        for world in worlds:
            names = {}
            for name, root in [*world.artifacts.items(), *world.released.items()]:
                if (root / "manifest.json").is_file():
                    names[sha256_file(root / "manifest.json")] = f"<manifest {name}>"
                    manifest = json.loads((root / "manifest.json").read_text())
                    self.release_ids |= {r["id"] for r in manifest.get("releases") or []}
                    source = world.artifacts.get(name.removeprefix("export "))
                    if source is not None:
                        self.diagnostics[str(root)] = source
            self.names[str(world.root)] = names
            self.keyed[str(world.root)] = _keyed_dataset_ids(world.data) if keyed_datasets else {}

    def __call__(self, path, world: af.World) -> bytes:
        content = path.read_bytes()
        try:
            text = content.decode()
        except UnicodeDecodeError:
            return content
        if path.suffix == ".json":
            with contextlib.suppress(json.JSONDecodeError):
                value = json.loads(text)
                if path.name == "manifest.json" and isinstance(value, dict):
                    value = self._listed_files(value, path.parent, world)
                text = json.dumps(self._strip(value), sort_keys=True)
        for digest, name in self.names[str(world.root)].items():
            text = text.replace(digest, name)
        for keyed, name in self.keyed[str(world.root)].items():
            text = re.sub(rf"(hmac:)?{keyed[:10]}[0-9a-f]*", name, text)
        ids = set(re.findall(r'"id": "([0-9a-f-]{8,})"', text)) | self.release_ids
        found = re.findall(r"(?<![0-9a-f-])[0-9a-f-]{8,}(?![0-9a-f-])", text)
        for index, release_id in enumerate(dict.fromkeys(i for i in found if i in ids)):
            text = text.replace(release_id, f"<release {index}>")
        return re.sub(r"\d+(\.\d+)? ?(s|ms|seconds|min)\b", "<time>", text).encode()

    def _listed_files(self, manifest: dict, root: Path, world: af.World) -> dict:
        """A manifest with the digests of the files it lists (payload, private diagnostics) replaced
        by their content as compared here (a digest computed here, never released)."""
        import hashlib

        def content(path: Path, private: bool) -> str:
            if not path.is_file():
                return "<missing>"
            data = path.read_bytes() if private else self(path, world)
            if private and path.suffix == ".json":
                with contextlib.suppress(json.JSONDecodeError, UnicodeDecodeError):
                    data = json.dumps(self._strip(json.loads(data)), sort_keys=True).encode()
            return f"<content {hashlib.sha256(data).hexdigest()}>"

        manifest = dict(manifest)
        if isinstance(manifest.get("files"), dict):
            manifest["files"] = {name: content(root / name, False) for name in manifest["files"]}
        source = self.diagnostics.get(str(root))
        if isinstance(manifest.get("private_files"), dict) and source is not None:
            manifest["private_files"] = {
                name: content(source / name, True) for name in manifest["private_files"]
            }
        return manifest

    def _strip(self, value):
        if isinstance(value, dict):
            return {k: self._strip(v) for k, v in value.items() if k not in self.VOLATILE}
        if isinstance(value, list):
            return [self._strip(v) for v in value]
        return value


def _keyed_dataset_ids(data: Path) -> dict[str, str]:
    """The keyed identifiers a read of the private dataset ``data`` records (the keyed digest of
    its directory, its identity; of the whole and of each sub-dataset), hex -> a name."""
    from synthq.data.sources import dataset_parts
    from synthq.privacy.digests import data_record

    names = {}
    for root in [Path(data), *(path for part, path in dataset_parts(Path(data)) if part)]:
        record = data_record(root, root.name, private=True)
        for field in ("sha256", "identity"):
            if record.get(field):
                names[record[field].removeprefix("hmac:")] = f"<keyed {field} of {root.name}>"
    return names


# (b) the dev split, sub-datasets, re-issued pseudonyms ------------------------------------------

DEV_LAYOUTS = ["plain", "sub-datasets"]


@pytest.fixture(scope="module", params=DEV_LAYOUTS)
def dev_worlds(request, tmp_path_factory, tiny_encoder_dir):
    """Tuning on a private dev split (:func:`af.run_selection_world`: two direct-DP retrievers,
    their un-noised dev eval, report-noisy-max on it) on D and on D minus one dev query, with the
    same secret seeds, at the same paths. ``plain``: the tiny set minus ``dev-egg-2``.
    ``sub-datasets``: CQADupStack's layout (:func:`af.sub_dataset_layout`, 2 and 24 dev queries),
    the retrievers trained on the small part, tuned on the whole and on the small part alone, minus
    the small part's ``android-hit`` — the unit the whole names ``android/android-hit`` and the
    part alone ``android-hit``. Both retrievers' training read the directory holding the removed
    query. Returns the two worlds and the removed query's ids."""
    layout = request.param
    base = tmp_path_factory.mktemp(f"adversary-dev-{layout}")
    work = base / "world"
    if layout == "plain":
        data = af.private_dataset(work / "data", "query")
        options, part, query, removed = {}, "", af.REMOVED_DEV_QUERY, [af.REMOVED_DEV_QUERY]
    else:
        data = af.sub_dataset_layout(work / "data")
        part, query = af.SMALL_PART, af.REMOVED_PART_QUERY
        options, removed = {"train_on": data / part, "part": part}, [f"{part}/{query}", query]
    full = af.run_selection_world(work / "run", data, tiny_encoder_dir, **options)
    full = af.relocate(full, work, base / "full")
    af.without_one_dev_query(full.data, work / "data", query, part)
    neighbour = af.run_selection_world(work / "run", work / "data", tiny_encoder_dir, **options)
    neighbour = af.relocate(neighbour, work, base / "minus-one")
    return full, neighbour, removed


def test_without_one_dev_query_only_an_artifact_with_a_finite_release_that_read_it_differs(dev_worlds):
    """A released file that differs without the dev query belongs to an artifact whose ledger
    holds a finite release whose keyed unit set holds that query (the noisy selection's) — or, for
    an artifact that says ε = ∞ (the un-noised dev eval, its copy, the ledger of everything), a
    release that read it. The keyed identifiers of the whole directory are compared by name here
    (the threat model's decision: HMACs under the owner's key name the dataset version)."""
    from synthq.privacy.keys import unit_digests

    full, neighbour, removed = dev_worlds
    assert set(full.artifacts) == set(neighbour.artifacts)
    owners = _owners(full)
    targets = {"query": _digests(unit_digests("query", removed))}
    named: dict[str, bool] = {}

    def explained(name: str) -> bool:
        if name not in named:
            artifacts = owners.get(name)
            finite = bool(artifacts) and math.isfinite(ledger(artifacts).total.epsilon)
            named[name] = _a_release_read(artifacts, targets, finite=finite)
        return named[name]

    normalise = _Normaliser(full, neighbour, keyed_datasets=True)
    differing, unexplained = _differences(full, neighbour, normalise, explained)
    selections = [name for name in full.artifacts if name.startswith(("ev-select", "ev-dev"))]
    vacuous = [name for name in selections if not any(label.startswith(f"{name}:") for label in differing)]
    assert not vacuous, (
        f"read the dev query but do not differ without it (the comparison is vacuous): {vacuous}"
    )
    unaccounted = [f"{label} {what} without {removed[0]}, and no finite release in the ledger of "
                   f"{label.split(':')[0]} read that dev query" for label, what in unexplained]  # fmt: skip
    assert not unaccounted, "released files that depend on a dev query without a finite release of it:\n" + (
        "\n".join(unaccounted)
    )


def test_a_retriever_that_never_read_the_dev_split_differs_without_a_dev_query_only_by_keyed_ids(dev_worlds):
    """A retriever trained on the train split read no dev query, and no release of it holds one:
    its released files (weights, manifest, model card, exported copy) are the same without a dev
    query, except the keyed identifiers of the dataset version it read (the directory's keyed
    digest and identity, HMACs under the owner's key over the whole directory, every split). Those
    name the version on purpose (freshness checks, the ledger's grouping); without the key they are
    indistinguishable from random in either world (the threat model's decision, docs/privacy.md:
    the key never digests data an adversary chose). Everything else must not depend on dev."""
    full, neighbour, _ = dev_worlds
    normalise = _Normaliser(full, neighbour, keyed_datasets=True)
    retrievers = ("ret-dp-a", "ret-dp-b", "export ret-dp-a", "export ret-dp-b")
    differing = []
    for label, path in af.released_files(full).items():
        if label.split(":")[0] in retrievers:
            other = neighbour.root / path.relative_to(full.root)
            if not other.is_file() or normalise(path, full) != normalise(other, neighbour):
                differing.append(label)
    assert not differing, "a retriever that never read the dev split differs without a dev query:\n" + (
        "\n".join(differing)
    )


def test_the_selection_utility_moves_by_at_most_its_sensitivity_when_a_dev_query_goes(dev_worlds):
    """Report-noisy-max's ε holds for a monotone utility of sensitivity 1 (as its release records).
    Every candidate's utility, recomputed from the dev eval's per-query scores, must fall by
    between 0 and that sensitivity without the removed query (the rerun world's eval) and without
    any other dev query (brute force over the scores, rebuilt into rows the way the eval builds
    them); and the exact privacy loss of the choice (Gumbel-max at scale 1/ε samples softmax(ε·u))
    between D and each of those neighbours stays within the ε recorded. On the sub-dataset layout
    the mean of sub-dataset means × queries would move by more than 1 (a small part's query weighs
    N / (P · n_p))."""
    from synthq.artifacts.manifest import open_artifact
    from synthq.reporting.eval_files import read_rows

    full, neighbour, removed = dev_worlds
    (release,) = [r for r in open_artifact(full.artifacts["ev-select"]).releases
                  if r["guarantee"]["mechanism"] == "report-noisy-max"]  # fmt: skip
    details, epsilon = release["guarantee"]["details"], float(release["guarantee"]["epsilon"])
    sensitivity, per = float(details["sensitivity"]), float(details["epsilon_per_selection"])
    rows = read_rows(full.artifacts["ev-dev"])
    before = _utilities(rows)
    rerun = _utilities(read_rows(neighbour.artifacts["ev-dev"]))
    # the rows rebuilt without the removed query are what the rerun world's eval wrote
    rebuilt = _utilities(_without_dev_query(rows, removed[0]))
    assert rebuilt.keys() == rerun.keys() and all(
        rebuilt[m] == pytest.approx(rerun[m], abs=1e-4) for m in rerun
    ), f"rows rebuilt without {removed[0]}: {rebuilt}; the neighbour's eval: {rerun}"
    queries = sorted({q for row in rows for q in (row.get("per_query") or {}).get("ndcg@10", {})})
    assert removed[0] in queries and len(queries) > 1
    neighbours = {f"the neighbour world (without {removed[0]})": rerun}
    neighbours.update({f"without {q}": _utilities(_without_dev_query(rows, q)) for q in queries})
    problems = []
    for label, after in neighbours.items():
        for method, candidates in before.items():
            for variant, utility in candidates.items():
                change = utility - after[method][variant]
                if not -ROUNDING <= change <= sensitivity + ROUNDING:
                    problems.append(f"{label}: the utility of {variant} moves by {change:+.4f}, outside "
                                    f"[0, {sensitivity:g}] (monotone, sensitivity as recorded)")  # fmt: skip
        loss = _choice_loss(before, after, per)
        if loss > epsilon + 1e-9:
            problems.append(
                f"{label}: the choice's privacy loss is {loss:.4f} > the recorded ε = {epsilon:g}"
            )
    assert not problems, "report-noisy-max's premise fails on this layout:\n" + "\n".join(problems)


# results.json rounds a row's means to 6 decimals: a utility read from them (mean × queries) is off
# by that much, which is no change of sensitivity
ROUNDING = 1e-4


def _utilities(rows: list[dict]) -> dict[str, dict[str, float]]:
    """Method -> configuration -> report-noisy-max's utility, as the selection computes it."""
    from synthq.retrieval import selection  # looked up when called: the utility it uses now

    return {
        method: {candidate.variant: selection.selection_utility(candidate) for candidate in choice.candidates}
        for method, choice in selection.select_best(rows).items()
    }


def _without_dev_query(rows: list[dict], query: str) -> list[dict]:
    """A dev eval's rows (with their per-query scores) as the eval writes them without ``query``
    (a sub-dataset's query named ``part/id``): the scores without it, the means rebuilt from them
    (:func:`synthq.reporting.eval_files.row_metrics`: over sub-datasets the mean of their means)."""
    from synthq.reporting.eval_files import row_metrics

    out = []
    for row in rows:
        scores = row.get("per_query")
        if not scores:
            out.append(row)
            continue
        kept = {metric: {q: v for q, v in values.items() if q != query} for metric, values in scores.items()}
        parts: dict[str, dict[str, dict[str, float]]] = {}
        for metric, values in kept.items():
            for name, value in values.items():
                part, _, within = name.partition("/") if "parts" in row else ("", "", name)
                parts.setdefault(part, {}).setdefault(within, {})[metric] = value
        count = len(next(iter(kept.values())))
        out.append({**row, **row_metrics(parts), "per_query": kept, "queries": count})
    return out


def _choice_loss(before: dict, after: dict, per_selection: float) -> float:
    """The privacy loss of report-noisy-max's choices between two dev sets: each method with more
    than one candidate samples softmax(ε_m · utility), so max over candidates of |log p − log p'|,
    summed over the methods (they compose)."""

    def log_softmax(values: list[float]) -> list[float]:
        top = max(values)
        norm = top + math.log(sum(math.exp(v - top) for v in values))
        return [v - norm for v in values]

    total = 0.0
    for method, candidates in before.items():
        if len(candidates) < 2:
            continue
        names = list(candidates)
        p = log_softmax([per_selection * candidates[n] for n in names])
        q = log_softmax([per_selection * after[method][n] for n in names])
        total += max(abs(a - b) for a, b in zip(p, q, strict=True))
    return total


def test_the_ledger_and_statement_print_at_least_the_epsilon_the_noisy_selection_spends(dev_worlds):
    """What a team shares after tuning (the retrievers and the eval of what the noisy selection
    chose): the selection spends ε = SELECT_EPSILON on every dev query (its Gumbel noise is scaled
    so), above the candidates' training (2 × TRAIN_EPSILON per training query), so the dataset's
    total in the ledger and in the statement — one dataset for a set of sub-datasets, named by the
    whole — is at least that."""
    from synthq.bookkeeping.releases import ledger_lines
    from synthq.bookkeeping.statement import statement_for

    full, _, _ = dev_worlds
    shared = [full.artifacts[name] for name in ("ret-dp-a", "ret-dp-b", "ev-select")]
    spent = af.SELECT_EPSILON
    whole = str(full.recorded_data)  # what the selection's dataset is called where it was read
    book = ledger(shared)
    # the dataset line that holds it (with the part the retrievers trained on, where their
    # queries meet: one dataset, named "part + whole")
    (name,) = [cost.name for cost in book.datasets.values() if whole in cost.name.split(" + ")]
    totals = {cost.name: cost.total.epsilon for cost in book.datasets.values()}
    lines = ledger_lines(shared)
    printed = _printed_totals(lines, r"^private dataset (.+?) \(keyed id [^)]*\): ε=(\S+)")
    stated = _stated_totals(statement_for(shared))
    assert name in totals and name in printed and name in stated, (totals, printed, stated)
    shown = {"ledger": totals[name], "printed ledger": printed[name], "statement": stated[name]}
    assert all(value >= spent - 0.005 for value in shown.values()), (
        f"{name}: a noisy selection spent ε = {spent:g} on its dev queries, shown as {shown}:\n"
        + "\n".join(lines)
    )


def _epsilon(text: str) -> float:
    return math.inf if text.strip() == "∞" else float(text)


def _printed_totals(lines: list[str], pattern: str) -> dict[str, float]:
    """Dataset name -> the ε a printed ledger shows for it."""
    found = (re.match(pattern, line) for line in lines)
    return {match.group(1): _epsilon(match.group(2)) for match in found if match}


def _stated_totals(statement: str) -> dict[str, float]:
    """Dataset name (``all`` for all datasets together) -> the least ε a statement shows for it: at
    the run's δ, or at δ = 1e-6 (the run's δ line is refused, with no ε, where that δ means
    nothing)."""
    totals, current = {}, None
    for line in statement.splitlines():
        if line.startswith("## Private dataset "):
            current = line.removeprefix("## Private dataset ").rsplit(" (keyed id", 1)[0]
        elif line.startswith("**All datasets together"):
            current = "all"
        elif line.startswith("## "):
            current = None
        elif current and (
            match := re.match(r"- (?:at the run's δ|every release at δ = 1e-06): ε = (\S+)", line)
        ):
            totals[current] = min(totals.get(current, math.inf), _epsilon(match.group(1)))
    return totals


@pytest.mark.parametrize("dev_worlds", ["sub-datasets"], indirect=True)
def test_a_dev_query_read_through_the_whole_and_through_its_sub_dataset_counts_both_reads(dev_worlds):
    """The small part's dev queries are read by two noisy selections: one on the whole (the
    sub-dataset layout) and one on the part alone (a directory of its own). The same private
    queries: per query, the two releases compose (ε adds up), in the ledger and the statement."""
    from synthq.artifacts.manifest import open_artifact
    from synthq.bookkeeping.releases import ledger_lines
    from synthq.bookkeeping.statement import statement_for

    full, _, removed = dev_worlds
    shared = [full.artifacts[name] for name in ("ret-dp-a", "ret-dp-b", "ev-select", "ev-select-part")]
    spent = {
        name: float(release["guarantee"]["epsilon"])
        for name in ("ev-select", "ev-select-part")
        for release in open_artifact(full.artifacts[name]).releases
        if release["guarantee"]["mechanism"] == "report-noisy-max"
    }
    assert len(spent) == 2
    lines = ledger_lines(shared)
    shown = {
        "ledger": ledger(shared).total.epsilon,
        "statement": max(_stated_totals(statement_for(shared)).values()),
    }
    # each per-dataset line too: the whole and the part hold the same queries, so no line that
    # names either may show less than both reads together (one line, or each at the sum)
    book = ledger(shared)
    shown |= {f"ledger {cost.name}": cost.total.epsilon for cost in book.datasets.values()}
    printed = _printed_totals(lines, r"^private dataset (.+?) \(keyed id [^)]*\): ε=(\S+)")
    shown |= {f"printed {name}": value for name, value in printed.items()}
    shown |= {f"stated {name}": value for name, value in _stated_totals(statement_for(shared)).items()}
    assert all(value >= sum(spent.values()) - 0.005 for value in shown.values()), (
        f"{removed[0]} was read by two noisy selections ({spent}): at least ε = {sum(spent.values()):g} "
        f"per query, shown as {shown}:\n" + "\n".join(lines)
    )


def _two_disjoint_releases_shown(paths, kind: str):
    """The two releases of ``paths`` (of unit ``kind``, unit sets that never meet: else the world
    is too easy), the sum of their ε, the ledger's lines, its per-dataset totals as printed, and
    every total shown (computed, printed, stated)."""
    from synthq.artifacts.manifest import open_artifact
    from synthq.bookkeeping.releases import ledger_lines
    from synthq.bookkeeping.statement import statement_for
    from synthq.privacy.unit_sets import load_unit_set

    releases = [r for path in paths for r in open_artifact(path).releases]
    assert [r["units"]["kind"] for r in releases] == [kind, kind]
    first, second = (_digests(load_unit_set(r["units"], r["path"])) for r in releases)
    assert first and second and not first & second, f"the {kind} unit sets meet: the world is too easy"
    expected = sum(float(r["guarantee"]["epsilon"]) for r in releases)
    lines = ledger_lines(paths)
    printed = _printed_totals(lines, r"^private dataset (.+?) \(keyed id [^)]*\): ε=(\S+)")
    stated = _stated_totals(statement_for(paths))
    shown = {"ledger": ledger(paths).total.epsilon, "printed ledger": max(printed.values()),
             "statement": max(stated.values())}  # fmt: skip
    return releases, expected, lines, printed, shown


@pytest.fixture(scope="module")
def reissued_pseudonyms(tmp_path_factory, tiny_encoder_dir):
    """A user-level log D and its re-export (:func:`af.with_reissued_pseudonyms`: one query of a
    user deleted, every user id re-issued), and a user-level release (a direct-DP retriever at
    ε = 2, the same secret seed) on each: the same people, twice."""
    base = tmp_path_factory.mktemp("adversary-pseudonyms")
    data = af.private_dataset(base / "log" / "data", "user")
    renamed, _ = af.with_reissued_pseudonyms(data, base / "re-export" / "data")
    releases = [
        af.user_level_retriever(base / "artifacts" / "ret-on-log", data, tiny_encoder_dir, epsilon=2.0),
        af.user_level_retriever(
            base / "artifacts" / "ret-on-re-export", renamed, tiny_encoder_dir, epsilon=2.0
        ),
    ]
    return data, renamed, releases


def test_releases_on_a_log_with_reissued_pseudonyms_compose_as_the_same_people(reissued_pseudonyms):
    """No user id survives the re-export and its identity differs (a query is gone), so neither
    unit sets nor the dataset's identity can tell these are the same people — only the links (the
    keyed query ids and texts) can. The ledger over both worlds' artifacts, as computed, printed
    and stated, is at least the sum of the two user-level releases' ε, as one dataset, with no
    assumption that they are different people."""
    from synthq.privacy.unit_sets import DIFFERENT_PEOPLE

    data, renamed, paths = reissued_pseudonyms
    assert not set(af.train_query_users(data).values()) & set(af.train_query_users(renamed).values())
    releases, expected, lines, printed, shown = _two_disjoint_releases_shown(paths, "user")
    each = [round(float(r["guarantee"]["epsilon"]), 3) for r in releases]
    assert all(value >= expected - 0.005 for value in shown.values()), (
        f"two user-level releases (ε = {each}) of the same people under re-issued pseudonyms: at "
        f"least ε = {expected:.3f} per user, shown as {shown}:\n" + "\n".join(lines)
    )
    assert len(printed) == 1, "the same people, printed as different datasets:\n" + "\n".join(lines)
    assert DIFFERENT_PEOPLE not in "\n".join(lines)


def test_query_level_releases_of_a_log_and_its_copy_under_new_query_ids_add_up(
    tmp_path_factory, tiny_encoder_dir
):
    """Review N1: a query-level release on a log and one on its copy with every query id renamed
    (the same texts). Neither the unit sets (ids) nor the identity can tell these are the same
    queries; the (id, text) pairs can. Every total shown is at least the sum, on one line."""
    base = tmp_path_factory.mktemp("adversary-renamed-queries")
    data = af.private_dataset(base / "log" / "data", "query")
    copy = af.with_renamed_queries(data, base / "copy" / "data")
    paths = [
        af.user_level_retriever(base / "artifacts" / name, source, tiny_encoder_dir, 2.0, unit="query")
        for name, source in (("ret-on-log", data), ("ret-on-copy", copy))
    ]
    _, expected, lines, printed, shown = _two_disjoint_releases_shown(paths, "query")
    assert all(value >= expected - 0.005 for value in shown.values()), (
        f"two query-level releases of the same queries under new ids: at least ε = {expected:.3f} "
        f"per query, shown as {shown}:\n" + "\n".join(lines)
    )
    assert len(printed) == 1, "the same queries, printed as different datasets:\n" + "\n".join(lines)


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
    from synthq.config.evaluation import EvalConfig
    from synthq.runtime.hashing import sha256_file, sha256_tree
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

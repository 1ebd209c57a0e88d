"""The sealed guarantee: an edited ε, any edited field of the privacy record, a consistent edit
without the key, or an edited accountant memo is refused or recomputed on open."""

from __future__ import annotations

import json

import pytest
from typer.testing import CliRunner

from synthq.artifacts.manifest import open_artifact
from synthq.cli.app import app
from synthq.runtime.errors import ArtifactError
from tests.helpers import finetune

EDITS = {
    "epsilon": lambda m: m["privacy"].update(epsilon=0.5),
    "delta": lambda m: m["privacy"].update(delta=1e-9),
    "mechanism": lambda m: m["privacy"].update(mechanism="public", epsilon=0.0),
    "details": lambda m: m["releases"][0]["guarantee"]["details"].update(noise_multiplier=50.0),
    "unit count": lambda m: m["releases"][0]["units"].update(count=1_000_000),
    "private flag": lambda m: m["inputs"][0].pop("private"),
    "own_privacy": lambda m: m["own_privacy"].update(epsilon=0.1),
    "releases": lambda m: m.update(releases=[]),
}


def test_an_edited_epsilon_is_refused(tmp_path, tiny_beir, tiny_causal_dir):
    artifact = finetune(tmp_path, tiny_beir, tiny_causal_dir, "gen", epsilon=8.0, max_steps=2)
    manifest = json.loads((artifact.path / "manifest.json").read_text())
    manifest["privacy"]["epsilon"] = 0.5
    (artifact.path / "manifest.json").write_text(json.dumps(manifest))
    with pytest.raises(ArtifactError, match="edited"):
        open_artifact(artifact.path)
    inf = finetune(tmp_path, tiny_beir, tiny_causal_dir, "inf", epsilon="inf", max_steps=1)
    manifest = json.loads((inf.path / "manifest.json").read_text())
    manifest["privacy"]["epsilon"] = 1.0
    (inf.path / "manifest.json").write_text(json.dumps(manifest))
    with pytest.raises(ArtifactError, match="edited"):
        open_artifact(inf.path)


@pytest.mark.parametrize("field", list(EDITS))
def test_every_edit_of_the_guarantee_is_refused(tmp_path, tiny_beir, tiny_causal_dir, field):
    artifact = finetune(tmp_path, tiny_beir, tiny_causal_dir, "gen", epsilon=8.0, max_steps=1)
    manifest = json.loads((artifact.path / "manifest.json").read_text())
    EDITS[field](manifest)
    (artifact.path / "manifest.json").write_text(json.dumps(manifest))
    with pytest.raises(ArtifactError, match="edited"):
        open_artifact(artifact.path)
    assert CliRunner().invoke(app, ["info", str(artifact.path)]).exit_code != 0
    assert CliRunner().invoke(app, ["ledger", str(artifact.path)]).exit_code != 0


def test_a_consistent_edit_without_the_key_is_still_refused(tmp_path, tiny_beir, tiny_causal_dir):
    """Re-sealing needs the key; recomputation catches an ε that its releases do not give even
    when the seal is dropped in favour of a forged foreign one."""
    artifact = finetune(tmp_path, tiny_beir, tiny_causal_dir, "gen", epsilon=8.0, max_steps=1)
    manifest = json.loads((artifact.path / "manifest.json").read_text())
    manifest["privacy"]["epsilon"] = 0.5
    manifest["seal"]["key_id"] = "0" * 16  # pretend another installation wrote it
    (artifact.path / "manifest.json").write_text(json.dumps(manifest))
    with pytest.raises(ArtifactError, match="not what its releases give"):
        open_artifact(artifact.path)


def test_an_edited_accountant_memo_is_recomputed(tmp_path):
    from synthq.privacy import keys
    from synthq.privacy import memo as accountant_memo

    calls = []

    def compute(*parameters):
        calls.append(parameters)
        return 3.25

    assert accountant_memo.remembered(compute, 1.0, 1e-5, 0.1, 10, "rdp") == 3.25
    assert accountant_memo.remembered(compute, 1.0, 1e-5, 0.1, 10, "rdp") == 3.25 and len(calls) == 1
    memo = keys.state_dir() / accountant_memo.MEMO_FILE
    entries = json.loads(memo.read_text())
    for entry in entries.values():
        entry["epsilon"] = 0.01  # an adversary lowering the answer without the key
    memo.write_text(json.dumps(entries))
    accountant_memo._loaded.clear()
    assert accountant_memo.remembered(compute, 1.0, 1e-5, 0.1, 10, "rdp") == 3.25 and len(calls) == 2


def test_a_private_release_with_nothing_to_recompute_is_refused(tmp_path, tiny_beir, tiny_causal_dir):
    """A foreign manifest whose private release drops its mechanism's parameters and claims a
    smaller ε, edited consistently everywhere (the release, the composed headline, own_privacy),
    would be read at face value if an ε without parameters were accepted: it is refused."""
    from synthq.privacy.guarantee import compose_releases
    from synthq.runtime.hashing import json_safe

    artifact = finetune(tmp_path, tiny_beir, tiny_causal_dir, "gen", epsilon=8.0, max_steps=1)
    manifest = json.loads((artifact.path / "manifest.json").read_text())
    release = manifest["releases"][0]["guarantee"]
    release["epsilon"] = 0.5
    release["details"] = {"clip_norm": release["details"]["clip_norm"]}  # σ, q and steps dropped
    sharing = manifest["privacy"].get("details", {}).get("sharing", [[r["id"] for r in manifest["releases"]]])
    composed = compose_releases(manifest["releases"], sharing, manifest.get("assumptions", []))
    manifest["privacy"] = json_safe(composed.model_dump(mode="json"))
    manifest["own_privacy"] = release
    manifest["seal"]["key_id"] = "0" * 16  # pretend another installation wrote it
    (artifact.path / "manifest.json").write_text(json.dumps(manifest))
    with pytest.raises(ArtifactError, match="no mechanism parameters"):
        open_artifact(artifact.path)


def test_a_foreign_manifest_whose_releases_are_composed_in_separate_groups_is_refused(tmp_path):
    """Which releases share no units is read from unit sets only the sealing installation can
    check: split into groups, two ε = e releases would count e, not 2e."""
    from synthq.artifacts.manifest import check_privacy
    from synthq.privacy.guarantee import compose_releases
    from synthq.runtime.hashing import json_safe
    from tests.privacy.test_accounting import dp_guarantee

    releases = [
        {"id": key, "guarantee": json_safe(dp_guarantee(1.0, 0.01, 100, 1e-5).model_dump(mode="json"))}
        for key in ("gen", "ret")
    ]
    sharing = [["gen"], ["ret"]]
    privacy = json_safe(compose_releases(releases, sharing, []).model_dump(mode="json"))
    manifest = {"releases": releases, "privacy": privacy, "own_release": None, "own_privacy": None}
    check_privacy(manifest, tmp_path / "manifest.json", sealed=True)  # this installation's: its unit sets
    with pytest.raises(ArtifactError, match="2 groups that share no units"):
        check_privacy(manifest, tmp_path / "manifest.json", sealed=False)


def test_a_foreign_record_of_a_known_release_id_is_refused_not_swapped_in(tmp_path):
    """Release ids are public: a foreign manifest carrying this installation's id with another
    record (here relabelled public) must not replace the real release in a ledger or an input."""
    from synthq.artifacts.manifest import Artifact, merged_releases

    mine = {"id": "gen", "guarantee": {"epsilon": 8.0, "delta": 1e-5, "mechanism": "dp-adam"}}
    swapped = {"id": "gen", "guarantee": {"epsilon": 0.0, "delta": 0.0, "mechanism": "public"}}
    other = {"id": "ret", "guarantee": {"epsilon": 1.0, "delta": 1e-5, "mechanism": "dp-sgd"}}
    foreign = Artifact(path=tmp_path, manifest={"releases": [swapped, other]}, verified=False)
    with pytest.raises(ArtifactError, match="records release gen differently"):
        merged_releases([mine], foreign)
    same = Artifact(path=tmp_path, manifest={"releases": [mine, other]}, verified=False)
    # the same record: nothing to refuse; a new foreign record keeps no unit set (its editor's)
    assert merged_releases([mine], same) == [mine, {**other, "units": None}]
    local = Artifact(path=tmp_path, manifest={"releases": [swapped]}, verified=True)
    assert merged_releases([mine], local) == [swapped]  # sealed here: recorded again, the later kept


def test_a_foreign_artifact_flows_in_as_one_stand_in_that_composes_with_everything(tmp_path):
    """A foreign manifest's release ids, unit sets and labels are its editor's: an artifact sealed
    here takes none of its records, only one stand-in at its recomputed headline, with no unit
    set (it composes with every release here) and an id no real release can have."""
    from synthq.artifacts.manifest import Artifact
    from synthq.artifacts.writer import ArtifactWriter
    from synthq.privacy.guarantee import compose_releases
    from synthq.privacy.unit_sets import store_unit_set
    from synthq.runtime.hashing import json_safe
    from tests.privacy.test_accounting import dp_guarantee

    def record(key: str, queries: list[str]) -> dict:
        guarantee = json_safe(dp_guarantee(1.0, 0.01, 100, 1e-5).model_dump(mode="json"))
        return {"id": key, "unit": "query", "units": store_unit_set("query", queries), "guarantee": guarantee}

    mine = record("gen", ["q1"])
    swapped = {**record("gen", ["q7"]), "guarantee": {**mine["guarantee"], "epsilon": 0.0}}
    disjoint = record("theirs", ["q9"])  # a unit set that says it shares nothing with mine
    (tmp_path / "foreign").mkdir()
    privacy = compose_releases([swapped, disjoint], [["gen", "theirs"]], [])
    releases = [swapped, disjoint]
    manifest = {"stage": "generate", "releases": releases, "privacy": privacy.model_dump(mode="json")}
    (tmp_path / "foreign" / "manifest.json").write_text(json.dumps(json_safe(manifest)))
    foreign = Artifact(path=tmp_path / "foreign", manifest=manifest, verified=False)
    local = Artifact(path=tmp_path / "local", manifest={"releases": [mine], "privacy": manifest["privacy"]})
    writer = ArtifactWriter(tmp_path, tmp_path, "eval", {}, [], "f")
    writer.inherit(local)
    writer.inherit(foreign)
    (stand_in,) = [r for r in writer.releases if r["id"] != "gen"]
    assert [r["id"] for r in writer.releases] == ["gen", f"foreign:{foreign.manifest_hash}"]
    assert writer.releases[0] == mine and stand_in["units"] is None
    assert stand_in["guarantee"]["epsilon"] == pytest.approx(privacy.epsilon)
    composed = compose_releases(writer.releases, [[r["id"] for r in writer.releases]], [])
    apart = compose_releases(writer.releases, [["gen"], [stand_in["id"]]], [])
    assert writer.privacy.epsilon == pytest.approx(composed.epsilon)  # summed with mine, never apart
    assert composed.epsilon > apart.epsilon
    with pytest.raises(ArtifactError, match="cannot be selected on"):
        foreign.require_sealed_here("selected on")
    local.require_sealed_here("selected on")


@pytest.mark.parametrize("bound", [{"max_queries_per_user": 1}, {"per_query": {"rule": "group-of-2"}}])
def test_a_foreign_user_level_release_relabelled_query_is_refused(tmp_path, bound):
    """Composed beside releases of the query unit, a user-level release counts at its derived
    per-query ε; relabelled ``query`` it would count at its (smaller) user ε."""
    from synthq.artifacts.manifest import check_privacy
    from synthq.privacy.guarantee import compose_releases
    from synthq.runtime.hashing import json_safe
    from tests.privacy.test_accounting import dp_guarantee

    plain = dp_guarantee(1.0, 0.01, 100, 1e-5)
    relabelled = plain.model_copy(update={"details": {**plain.details, **bound}})
    releases = [{"id": "gen", "guarantee": json_safe(relabelled.model_dump(mode="json"))}]
    privacy = json_safe(compose_releases(releases, [["gen"]], []).model_dump(mode="json"))
    manifest = {"releases": releases, "privacy": privacy, "own_release": None, "own_privacy": None}
    if "per_query" not in bound:
        check_privacy(manifest, tmp_path / "manifest.json", sealed=True)  # this installation's own
    with pytest.raises(ArtifactError, match="relabelled" if "per_query" not in bound else "edited"):
        check_privacy(manifest, tmp_path / "manifest.json", sealed=False)


def test_a_stand_in_is_recomputed_wherever_it_is_opened(tmp_path):
    """A stand-in for releases of mixed units is a composition that keeps its parts: it passes
    the checks of this installation and of any other, and its ε is the recomputed sum."""
    from synthq.artifacts.manifest import Artifact
    from synthq.privacy.accounting import check_recorded_epsilon, per_query, recomputed_epsilon
    from synthq.privacy.guarantee import Guarantee, compose_releases
    from synthq.runtime.hashing import json_safe
    from tests.privacy.test_accounting import dp_guarantee

    user = dp_guarantee(1.0, 0.01, 100, 1e-5, unit="user")
    user = user.model_copy(update={"details": {**user.details, "per_query": per_query(user, "group-of-2")}})
    query = dp_guarantee(2.0, 0.01, 100, 1e-5)
    releases = [
        {"id": k, "guarantee": json_safe(g.model_dump(mode="json"))} for k, g in [("u", user), ("q", query)]
    ]
    privacy = compose_releases(releases, [["u", "q"]], [])
    manifest = {"stage": "eval", "releases": releases, "privacy": json_safe(privacy.model_dump(mode="json"))}
    (tmp_path / "manifest.json").write_text(json.dumps(manifest))
    stand_in = Artifact(path=tmp_path, manifest=manifest, verified=False).foreign_stand_in()
    guarantee = Guarantee.from_manifest(stand_in["guarantee"])
    for sealed in (True, False):
        check_recorded_epsilon(guarantee, "stand-in", sealed=sealed)
    assert recomputed_epsilon(guarantee) == pytest.approx(guarantee.epsilon) == pytest.approx(privacy.epsilon)
    assert guarantee.unit == "query" and any("unedited" in a for a in guarantee.assumptions)


def test_two_records_of_one_release_id_are_refused_in_a_score(tmp_path):
    """Ids are public: a results row holding a forged record beside the real one of the same id
    must not compose either silently."""
    from synthq.bookkeeping.splits import score_guarantee
    from synthq.reporting.row_privacy import release_lists

    real = {"id": "g", "guarantee": {"epsilon": 8.0, "delta": 1e-5, "mechanism": "dp-adam"}}
    forged = {"id": "g", "guarantee": {"epsilon": 0.05, "delta": 1e-5, "mechanism": "dp-adam"}}
    with pytest.raises(ArtifactError, match="two different records of release g"):
        score_guarantee([real, forged], [])
    with pytest.raises(ArtifactError, match="two different records of release g"):
        release_lists([real], [forged], [])
    assert release_lists([real], [real], []) == {"model": [real], "data": [real], "selection": []}


def test_an_edited_copy_of_an_own_artifact_is_never_reused(tmp_path, tiny_beir, tiny_causal_dir):
    """An in-place edit breaks the seal: the artifact then opens as foreign, and the stage asked
    for the same output must not take it as up to date (its edited record would flow on)."""
    options = dict(epsilon=8.0, max_steps=1)
    artifact = finetune(tmp_path, tiny_beir, tiny_causal_dir, "gen", **options)
    again = finetune(tmp_path, tiny_beir, tiny_causal_dir, "gen", **options)
    assert again.manifest_hash == artifact.manifest_hash  # up to date: reused
    manifest = json.loads((artifact.path / "manifest.json").read_text())
    manifest["seal"]["key_id"] = "0" * 16  # looks written elsewhere
    (artifact.path / "manifest.json").write_text(json.dumps(manifest))
    assert not open_artifact(artifact.path).verified
    try:
        rerun = finetune(tmp_path, tiny_beir, tiny_causal_dir, "gen", **options)
    except ArtifactError:
        return  # refused to overwrite without --force: not reused either
    assert rerun.verified and rerun.manifest_hash != artifact.manifest_hash

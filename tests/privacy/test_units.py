"""Unit sets: stored and read back by their sha256, and which releases share privacy units."""

from __future__ import annotations

import hashlib
from pathlib import Path

import pytest

from synthq.bookkeeping.releases import _merged_datasets
from synthq.privacy import unit_sets as units_module
from synthq.privacy.keys import key_id, state_dir, unit_digests
from synthq.privacy.unit_sets import (
    DIFFERENT_PEOPLE,
    DIFFERENT_QUERIES,
    QUERIES_BY_ID,
    UNITS_DIR,
    link_assumptions,
    link_text,
    load_unit_set,
    meeting_datasets,
    query_links,
    sharing_groups,
    store_unit_set,
)


def test_a_unit_set_is_stored_and_read_back_by_its_sha256(tmp_path):
    record = store_unit_set("query", ["q2", "q1", "q2"], also_in=tmp_path / "art" / "diagnostics")
    data = unit_digests("query", ["q1", "q2"])
    # no size: the number of private units read is an un-noised count (a noisy selection's dev
    # queries, say); a mechanism that needs n states it as an assumption instead
    assert record == {"kind": "query", "sha256": hashlib.sha256(data).hexdigest(), "key_id": key_id()}
    kept = state_dir(UNITS_DIR) / f"{record['sha256']}.bin"
    assert kept.read_bytes() == data and (tmp_path / "art" / "diagnostics" / "units.bin").read_bytes() == data
    assert load_unit_set(record) == data
    units_module._LOADED.clear()  # a new process: nothing read yet
    kept.unlink()  # the state directory lost it: the releasing artifact's diagnostics still hold it
    assert load_unit_set(record) is None
    assert load_unit_set(record, str(tmp_path / "art")) == data
    units_module._LOADED.clear()
    (tmp_path / "art" / "diagnostics" / "units.bin").write_bytes(data[:8])  # altered: not this set
    assert load_unit_set(record, str(tmp_path / "art")) is None


def test_a_unit_set_is_read_from_disk_once_per_process(tmp_path, monkeypatch):
    """A ledger asks for the same sets several times (sharing groups, user links, the statement);
    the bytes are content-addressed and checked when first read, so later asks reuse them."""
    record = store_unit_set("user", ["u1", "u2"], links={"query": ["q1"], "text": ["t"]})
    reads = []
    real = Path.read_bytes
    monkeypatch.setattr(Path, "read_bytes", lambda self: reads.append(self) or real(self))
    units_module._LOADED.clear()
    first = [load_unit_set(record, None, link) for link in (None, "query", "text")]
    again = [load_unit_set(record, None, link) for link in (None, "query", "text")]
    assert first == again and all(first) and len(reads) == 3
    assert load_unit_set(None) is None and load_unit_set({}) is None


def test_sharing_groups_on_a_chain_of_overlapping_releases():
    a = {"id": "a", "units": store_unit_set("query", ["q1", "q2"])}
    b = {"id": "b", "units": store_unit_set("query", ["q2", "q3"])}
    c = {"id": "c", "units": store_unit_set("query", ["q3", "q4"])}
    # no unit is in all three: a unit in q2 counts a and b, one in q3 counts b and c
    assert sharing_groups([a, b, c]) == [["a", "b"], ["b", "c"]]
    empty = {"id": "e", "units": store_unit_set("query", [])}
    assert sharing_groups([a, empty]) == [["a"], ["e"]]  # a release with no units still counts once
    assert sharing_groups([a]) == [["a"]] and sharing_groups([]) == []
    same = {"id": "s", "units": store_unit_set("query", ["q4", "q3"])}
    assert sharing_groups([c, same]) == [["c", "s"]]


def test_sharing_groups_are_exact_on_disjoint_and_shared_units():
    a = {"id": "a", "units": store_unit_set("query", ["q1", "q2", "q3"])}
    b = {"id": "b", "units": store_unit_set("query", ["q3", "q4"])}
    c = {"id": "c", "units": store_unit_set("query", ["q9"])}
    assert sharing_groups([a, b, c]) == [["a", "b"], ["c"]]
    lost = {"id": "d", "units": {"kind": "query", "count": 2, "sha256": "0" * 64}}
    assert sharing_groups([a, c, lost]) == [["a", "d"], ["c", "d"]]  # unknown set: assumed shared
    user = {"id": "u", "units": store_unit_set("user", ["alice"])}
    assert sharing_groups([a, user]) == [["a", "u"]]  # users hold queries: never assumed apart


def test_a_unit_set_digested_under_another_key_is_assumed_shared(tmp_path, monkeypatch):
    """A colleague's artifact on a shared disk carries its unit set in diagnostics, digested under
    their key: it can never intersect ours, so it must count as unknown (shared), not disjoint."""
    colleague = tmp_path / "colleague-state"
    monkeypatch.setenv("SYNTHQ_STATE", str(colleague))
    theirs = {
        "id": "theirs",
        "units": store_unit_set("query", ["q1", "q2"], also_in=tmp_path / "art" / "diagnostics"),
    }
    theirs["path"] = str(tmp_path / "art")
    monkeypatch.setenv("SYNTHQ_STATE", str(tmp_path / "my-state"))
    ours = {"id": "ours", "units": store_unit_set("query", ["q1", "q2"])}
    other = {"id": "other", "units": store_unit_set("query", ["q9"])}
    assert theirs["units"]["key_id"] != ours["units"]["key_id"]
    assert sharing_groups([theirs, ours, other]) == [["other", "theirs"], ["ours", "theirs"]]


def _user_release(
    release_id: str, users: list[str], queries: list[str], texts: list[str], identity: str
) -> dict:
    links = {"query": queries, "text": [link_text(t) for t in texts]}
    return {
        "id": release_id,
        "units": store_unit_set("user", users, links=links),
        "data": {"identity": identity},
    }


def test_user_level_releases_of_one_dataset_share_users_whatever_their_ids():
    """User ids are pseudonyms: the same people under renamed ids must not count as two sets of
    people (which would halve the printed per-user ε); other datasets' user releases stay apart."""
    people = [f"person-{i}" for i in range(4)]
    renamed = [f"p-{i}" for i in range(4)]
    queries, texts = ["q1", "q2"], ["boil an egg", "tie a knot"]
    first = _user_release("a", people, queries, texts, "hmac:same-queries")
    second = {**_user_release("b", renamed, queries, texts, "hmac:same-queries")}
    other = _user_release("c", ["someone"], ["q9"], ["bake bread"], "hmac:other")
    assert sharing_groups([first, second]) == [["a", "b"]]
    assert sharing_groups([first, second, other]) == [["a", "b"], ["c"]]
    query_level = {"id": "q", "units": store_unit_set("query", ["q9"]), "data": {"identity": "hmac:other"}}
    assert sharing_groups([first, query_level]) == [["a", "q"]]  # mixed kinds: assumed shared, as before


def test_user_level_releases_of_an_edited_or_renamed_log_share_users():
    """The log re-exported without one deleted query and with re-issued pseudonyms is another
    dataset (another identity), but its queries are the same: the releases share users through
    the query ids; renamed throughout (query and user ids), through the query texts (whitespace
    and case aside). Two ε = 2 releases over the same people then print 4, not 2."""
    texts = ["Boil an egg", "tie a knot", "bake bread"]
    log = _user_release("d", ["alice", "bob"], ["q1", "q2", "q3"], texts, "hmac:log")
    edited = _user_release("e", ["u-81", "u-82"], ["q1", "q2"], texts[:2], "hmac:log-minus-q3")
    renamed = _user_release(
        "r", ["x", "y"], ["a", "b", "c"], ["boil  an EGG", "tie a knot", "x"], "hmac:copy"
    )
    strangers = _user_release("s", ["zed"], ["z1"], ["fix a bike"], "hmac:strangers")
    assert sharing_groups([log, edited]) == [["d", "e"]]
    assert sharing_groups([log, renamed]) == [["d", "r"]]
    assert sharing_groups([log, edited, renamed, strangers]) == [["d", "e", "r"], ["s"]]
    unicode = _user_release("n", ["v"], ["n1"], ["Boil an e\u0301gg?", "TIE A KNOT!"], "hmac:nfd")
    accented = _user_release("m", ["w"], ["m1"], ["boil an \u00e9gg"], "hmac:nfc")
    assert sharing_groups([unicode, accented]) == [["m", "n"]]  # Unicode form and punctuation aside
    assert link_assumptions([log, edited]) == []
    assert link_assumptions([log, strangers]) == [DIFFERENT_PEOPLE]  # printed with the total
    without_links = {
        "id": "old",
        "units": store_unit_set("user", ["alice"]),
        "data": {"identity": "hmac:old"},
    }
    assert sharing_groups([strangers, without_links]) == [["old", "s"]]  # unreadable links: shared
    from synthq.privacy.guarantee import Guarantee, compose_releases

    def release(record):
        guarantee = Guarantee(epsilon=2.0, delta=1e-6, unit="user", mechanism="dp-sgd", accountant="rdp")
        return {**record, "unit": "user", "guarantee": guarantee.model_dump(mode="json")}

    both = [release(log), release(edited)]
    assert compose_releases(both, sharing_groups(both), []).epsilon == pytest.approx(4.0)
    # the ledger's per-dataset lines: the edited log is the same people, so one dataset
    for record, name in ((both[0], "log"), (both[1], "log-v2")):
        record["data"] = {**record["data"], "sha256": record["data"]["identity"], "name": name}
    assert len(set(_merged_datasets([*both, release(strangers)]).values())) == 2


def test_datasets_whose_releases_hold_a_common_query_are_one_dataset_in_the_ledger():
    """A read of CQADupStack's whole layout and one of a part (two identities, the part's queries
    in both), a log and its copy minus one query, or its copy under new query ids (the same
    texts, review F-A): one dataset per-dataset totals compose over, whatever the releases' unit
    kinds. Datasets with no query and no text in common stay apart; a release whose queries
    cannot be compared meets every other (a bound)."""

    def query_release(release_id, queries, texts, identity):
        units = store_unit_set("query", queries, links=query_links(queries, texts))
        return {"id": release_id, "units": units, "data": {"identity": identity}}

    def dataset_of(release):
        return release["data"]["identity"]

    def grouped(*releases):
        return sorted(sorted(g) for g in meeting_datasets(list(releases), dataset_of))

    whole = query_release("w", ["a1", "a2", "b1"], ["tie a knot", "boil an egg", "bake"], "hmac:whole")
    part = query_release("p", ["a1"], ["tie a knot"], "hmac:part")
    other = query_release("o", ["z1"], ["fix a bike"], "hmac:other")
    people = _user_release("u", ["alice"], ["a2", "x"], ["boil an egg", "x"], "hmac:log")
    strangers = _user_release("s", ["zed"], ["y"], ["sew a button"], "hmac:strangers")
    assert grouped(whole, part, other, people, strangers) == [
        ["hmac:log", "hmac:part", "hmac:whole"],  # a user's query a2 was read at the query unit too
        ["hmac:other"],
        ["hmac:strangers"],
    ]
    # the log's queries under new ids, read at the query unit: the same people, by their texts
    renamed = query_release("r", ["n1", "n2"], ["Boil an EGG!", "x"], "hmac:copy")
    assert grouped(people, renamed, strangers) == [["hmac:copy", "hmac:log"], ["hmac:strangers"]]
    # a query-level read that kept no texts cannot rule that out next to a user-level release
    ids_only = {"id": "i", "units": store_unit_set("query", ["n9"], links={"query": ["n9"]}),
                "data": {"identity": "hmac:ids"}}  # fmt: skip
    assert grouped(ids_only, strangers) == [["hmac:ids", "hmac:strangers"]]
    assert grouped(ids_only, other) == [["hmac:ids", "hmac:other"]]  # one side kept no texts
    ids_too = {"id": "j", "units": store_unit_set("query", ["m9"], links={"query": ["m9"]}),
               "data": {"identity": "hmac:ids-too"}}  # fmt: skip
    assert grouped(ids_only, ids_too) == [["hmac:ids"], ["hmac:ids-too"]]  # neither did: ids decide
    older = {"id": "old", "units": store_unit_set("query", ["q"]), "data": {"identity": "hmac:old"}}
    assert grouped(older, strangers) == [["hmac:old", "hmac:strangers"]]  # no links: not comparable
    twin = {"id": "t", "units": store_unit_set("query", ["q"]), "data": {"identity": "hmac:twin"}}
    assert len(meeting_datasets([older, twin], dataset_of)) == 1  # two older query sets: compared
    stranger = {"id": "n", "units": store_unit_set("query", ["n"]), "data": {"identity": "hmac:n"}}
    assert len(meeting_datasets([older, stranger], dataset_of)) == 2


def _query_release(release_id, queries, texts, identity="hmac:any"):
    units = store_unit_set("query", queries, links=query_links(queries, texts))
    return {"id": release_id, "units": units, "data": {"identity": identity}}


def test_query_level_releases_of_a_copy_under_new_ids_share_their_queries():
    """Review N1: finetune-lm on a log and on its copy under new query ids composed as the max
    (4.04 for two 4.04 releases) because query units were matched by id. The (id, text) pairs each
    release keeps join them by text; a chain of renames and edits stays one query; a layout and
    two of its parts stay exact at the query (never all three summed)."""
    from synthq.privacy.guarantee import Guarantee, compose_releases

    log = _query_release("a", ["q1", "q2"], ["boil an egg", "tie a knot"])
    copy = _query_release("b", ["n1", "n2"], ["Boil an EGG?", "tie a knot"])
    strangers = _query_release("s", ["z1"], ["fix a bike"])
    assert sharing_groups([log, copy, strangers]) == [["a", "b"], ["s"]]

    def release(record):
        guarantee = Guarantee(epsilon=4.04, delta=1e-6, unit="query", mechanism="dp-sgd", accountant="rdp")
        return {**record, "unit": "query", "guarantee": guarantee.model_dump(mode="json")}

    both = [release(log), release(copy)]
    assert compose_releases(both, sharing_groups(both), []).epsilon == pytest.approx(8.08)
    # renamed (b), then edited (c), then renamed again (d): a shares neither id nor text with d
    chain = [
        _query_release("a", ["i1"], ["t one"]),
        _query_release("b", ["i2"], ["t one"]),
        _query_release("c", ["i2"], ["t two"]),
        _query_release("d", ["i3"], ["t two"]),
    ]
    assert sharing_groups(chain) == [["a", "b", "c", "d"]]
    whole = _query_release("w", ["x1", "y1"], ["tie a knot", "sew a button"])
    part_x = _query_release("x", ["x1"], ["tie a knot"])
    part_y = _query_release("y", ["y1"], ["sew a button"])
    assert sharing_groups([whole, part_x, part_y]) == [["w", "x"], ["w", "y"]]
    assert link_assumptions([log, copy, strangers, whole]) == []  # texts kept: nothing assumed


def test_query_level_releases_without_texts_are_compared_by_id_and_say_so():
    """Releases recorded before texts were kept: two of them are compared by id, and the ledger
    prints that assumption; next to a release that kept pairs they cannot be told apart (shared)."""
    older = {"id": "o", "units": store_unit_set("query", ["q1"]), "data": {"identity": "hmac:o"}}
    other = {"id": "p", "units": store_unit_set("query", ["q2"]), "data": {"identity": "hmac:p"}}
    assert sharing_groups([older, other]) == [["o"], ["p"]]
    assert link_assumptions([older, other]) == [QUERIES_BY_ID]
    fresh = _query_release("f", ["n7"], ["a new query"])
    assert sharing_groups([older, other, fresh]) == [["f", "o", "p"]]


def test_query_level_releases_of_two_datasets_kept_apart_print_that_they_hold_different_queries():
    """Review F2: releases that kept pairs and share no id and no text are kept apart — the same
    queries re-exported with texts changed beyond what link_text folds would count twice — so the
    total prints the assumption; within one dataset (train against dev) nothing is assumed."""
    log = _query_release("a", ["q1"], ["boil an egg"], "hmac:log")
    other = _query_release("b", ["z1"], ["fix a bike"], "hmac:other")
    assert sharing_groups([log, other]) == [["a"], ["b"]]
    assert link_assumptions([log, other]) == [DIFFERENT_QUERIES]
    dev = _query_release("d", ["d1"], ["sew a button"], "hmac:log")
    assert link_assumptions([log, dev]) == []
    copy = _query_release("c", ["n1"], ["Boil an egg!"], "hmac:copy")
    assert link_assumptions([log, copy]) == []  # joined by text: nothing kept apart
    people = _user_release("u", ["alice"], ["a1"], ["boil an egg"], "hmac:people")
    assert link_assumptions([people, other]) == []  # mixed kinds share in the total (ledger lines: N3)
    empty = _query_release("e", [], [], "hmac:empty")  # no queries, but texts kept: not "textless"
    assert QUERIES_BY_ID not in link_assumptions([empty, _query_release("f", [], [], "hmac:f")])


def test_a_release_on_a_synthetic_set_never_meets_the_private_log_by_text():
    """Review F1: a DP release on a synthetic set (data read from a synthq artifact) whose query
    repeats a private query word for word must compose exactly as one whose queries do not — else
    every manifest composing the two would tell, without noise, whether the generator wrote that
    private query. Synthetic queries are matched by id alone."""
    log = _query_release("g", ["q1", "q2"], ["does alice have hiv", "tie a knot"], "hmac:log")

    def synthetic(texts):
        release = _query_release("s", ["doc-1-0", "doc-2-0"], texts, "hmac:synthetic")
        return {**release, "data": {**release["data"], "kind": "artifact"}}

    copied, fresh = synthetic(["does alice have hiv", "x"]), synthetic(["y", "z"])
    assert sharing_groups([log, copied]) == sharing_groups([log, fresh]) == [["g"], ["s"]]
    assert link_assumptions([log, copied]) == link_assumptions([log, fresh])

    def dataset_of(release):
        return release["data"]["identity"]

    assert meeting_datasets([log, copied], dataset_of) == meeting_datasets([log, fresh], dataset_of)
    # nor by id (re-review): a private id equal to a synthetic one must not tell either
    same_id = {**_query_release("s", ["q1"], ["x"], "hmac:synthetic"), "data": {"identity": "hmac:synthetic",
               "kind": "artifact"}}  # fmt: skip
    assert sharing_groups([log, same_id]) == [["g"], ["s"]]
    assert len(meeting_datasets([log, same_id], dataset_of)) == 2
    older_log = {"id": "o", "units": store_unit_set("query", ["q1"]), "data": {"identity": "hmac:o"}}
    older_synthetic = {"id": "t", "units": store_unit_set("query", ["q1"]),
                       "data": {"identity": "hmac:t", "kind": "artifact"}}  # fmt: skip
    assert sharing_groups([older_log, older_synthetic]) == [["o"], ["t"]]
    # two synthetic sets (a set and its filtered copy) still meet by id
    filtered = {**synthetic(["y"]), "id": "f", "units": store_unit_set(
        "query", ["doc-1-0"], links=query_links(["doc-1-0"], ["y"]))}  # fmt: skip
    assert sharing_groups([fresh, filtered]) == [["f", "s"]]

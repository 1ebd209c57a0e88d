"""Which releases share privacy units: the unit sets behind per-unit composition.

Every release of private data records the keyed digests of its units
(:func:`synthq.privacy.keys.unit_digests`:
8 bytes per query or user, sorted) by the sha256 of that set. The set itself is never released: it is
kept in the owner's state directory (``units/<sha256>.bin``) and in the releasing artifact's private
``diagnostics/``. :func:`sharing_groups` intersects the sets of a list of releases and returns the
maximal groups of releases whose data hold a common unit — what
:func:`synthq.privacy.guarantee.compose_releases` sums over. A release whose set cannot be found here (made
under another key, or the state directory was lost) is assumed to share units with every other
release (a bound, never an understatement).

User ids are pseudonyms, so a user-level release also keeps two *link* sets: the keyed digests of
the ids and of the texts (:func:`link_text`) of every query of its dataset, all splits. Two
user-level releases whose link sets meet — the same log re-exported with re-issued pseudonyms,
minus a deleted query, or renamed throughout — hold the same people and compose as one unit set
(:func:`linked_users`): matching is by the query ids and the query texts, a design choice the
threat model states. Two logs with no query and no query text in common are taken to be different
people; one the owner knows to hold the same people under other texts must be declared so (the
same dataset identity).
"""

from __future__ import annotations

import hashlib
import json
import unicodedata
from collections import OrderedDict
from pathlib import Path

from synthq.privacy.keys import key_id, state_dir, unit_digest_values, unit_digests

UNITS_DIR = "units"


# What a user-level release links its users by: the ids and the texts of their queries.
LINK_KINDS = ("query", "text")
# A query-level release also keeps which id went with which text: the pairs a query is followed by
# across releases that renamed it or edited its text (:func:`sharing_groups`).
PAIRS = "pair"


def _keep(data: bytes, also_in: Path | None, name: str) -> str:
    sha = hashlib.sha256(data).hexdigest()
    target = state_dir(UNITS_DIR) / f"{sha}.bin"
    if not target.exists():
        tmp = target.with_name(target.name + ".tmp")
        tmp.write_bytes(data)
        tmp.replace(target)
    if also_in is not None:
        also_in.mkdir(parents=True, exist_ok=True)
        (also_in / name).write_bytes(data)
    return sha


def link_text(text: str) -> str:
    """A query text as the links compare it: Unicode NFKC, case folded, punctuation and symbols
    dropped, whitespace collapsed (``"How to boil an egg?"`` and ``"how to  boil an egg"`` meet)."""
    folded = unicodedata.normalize("NFKC", text).casefold()
    kept = "".join(ch if not unicodedata.category(ch).startswith(("P", "S")) else " " for ch in folded)
    return " ".join(kept.split())


def query_links(query_ids: list[str], texts: list[str]) -> dict[str, list[str]]:
    """The link sets a release of these queries keeps (:data:`LINK_KINDS`): their ids and their
    texts as :func:`link_text` compares them — what joins it to another release's data that holds
    the same queries under other ids (:func:`meeting_datasets`)."""
    return {"query": list(query_ids), "text": [link_text(text) for text in texts]}


DIFFERENT_PEOPLE = (
    "user-level releases that share no query id and no query text (Unicode form, case, punctuation "
    "and spacing aside) hold different people"
)
DIFFERENT_QUERIES = (
    "query-level releases of different datasets that share no query id and no query text (Unicode "
    "form, case, punctuation and spacing aside) hold different queries"
)
QUERIES_BY_ID = (
    "query-level releases that kept no query texts (recorded before texts were kept) are matched by "
    "query id only: a copy of their data under new query ids would count as other queries"
)
SEPARATE_DATASETS = (
    "datasets on separate ledger lines hold different people and different queries: none of their "
    "releases share a query id or a query text (Unicode form, case, punctuation and spacing aside)"
)
# Every assumption a per-unit composition may rest on through links (none under a plain sum).
LINK_ASSUMPTIONS = (DIFFERENT_PEOPLE, DIFFERENT_QUERIES, QUERIES_BY_ID, SEPARATE_DATASETS)


EMPTY_SET = hashlib.sha256(b"").hexdigest()  # the sha256 of a release's set of no units


def link_assumptions(releases: list[dict]) -> list[str]:
    """What a composition of ``releases`` (:func:`sharing_groups`) rests on where it keeps two
    releases apart by their links: :data:`DIFFERENT_PEOPLE` when two user-level releases are not
    linked; :data:`DIFFERENT_QUERIES` when query-level releases of two datasets fall in no common
    group; :data:`QUERIES_BY_ID` when query-level releases that kept no texts were compared by id.
    Releases of different unit kinds are never kept apart (they share), so they assume nothing."""
    kinds = {(r.get("units") or {}).get("kind") for r in releases}
    found = []
    users = {r["id"] for r in releases if (r.get("units") or {}).get("kind") == "user"}
    merged = connected(linked_users(releases) | _same_dataset_users(releases))
    if len(users) > 1 and not any(users <= group for group in merged):
        found.append(DIFFERENT_PEOPLE)
    if kinds != {"query"} or len(releases) < 2:
        return found
    groups = sharing_groups(releases)
    paired = _query_groups(releases)[1]
    by_dataset: dict[str, set[str]] = {}
    for release in releases:
        empty = ((release.get("units") or {}).get("links") or {}).get(PAIRS) == EMPTY_SET
        if release["id"] in paired and not _is_artifact_data(release) and not empty:
            data = release.get("data") or {}
            by_dataset.setdefault(data.get("identity") or data.get("sha256") or "", set()).add(release["id"])
    datasets = list(by_dataset.values())
    for index, first in enumerate(datasets):
        for second in datasets[index + 1 :]:
            if any(not any(a in g and b in g for g in groups) for a in first for b in second):
                found.append(DIFFERENT_QUERIES)
                break
        if DIFFERENT_QUERIES in found:
            break
    textless = [r for r in releases if r["id"] not in paired and load_unit_set(r.get("units"), r.get("path"))]
    if len(textless) > 1 and not paired:  # next to releases that kept pairs they share instead
        found.append(QUERIES_BY_ID)
    return found


def _is_artifact_data(release: dict) -> bool:
    """Whether a release read a synthq artifact (a synthetic set), not a dataset of people: its
    queries are a DP mechanism's output, never a log's queries. They are matched with other
    artifact releases by id only, and with releases of private data never — matching their texts
    would read whether the generator wrote a private query word for word, matching their ids
    whether the private log holds an id like a synthetic one (each an un-noised bit in every
    manifest that composes them). The people behind them are covered by the generator's release."""
    return (release.get("data") or {}).get("kind") == "artifact"


# Artifact releases' digests are moved by this mask, so that they never equal a private digest.
ARTIFACT_NAMESPACE = 0xA5A5_5A5A_C3C3_3C3C


def _namespaced(digests, release: dict):
    """``digests`` (uint64) as compared across releases: an artifact release's in their own space."""
    import numpy as np

    digests = np.asarray(digests, dtype=np.uint64)
    return digests ^ np.uint64(ARTIFACT_NAMESPACE) if _is_artifact_data(release) else digests


def connected(groups) -> list[set[str]]:
    """The connected components of overlapping groups (each an iterable of keys)."""
    merged: list[set[str]] = []
    for group in groups:
        group = set(group)
        touching = [m for m in merged if m & group]
        merged = [m for m in merged if not m & group] + [group.union(*touching)]
    return merged


def store_unit_set(
    kind: str, unit_ids: list[str], also_in: Path | None = None, links: dict[str, list[str]] | None = None
) -> dict:
    """Digest the units of a release, keep the set (state directory and ``also_in``), and return
    the record a release carries: the unit kind and the set's sha256 — not its size, which is an
    un-noised count of private units (a mechanism that needs n states it as an assumption). A
    user-level release passes ``links`` (:data:`LINK_KINDS` -> the ids / texts of its users'
    queries): their keyed sets are kept the same way and the record names them by sha256."""
    record = {
        "kind": kind,
        "sha256": _keep(unit_digests(kind, unit_ids), also_in, "units.bin"),
        "key_id": key_id(),
    }
    if links:
        record["links"] = {
            link: _keep(unit_digests(f"link-{link}", values), also_in, f"units-{link}.bin")
            for link, values in sorted(links.items())
        }
        if kind == "query" and "text" in links and len(links.get("query", ())) == len(links["text"]):
            record["links"][PAIRS] = _keep(_pair_digests(links), also_in, f"units-{PAIRS}.bin")
    return record


def _pair_digests(links: dict[str, list[str]]) -> bytes:
    """Sorted 16-byte records: each query's keyed id digest, then its keyed text digest (the same
    digests as the ``query`` and ``text`` link sets)."""
    ids = unit_digest_values("link-query", links["query"])
    texts = unit_digest_values("link-text", links["text"])
    pairs = sorted(set(zip(ids, texts, strict=True)))
    return b"".join(i.to_bytes(8, "big") + t.to_bytes(8, "big") for i, t in pairs)


def load_unit_set(
    record: dict | None, artifact_path: str | None = None, link: str | None = None
) -> bytes | None:
    """The unit set of a release record, from the state directory or the releasing artifact's
    diagnostics; ``None`` when neither holds it, it does not match its recorded sha256, or it was
    digested under another key (a colleague's artifact on a shared disk carries its diagnostics:
    their digests can never meet this installation's, so intersecting them would call every unit
    disjoint — they count as unknown, i.e. shared with every other release)."""
    if not record or "sha256" not in record:
        return None
    if "key_id" in record and record["key_id"] != key_id():
        return None
    sha = record["sha256"] if link is None else (record.get("links") or {}).get(link)
    if sha is None:
        return None
    cached = (key_id(), sha)  # under this installation's key: a key change never reuses old sets
    if cached in _LOADED:  # content-addressed and checked when read: the same bytes, wherever they are
        _LOADED.move_to_end(cached)
        return _LOADED[cached]
    candidates = [state_dir(UNITS_DIR) / f"{sha}.bin"]
    if artifact_path:
        candidates.append(
            Path(artifact_path) / "diagnostics" / ("units.bin" if link is None else f"units-{link}.bin")
        )
    for path in candidates:
        if path.is_file():
            data = path.read_bytes()
            if hashlib.sha256(data).hexdigest() == sha:
                _remember(cached, data)
                return data
    return None


# Unit sets already read in this process, by (owner key id, sha256): a ledger asks for the same sets
# several times (sharing groups, user links, the statement), and each read hashes the whole file.
_LOADED: OrderedDict[tuple[str, str], bytes] = OrderedDict()
LOADED_BYTES_LIMIT = 256 << 20


def _remember(cached: tuple[str, str], data: bytes) -> None:
    _LOADED[cached] = data
    held = sum(len(d) for d in _LOADED.values())
    while len(_LOADED) > 1 and held > LOADED_BYTES_LIMIT:
        held -= len(_LOADED.popitem(last=False)[1])


def sharing_groups(releases: list[dict]) -> list[list[str]]:
    """Maximal groups of release ids whose units intersect (each release in at least one).

    Releases of different unit kinds (query and user) are assumed to share units: a person's
    queries are theirs, and no digest links the two. User-level releases of the same dataset are
    assumed to share users whatever their ids: user ids are pseudonyms, and re-issued or renamed
    ones must not make one person count as two. Query-level releases that kept their (id, text)
    pairs share a query when a chain of common ids and texts joins them (:func:`_query_groups`:
    a copy of a log under new query ids, then edited, is still the same queries); one that kept
    no pairs is compared by id with others that kept none, and with any that did it cannot be
    told apart (shared: a bound)."""
    import numpy as np

    ids = [r["id"] for r in releases]
    if len(ids) <= 1:
        return [ids] if ids else []
    kinds = {(r.get("units") or {}).get("kind") for r in releases}
    sets = {r["id"]: load_unit_set(r.get("units"), r.get("path")) for r in releases}
    paired = _query_groups(releases) if kinds == {"query"} else None
    if len(kinds) > 1 or any(v is None for v in sets.values()):
        unknown = [key for key, value in sets.items() if value is None] if len(kinds) == 1 else ids
        known = [key for key in ids if key not in unknown]
    else:
        unknown, known = [], ids
    if paired is not None and paired[0]:
        groups_by_pairs, with_pairs = paired
        unknown = list(dict.fromkeys([*unknown, *(key for key in known if key not in with_pairs)]))
        known = []  # the pairs decide among releases that kept them; the rest cannot be told apart
    else:
        groups_by_pairs = set()
    groups: set[frozenset[str]] = set()
    if known:
        by_id = {r["id"]: r for r in releases}
        digests = np.concatenate(
            [_namespaced(np.frombuffer(sets[key], dtype=">u8"), by_id[key]) for key in known]
        )
        owners = np.concatenate(
            [np.full(len(sets[key]) // 8, index, dtype=np.int64) for index, key in enumerate(known)]
        )
        order = np.argsort(digests, kind="stable")
        digests, owners = digests[order], owners[order]
        starts = np.flatnonzero(np.r_[True, digests[1:] != digests[:-1]])
        for begin, end in zip(starts, np.r_[starts[1:], len(digests)], strict=True):
            groups.add(frozenset(known[i] for i in owners[begin:end].tolist()))
        for key in known:  # a release with no units at all still counts once
            if not any(key in group for group in groups):
                groups.add(frozenset([key]))
    groups |= _same_dataset_users(releases) | linked_users(releases) | groups_by_pairs
    groups = {frozenset([*group, *unknown]) for group in groups} or {frozenset(unknown)}
    maximal = [g for g in groups if not any(g < other for other in groups)]
    return sorted(sorted(g) for g in maximal)


def _query_groups(releases: list[dict]) -> tuple[frozenset[frozenset[str]], frozenset[str]]:
    """Groups of the query-level releases that kept (id, text) pairs, by the queries they may
    share, and the ids of those releases.

    Ids and texts are the nodes of a graph whose edges are the pairs of every release: one
    connected part is one query as far as the keyed digests can tell (the same id, or the same
    text under another id, or the same id with an edited text, chained). Its group is every
    release holding a pair of it. Exact at the query, not the release: a whole layout and two of
    its parts give {whole, part 1} and {whole, part 2}, never all three. A release that read a
    synthq artifact (:func:`_is_artifact_data`) joins the graph by its ids alone."""
    import numpy as np

    key = tuple(
        (r["id"], json.dumps(r.get("units"), sort_keys=True), _is_artifact_data(r), r.get("path"))
        for r in releases
    )
    if (cached := _GROUPS.get((key_id(), key))) is not None:
        return cached
    pairs = {}
    for release in releases:
        units, path = release.get("units"), release.get("path")
        if _is_artifact_data(release):
            ids = load_unit_set(units, path, "query") if (units or {}).get("links", {}).get(PAIRS) else None
            if ids is not None:  # its ids only (text 0: none): a text edge would read the generator's output
                block = np.zeros((len(ids) // 8, 2), dtype=np.uint64)
                block[:, 0] = _namespaced(np.frombuffer(ids, ">u8"), release)
                pairs[release["id"]] = block
            continue
        data = load_unit_set(units, path, PAIRS)
        if data is not None:
            pairs[release["id"]] = np.frombuffer(data, ">u8").reshape(-1, 2).astype(np.uint64)
    if not pairs:
        return frozenset(), frozenset()
    owners = list(pairs)
    result = (frozenset(_graph_groups([pairs[key] for key in owners], owners)), frozenset(owners))
    _GROUPS[(key_id(), key)] = result
    while len(_GROUPS) > 64:
        _GROUPS.pop(next(iter(_GROUPS)))
    return result


_GROUPS: dict[tuple, tuple[frozenset[frozenset[str]], frozenset[str]]] = {}


def _graph_groups(pairs: list, owners: list[str]) -> set[frozenset[str]]:
    """The distinct sets of owners of the connected parts of the id-text graph (``pairs[i]``: an
    (n, 2) array of id and text digests of ``owners[i]``; a text digest of 0 is no text)."""
    import numpy as np
    from scipy.sparse import coo_matrix
    from scipy.sparse.csgraph import connected_components

    ids = np.concatenate([block[:, 0] for block in pairs]).astype(np.uint64)
    texts = np.concatenate([block[:, 1] for block in pairs]).astype(np.uint64)
    owner = np.concatenate([np.full(len(block), index, dtype=np.int64) for index, block in enumerate(pairs)])
    found = {frozenset([owners[i]]) for i, block in enumerate(pairs) if len(block) == 0}  # counts once
    if not len(ids):
        return found
    id_nodes, id_index = np.unique(ids, return_inverse=True)
    has_text = texts != 0
    text_nodes, text_index = np.unique(texts[has_text], return_inverse=True)
    size = len(id_nodes) + len(text_nodes)
    rows, cols = id_index[has_text], len(id_nodes) + text_index
    graph = coo_matrix((np.ones(len(rows)), (rows, cols)), shape=(size, size))
    _, part = connected_components(graph, directed=False)
    query_part = part[id_index]
    words = (len(owners) + 63) // 64  # each part's owners as a bitmask, 64 releases a word
    masks = np.zeros((part.max() + 1, words), dtype=np.uint64)
    for word in range(words):
        inside = (owner // 64) == word
        bits = np.left_shift(np.uint64(1), (owner[inside] % 64).astype(np.uint64))
        np.bitwise_or.at(masks[:, word], query_part[inside], bits)
    for row in np.unique(masks[np.unique(query_part)], axis=0):
        found.add(frozenset(
            owners[64 * word + bit] for word, value in enumerate(row.tolist()) for bit in range(64)
            if value >> bit & 1
        ))  # fmt: skip
    return found


def _same_dataset_users(releases: list[dict]) -> set[frozenset[str]]:
    """Groups of the user-level releases of one dataset (by its keyed identity, else its digest)."""
    by_dataset: dict[str, set[str]] = {}
    for release in releases:
        if (release.get("units") or {}).get("kind") == "user":
            data = release.get("data") or {}
            by_dataset.setdefault(data.get("identity") or data.get("sha256") or "", set()).add(release["id"])
    return {frozenset(ids) for ids in by_dataset.values() if len(ids) > 1}


def _query_views(release: dict) -> dict[str, tuple[str, bytes]]:
    """What a release's data hold, comparable across releases: the keyed sets of the query ids and
    texts it links (every query of a user-level release's dataset; a query-level release's own
    queries), else a query-level release's unit set (older records, comparable only to another
    such set). Missing views are left out."""
    units, path = release.get("units") or {}, release.get("path")
    linked = {link: load_unit_set(units, path, link) for link in LINK_KINDS}
    views = {link: ("link", data) for link, data in linked.items() if data is not None}
    own = load_unit_set(units, path) if "query" not in views and units.get("kind") == "query" else None
    if own is not None:
        views["query"] = ("unit", own)
    if _is_artifact_data(release):  # a synthetic set's queries meet by id alone (_is_artifact_data)
        views.pop("text", None)
        views["artifact"] = ("artifact", b"")
    return views


def _meet(first: dict, second: dict, kinds: tuple[str, str]) -> bool:
    """Whether two releases' data may hold a common query: their id or text sets meet, or they
    cannot be told apart (no comparable id sets; one side kept texts and the other did not, or a
    user-level and a query-level release without both text sets: the same queries under new ids
    must still meet, as two user-level releases' texts do) — a bound, never an understatement."""
    import numpy as np

    def meets(kind: str) -> bool:
        (how_a, a), (how_b, b) = first[kind], second[kind]
        return how_a == how_b and np.intersect1d(np.frombuffer(a, ">u8"), np.frombuffer(b, ">u8")).size > 0

    ids = "query" in first and "query" in second and first["query"][0] == second["query"][0]
    if ("artifact" in first) != ("artifact" in second):  # a synthetic set and private data: never
        return False
    if "artifact" in first:  # two synthetic sets (a set and its filtered copy): by id, unknown meet
        return not ids or meets("query")
    texts = "text" in first and "text" in second
    one_sided = ("text" in first) != ("text" in second)  # one kept texts: a copy under new ids
    if not ids or (kinds[0] != kinds[1] and not texts) or one_sided:  # cannot be ruled out
        return True
    return meets("query") or (texts and meets("text"))


def meeting_datasets(releases: list[dict], dataset_of) -> list[set[str]]:
    """Groups of dataset keys (``dataset_of(release)``) whose releases hold a common query or the
    same people: a read of CQADupStack's whole layout and one of a part, a log and its copy minus
    one query or under new query ids (texts), a re-export under new pseudonyms
    (:func:`linked_users`). Each group is one dataset in a per-dataset total, so no such total
    shows the max of two releases over one unit. Releases whose queries cannot be compared
    (:func:`_meet`) meet — a bound, never an understatement."""
    views = {r["id"]: _query_views(r) for r in releases}
    kinds = {r["id"]: (r.get("units") or {}).get("kind") for r in releases}
    pairs = [{dataset_of(r)} for r in releases]
    for index, first in enumerate(releases):
        for second in releases[index + 1 :]:
            a, b = dataset_of(first), dataset_of(second)
            both = (kinds[first["id"]], kinds[second["id"]])
            if a != b and _meet(views[first["id"]], views[second["id"]], both):
                pairs.append({a, b})
    return connected(pairs)  # user-level pairs meet as linked_users links them: ids, texts, unknown


def linked_users(releases: list[dict]) -> set[frozenset[str]]:
    """Groups of user-level releases that hold the same people: connected by link sets that meet
    (a query id or a query text in common). A user-level release whose link sets cannot be read
    (written before links, under another key, or lost) is linked to every other user-level
    release — a bound, never an understatement."""
    import numpy as np

    users = [r for r in releases if (r.get("units") or {}).get("kind") == "user"]
    if len(users) < 2:
        return set()
    links = {
        r["id"]: [load_unit_set(r.get("units"), r.get("path"), link) for link in LINK_KINDS] for r in users
    }
    pairs = []
    for index, first in enumerate(users):
        for second in users[index + 1 :]:
            a, b = links[first["id"]], links[second["id"]]
            unknown = any(x is None for x in (*a, *b))
            if unknown or any(
                np.intersect1d(np.frombuffer(x, ">u8"), np.frombuffer(y, ">u8")).size
                for x, y in zip(a, b, strict=True)
            ):
                pairs.append({first["id"], second["id"]})
    return {frozenset(group) for group in connected(pairs)}

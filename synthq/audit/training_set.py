"""The audited training set: the private pairs, the canaries inserted into them, and the δ the
bounds are tested at.

The audited generators are fine-tuned on a scratch BEIR directory (:func:`augmented_dataset`):
the private pairs (all of them, or a fixed subset chosen by no seed and no coin), every included
one-run canary once and every exposure canary ``repetitions`` times. At ``--privacy-unit user``
it also holds a ``users.tsv``: the private queries keep their users, and each canary user owns
their canaries, so fine-tuning counts the same units the audit's bound is about.
"""

from __future__ import annotations

import hashlib
from pathlib import Path

from synthq.audit.canaries import (
    Canary,
    OneRunCanary,
    inserted_pair_count,
    make_canaries,
    make_one_run_canaries,
)
from synthq.config.audit import CanaryAuditConfig
from synthq.data.beir_io import BeirDataset, read_qrels, write_beir_dir
from synthq.data.users import USERS_FILE, query_users, read_users_file
from synthq.privacy.accounting import default_delta
from synthq.runtime.errors import SynthqError


def private_pairs(dataset: BeirDataset, config: CanaryAuditConfig) -> list[tuple[str, str]]:
    """The private (query id, document id) pairs the audited generators train on.

    ``private_pairs`` keeps a fixed subset: the pairs with the smallest SHA-256 of their ids, a
    choice that depends on no seed and no coin."""
    qrels = dataset.require_split(config.split)
    pairs = sorted((q, d) for q, docs in qrels.items() for d, rel in docs.items() if rel > 0)
    if config.private_pairs is not None and config.private_pairs < len(pairs):
        pairs = sorted(pairs, key=lambda p: hashlib.sha256(f"{p[0]}\t{p[1]}".encode()).hexdigest())
        pairs = sorted(pairs[: config.private_pairs])
    return pairs


def choose_canaries(
    dataset: BeirDataset, config: CanaryAuditConfig
) -> tuple[list[OneRunCanary], list[Canary]]:
    """The one-run canaries (with their coins) and the exposure canaries the config asks for, in
    this order: both are drawn from ``canary_seed``."""
    one_run, exposure = [], []
    if config.method in ("one-run", "both"):
        per_canary_user = config.canary_queries_per_user if config.privacy_unit == "user" else 0
        one_run = make_one_run_canaries(dataset, config.canaries, config.canary_seed, per_canary_user)
    if config.method in ("exposure", "both"):
        exposure = make_canaries(
            dataset, config.split, config.shapes, config.canaries_per_shape, config.repetitions,
            config.references, config.canary_seed,
        )  # fmt: skip
    return one_run, exposure


def check_canary_count(one_run: list[OneRunCanary], exposure: list[Canary], private: list) -> None:
    """Refuse canaries that would outnumber the private pairs.

    The expected count is compared, not the coins': whether the audit is refused must not depend
    on them."""
    expected = len(one_run) / 2 + inserted_pair_count(exposure)
    if expected > len(private):
        raise SynthqError(
            f"the canaries would add ~{expected:.0f} pairs to {len(private)} private pairs: lower "
            "--canaries, --repetitions or --canaries-per-shape (canaries must not outnumber the data, "
            "or the audit measures a different training set)"
        )


def inserted_count(one_run: list[OneRunCanary], exposure: list[Canary]) -> int:
    """Canary pairs actually inserted: the included one-run canaries and every exposure copy."""
    return sum(c.included for c in one_run) + inserted_pair_count(exposure)


def augmented_dataset(
    dataset: BeirDataset,
    config: CanaryAuditConfig,
    private: list[tuple[str, str]],
    one_run: list[OneRunCanary],
    exposure: list[Canary],
    root: Path,
) -> Path:
    """The private pairs plus every included one-run canary (once) and every exposure canary
    (``repetitions`` times), as a scratch BEIR directory."""
    corpus = {d: dataset.corpus[d] for _, d in private}
    queries = {q: dataset.queries[q] for q, _ in private}
    train: dict[str, dict[str, int]] = {}
    for query_id, doc_id in private:
        train.setdefault(query_id, {})[doc_id] = 1
    for canary in one_run:
        if canary.included:
            corpus[canary.canary_id] = {"title": "", "text": canary.document}
            queries[canary.canary_id] = canary.query
            train[canary.canary_id] = {canary.canary_id: 1}
    for canary in exposure:
        if canary.repetitions == 0:
            continue
        corpus[canary.canary_id] = {"title": "", "text": canary.document}
        for copy in range(canary.repetitions):
            query_id = f"{canary.canary_id}-copy{copy}"
            queries[query_id] = canary.query
            train[query_id] = {canary.canary_id: 1}
    write_beir_dir(root, corpus, queries, {config.split: train})
    if config.privacy_unit == "user":  # who wrote what: the private users, and one user per canary
        private_queries = list(dict.fromkeys(q for q, _ in private))
        rows = [dataset.queries.row(q) for q in private_queries]
        owners = dict(zip(private_queries, query_users(dataset.root, dataset.queries, rows), strict=True))
        owners |= {c.canary_id: c.user for c in one_run if c.included}
        lines = "".join(f"{query}\t{user}\n" for query, user in owners.items())
        (root / USERS_FILE).write_text("query-id\tuser-id\n" + lines, encoding="utf-8")
    return root


def training_unit_count(root: Path, config: CanaryAuditConfig) -> int:
    """Privacy units of the augmented training set as finetune-lm counts them: its queries, or
    (``--privacy-unit user``) its users."""
    if config.privacy_unit == "user":
        owners = read_users_file(Path(root) / USERS_FILE)
        return len({user for user, _ in owners.values()})
    return len(read_qrels(Path(root) / "qrels" / f"{config.split}.tsv"))


def audit_delta(config: CanaryAuditConfig, training_pairs: int) -> float:
    """The δ the bounds are tested at: the audited generators' δ (``--finetune delta``, which
    arrives as text from the command line, or finetune-lm's default 1/(2n))."""
    value = config.finetune.get("delta")
    return default_delta(training_pairs) if value is None else float(value)

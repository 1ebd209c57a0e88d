"""The population of ``synthq evolve`` between votes, and its private checkpoint.

:class:`Population` is what one vote hands to the next: the candidates (the public model's
queries, keyed by ``(doc_id, index)``), how many votes are done, the next free index, and what
the votes so far recorded (the noisy votes of each round's winners, and the un-noised counts that
only go to the private diagnostics). :func:`checkpoint_state` is what the stage checkpoints
(:mod:`synthq.artifacts.checkpoint`) with the secret randomness each time a population is
written, so ``--resume`` continues the same noise stream.
"""

from __future__ import annotations

from dataclasses import dataclass, replace

import numpy as np

Key = tuple[str, int]  # (doc_id, index) of a candidate query
Ranked = dict[str, list[tuple[Key, float]]]  # per document: (candidate, noisy votes), best first


@dataclass(frozen=True)
class Population:
    """The candidates the next vote is over, and what the votes so far recorded.

    Args:
        candidates: ``(doc_id, index) -> query`` written by the public model.
        votes_done: votes already taken (and varied after).
        next_index: the first index the next variations of a document get.
        rounds: per vote, ``{"round", "noisy_votes_of_winners"}`` (released as metrics).
        raw_counts: per vote, the un-noised counts (private diagnostics only).
    """

    candidates: dict[Key, str]
    votes_done: int
    next_index: int
    rounds: list[dict]
    raw_counts: list[list[float]]

    @classmethod
    def first(cls, candidates: dict[Key, str], size: int) -> Population:
        """The random API's population: indices ``0 … size − 1`` per document, no vote yet."""
        return cls(candidates, votes_done=0, next_index=size, rounds=[], raw_counts=[])

    def voted(self, iteration: int, counts: np.ndarray, ranked: Ranked) -> Population:
        """The same candidates, with vote ``iteration`` recorded."""
        winners = float(sum(r[0][1] for r in ranked.values()))
        rounds = [*self.rounds, {"round": iteration, "noisy_votes_of_winners": winners}]
        return replace(self, rounds=rounds, raw_counts=[*self.raw_counts, counts.tolist()])

    def varied(self, iteration: int, candidates: dict[Key, str], added: int) -> Population:
        """The next population after vote ``iteration``: ``added`` new indices per document."""
        return replace(self, candidates=candidates, votes_done=iteration, next_index=self.next_index + added)

    def state(self) -> dict:
        """The checkpointed fields, but the candidates (stored as rows by :func:`checkpoint_state`)."""
        return {
            "votes_done": self.votes_done,
            "next_index": self.next_index,
            "rounds": self.rounds,
            "raw_counts": self.raw_counts,
        }

    @classmethod
    def from_state(cls, state: dict) -> Population:
        """The population a checkpoint holds (:func:`~synthq.artifacts.checkpoint.load_checkpoint`)."""
        candidates = {(d, int(k)): text for d, k, text in state["population"]}
        return cls(candidates, state["votes_done"], state["next_index"], state["rounds"], state["raw_counts"])


def ranked_per_document(keys: list[Key], noisy: np.ndarray) -> Ranked:
    """Per document, its candidates best first by noisy votes (ties to the lower index)."""
    ranked: dict[str, list] = {}
    for key, votes in zip(keys, noisy.tolist(), strict=True):
        ranked.setdefault(key[0], []).append((key, votes))
    return {
        doc_id: sorted(entries, key=lambda entry: (-entry[1], entry[0][1]))
        for doc_id, entries in ranked.items()
    }


def best_per_document(ranked: Ranked, candidates: dict[Key, str], count: int) -> dict[Key, str]:
    """After the last vote: each document's ``count`` best candidates."""
    return {key: candidates[key] for per_doc in ranked.values() for key, _ in per_doc[:count]}


def checkpoint_state(population: Population, randomness) -> dict:
    """What a checkpoint after the population for the next vote holds
    (:func:`~synthq.artifacts.checkpoint.save_checkpoint` adds the config and the inputs): the
    population, the rounds so far and the secret randomness (the noise of later votes continues
    its stream; a vote interrupted before the next checkpoint is redone with the same noise on the
    same population, so nothing new is released)."""
    rows = [[doc_id, index, text] for (doc_id, index), text in sorted(population.candidates.items())]
    return {**population.state(), "population": rows, "randomness": randomness.state_dict()}

"""generate's batch order: the longest batch first (memory peaks early), the others mixed so the
progress rate (and its ETA) is representative from the start; the batches themselves unchanged."""

from __future__ import annotations

from synthq.models.generator import QueryGenerator
from synthq.models.sampling import Request, length_sorted_batches


def test_mixed_order_keeps_the_batches_and_the_longest_first(tiny_causal_dir):
    generator = QueryGenerator.load(tiny_causal_dir, max_source_length=64)
    requests = [Request(f"d{n}", " ".join(["word"] * (n + 1)), 0) for n in range(40)]
    sorted_batches = length_sorted_batches(requests, generator, 4)
    mixed = length_sorted_batches(requests, generator, 4, mixed=True)
    assert mixed[0] == sorted_batches[0] and mixed[0][0].doc_id == "d39"  # longest first
    assert sorted(map(repr, mixed)) == sorted(map(repr, sorted_batches))  # the same batches
    assert mixed != sorted_batches  # but not shortest last: the rate does not drift
    assert mixed == length_sorted_batches(requests, generator, 4, mixed=True)  # a fixed order

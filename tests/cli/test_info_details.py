"""``synthq info`` shows a guarantee's parameters without internals (issue #74)."""

from __future__ import annotations


def test_info_shows_a_guarantees_parameters_in_words_without_internals():
    """Issue #74: ``synthq info`` printed ``accountant_fallback:`` (empty) and a dict's repr."""
    from synthq.cli.inspect_commands import detail_lines

    lines = detail_lines({
        "accountant_fallback": "", "sample_rate": 0.012345678, "steps": 22,
        "clipping": {"unit": "user", "bound": 8, "note": None},
        "components": [{"epsilon": 1.0}, {"epsilon": 2.0}],
    })  # fmt: skip
    assert lines == [
        "sample_rate: 0.01235",
        "steps: 22",
        "clipping: unit=user, bound=8",
        "components: 2 entries (synthq info --json lists them)",
    ]

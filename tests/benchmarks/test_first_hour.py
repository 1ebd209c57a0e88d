"""benchmarks/first_hour.py runs the guide's commands (docs/own-data.md) as written, on the shipped data."""

from __future__ import annotations

import benchmarks.first_hour as first_hour

GUIDE = """# x

## Your own data in the first hour

```python
print("not this block")
```

```bash
synthq finetune-lm --data mylog --model smollm2-135m \\
    --epsilon 8 --out runs/gen
# a comment
synthq eval --retriever runs/gen --datasets mylog --out runs/eval
synthq ledger runs/gen --statement --out runs/STATEMENT.md
```

```bash
synthq not-the-guide
```
"""


def test_the_guide_block_is_read_with_continuations_and_mapped_to_the_shipped_data():
    steps = first_hour.commands("OUT", readme=GUIDE)
    assert steps == [
        ("finetune-lm", ["finetune-lm", "--data", "embedded", "--model", "smollm2-135m", "--epsilon", "8",
                         "--out", "OUT/gen"]),
        ("eval", ["eval", "--retriever", "OUT/gen", "--datasets", "embedded", "--out", "OUT/eval"]),
        ("ledger", ["ledger", "OUT/gen", "--statement", "--out", "OUT/STATEMENT.md"]),
    ]  # fmt: skip
    quick = dict(first_hour.commands("OUT", quick=True, readme=GUIDE))
    assert quick["finetune-lm"][-2:] == ["--max-steps", "2"] and quick["eval"][-1] == "OUT/eval"


def test_the_guide_page_has_the_issue_command_and_every_step():
    names = [name for name, _ in first_hour.commands("OUT")]
    assert names[:2] == ["finetune-lm", "generate"] and "eval" in names and "ledger" in names
    assert names.count("train-retriever") + names.count("train-retriever-2") == 2  # synthetic, baseline
    (_, finetune), *_ = first_hour.commands("OUT")
    assert " ".join(finetune).startswith(
        "finetune-lm --data embedded --model smollm2-135m --lora-rank 8 --epsilon 8 --privacy-unit user "
        "--max-queries-per-user 8 --batch-size 64"
    )
    assert not any("mylog" in " ".join(arguments) for _, arguments in first_hour.commands("OUT"))


def test_peak_memory_is_read_from_time():
    report = "\tMaximum resident set size (kbytes): 3342128\n\tExit status: 0\n"
    assert first_hour._peak_from_time(report) == 3.342128

"""A bad option is refused before a stage imports torch (issue #74: ``finetune-lm --lr -1`` took 5 s
of CPU to say one line)."""

from __future__ import annotations

import subprocess
import sys

import pytest

CODE = """
import sys
from synthq.cli.errors import main
sys.argv = ["synthq", *{argv!r}]
try:
    main()
except SystemExit as exit_:
    print("status", exit_.code, "torch", "torch" in sys.modules, file=sys.stderr)
"""


@pytest.mark.parametrize(
    "argv",
    [
        ["finetune-lm", "--data", "embedded", "--model", "smollm2-135m", "--lr", "-1", "--out", "x"],
        ["generate", "--generator", "g", "--top-p", "2", "--out", "x"],
        ["report", "e", "--out", ""],
    ],
)
def test_a_bad_option_is_refused_before_torch_is_imported(tmp_path, argv):
    shown = subprocess.run([sys.executable, "-c", CODE.format(argv=argv)], capture_output=True, text=True,
                           cwd=tmp_path, timeout=120)  # fmt: skip
    assert "status 2 torch False" in shown.stderr, shown.stderr

"""What the tests of the shipped datasets (pydocs, pylibs) share: their builder script loaded as a
module, and each query's user."""

from __future__ import annotations

import importlib.util
import json
import sys
from pathlib import Path

DATA = Path(__file__).resolve().parents[2] / "data"


def load_builder(name: str):
    """``data/<name>.py`` as a module (it defines functions only: building needs its main())."""
    sys.path.insert(0, str(DATA))  # a builder may import another (pylibs reuses pydocs' recipe)
    spec = importlib.util.spec_from_file_location(name, DATA / f"{name}.py")
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


def query_users(root: Path) -> dict[str, str]:
    """query id -> ``metadata.user_id`` of a dataset's queries file."""
    rows = (Path(root) / "queries.jsonl").read_text(encoding="utf-8").splitlines()
    return {r["_id"]: r["metadata"]["user_id"] for r in map(json.loads, rows)}

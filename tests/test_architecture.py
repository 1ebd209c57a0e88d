"""The map in docs/ARCHITECTURE.md, enforced: the dependency rules read off every import of
synthq (lazy ones inside functions included), so a new arrow that runs back up fails here
instead of in a review.

The import graph is taken per package: ``privacy/`` (guarantees, the accountant, keys, digests)
sits below ``artifacts/``, and ``bookkeeping/`` (what composes and reports releases, opening manifests)
above it, so no package is two layers. No arrow runs back up; :data:`KNOWN_BACK_ARROWS` stays empty.
"""

from __future__ import annotations

import ast
from collections import defaultdict
from pathlib import Path

import pytest

PACKAGE = Path(__file__).resolve().parents[1] / "synthq"
KNOWN_BACK_ARROWS: set[tuple[str, str]] = set()  # none left; a new one needs a reason here


def _modules() -> dict[str, Path]:
    modules = {}
    for path in PACKAGE.rglob("*.py"):
        name = ".".join(path.relative_to(PACKAGE.parent).with_suffix("").parts)
        modules[name.removesuffix(".__init__")] = path
    return modules


MODULES = _modules()


def _imports(path: Path, top_level_only: bool = False) -> list[str]:
    """The modules ``path`` imports (``from a.b import c`` is ``a.b.c`` when that is a module)."""
    tree = ast.parse(path.read_text(encoding="utf-8"))
    nodes = tree.body if top_level_only else ast.walk(tree)
    found = []
    for node in nodes:
        if isinstance(node, ast.ImportFrom) and node.module and node.level == 0:
            found += [
                f"{node.module}.{alias.name}" if f"{node.module}.{alias.name}" in MODULES else node.module
                for alias in node.names
            ]
        elif isinstance(node, ast.Import):
            found += [alias.name for alias in node.names]
    return found


def _unit(module: str) -> str | None:
    parts = module.split(".")
    if parts[0] != "synthq":
        return None
    return "synthq" if len(parts) == 1 else parts[1]


def _arrows() -> list[tuple[str, str, str, str]]:
    """(source unit, target unit, importing module, imported module) for every cross-unit import."""
    arrows = []
    for module, path in MODULES.items():
        source = _unit(module)
        for imported in _imports(path):
            target = _unit(imported)
            if target is not None and target != source:
                arrows.append((source, target, module, imported))
    return arrows


def _cycles(graph: dict[str, set[str]]) -> list[list[str]]:
    """Strongly connected components of more than one unit (Tarjan)."""
    index, low, stack, on_stack, found = {}, {}, [], set(), []

    def visit(node: str) -> None:
        index[node] = low[node] = len(index)
        stack.append(node)
        on_stack.add(node)
        for other in graph.get(node, ()):
            if other not in index:
                visit(other)
                low[node] = min(low[node], low[other])
            elif other in on_stack:
                low[node] = min(low[node], index[other])
        if low[node] == index[node]:
            component = []
            while True:
                top = stack.pop()
                on_stack.discard(top)
                component.append(top)
                if top == node:
                    break
            if len(component) > 1:
                found.append(sorted(component))

    for node in list(graph):
        if node not in index:
            visit(node)
    return found


def test_the_import_graph_has_no_cycle_but_the_known_back_arrows():
    arrows = _arrows()
    graph: dict[str, set[str]] = defaultdict(set)
    for source, target, module, imported in arrows:
        if (module, imported) not in KNOWN_BACK_ARROWS:
            graph[source].add(target)
    cycles = _cycles(graph)
    detail = [
        f"{module} -> {imported}"
        for cycle in cycles
        for source, target, module, imported in arrows
        if source in cycle and target in cycle and (module, imported) not in KNOWN_BACK_ARROWS
    ]
    assert not cycles, f"import cycles {cycles}: " + "; ".join(detail)
    present = {(module, imported) for _, _, module, imported in arrows}
    gone = KNOWN_BACK_ARROWS - present
    assert not gone, f"these back arrows are gone: remove them from KNOWN_BACK_ARROWS: {sorted(gone)}"


@pytest.mark.parametrize(
    ("lower", "never"),
    [
        ("runtime", {"config", "data", "models", "dp", "privacy", "artifacts", "retrieval", "audit",
                     "reporting", "stages", "pipeline", "cli", "search"}),
        ("privacy", {"artifacts", "bookkeeping", "config", "models", "dp", "retrieval", "audit", "reporting",
                     "stages", "pipeline", "cli", "search"}),
        ("artifacts", {"bookkeeping", "models", "dp", "retrieval", "audit", "reporting", "stages", "pipeline",
                       "cli", "search"}),
        ("bookkeeping", {"dp", "retrieval", "audit", "reporting", "stages", "pipeline", "cli", "search"}),
        ("models", {"dp", "stages", "pipeline", "cli"}),
        ("dp", {"stages", "pipeline", "cli", "reporting"}),
        ("data", {"dp", "models", "stages", "pipeline", "cli", "reporting", "retrieval", "audit"}),
        ("retrieval", {"stages", "pipeline", "cli"}),
        ("audit", {"stages", "pipeline", "cli"}),
        ("reporting", {"stages", "pipeline", "cli"}),
        ("stages", {"pipeline", "cli"}),
    ],
)  # fmt: skip
def test_a_lower_package_never_imports_a_higher_one(lower, never):
    wrong = [
        f"{module} -> {imported}"
        for _, target, module, imported in _arrows()
        if module.split(".")[1:2] == [lower]
        and target.split(".")[0] in never | {"api"}
        and (module, imported) not in KNOWN_BACK_ARROWS
    ]
    assert not wrong, "\n".join(wrong)


def test_the_guarantee_imports_nothing_of_synthq_and_one_stage_never_imports_another():
    assert not [m for m in _imports(MODULES["synthq.privacy.guarantee"]) if m.startswith("synthq")]
    crossing = []
    for module, path in MODULES.items():
        parts = module.split(".")
        if len(parts) < 3 or parts[1] != "stages":
            continue
        for imported in _imports(path):
            other = imported.split(".")
            if len(other) > 2 and other[1] == "stages" and other[2] != parts[2]:
                crossing.append(f"{module} -> {imported}")
    assert not crossing, "\n".join(crossing)


def test_only_the_package_root_reaches_the_python_api():
    """``synthq.api`` is the top: the stages as functions, re-exported lazily by ``synthq``."""
    users = {module for _, target, module, _ in _arrows() if target == "api"}
    assert users == {"synthq"}


def test_cli_and_config_import_no_heavy_library_at_module_level():
    heavy = ("torch", "numpy", "transformers", "opacus", "scipy", "pandas")
    wrong = [
        f"{module} -> {imported}"
        for module, path in MODULES.items()
        if module.split(".")[1:2] in (["cli"], ["config"])
        for imported in _imports(path, top_level_only=True)
        if imported.split(".")[0] in heavy
    ]
    assert not wrong, "\n".join(wrong)


def test_benchmarks_import_nothing_of_the_tests():
    """``benchmarks/`` (the GPU check above all, which runs on a bare machine) builds its tiny models
    and its ground truth from ``benchmarks/tiny.py``; the tests may import benchmarks, never the
    other way round."""
    offenders = []
    for path in sorted((PACKAGE.parent / "benchmarks").glob("*.py")):
        found = [m for m in _imports(path) if m == "tests" or m.startswith("tests.")]
        offenders += [f"{path.name} imports {m}" for m in found]
    assert not offenders, offenders


def test_every_stage_is_a_recipe_of_named_phases():
    """A registered stage's ``run`` reads as named phases, at most 40 lines (docs/development.md,
    "Adding a stage"); the work lives in the functions it names."""
    from synthq.config.registry import STAGES

    long = {}
    for name, entry in STAGES.items():
        path = MODULES[entry.module]
        tree = ast.parse(path.read_text(encoding="utf-8"))
        run = next(n for n in tree.body if isinstance(n, ast.FunctionDef) and n.name == "run")
        if (lines := run.end_lineno - run.lineno + 1) > 40:
            long[name] = lines
    assert not long, f"run() longer than 40 lines: {long}"

"""The docs site's generated parts (docs/gen_pages.py) cover what they claim to, without MkDocs:
every command and every option of the Typer app gets a row and a page that holds it up to date, the
reproducing page lists every pipeline with its expected figures, and the nav and the relative
links between pages point at files that exist."""

from __future__ import annotations

import importlib.util
import re
import subprocess
from pathlib import Path

import pytest
import yaml

ROOT = Path(__file__).resolve().parents[1]
DOCS = ROOT / "docs"


@pytest.fixture(scope="module")
def gen():
    spec = importlib.util.spec_from_file_location("gen_pages", DOCS / "gen_pages.py")
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


def _click_commands() -> dict:
    """Every leaf command of the app by full name, walked here independently of gen_pages."""
    import typer.main

    from synthq.cli.app import app

    found = {}
    stack = [("", typer.main.get_command(app))]
    while stack:
        prefix, group = stack.pop()
        for name, command in group.commands.items():
            if getattr(command, "commands", None) is not None:
                stack.append((f"{prefix}{name} ", command))
            elif not command.hidden:
                found[prefix + name] = command
    return found


def test_every_command_and_option_has_a_row(gen):
    commands = _click_commands()
    pages = gen.cli_pages()
    assert set(pages) == {f"cli/{name.replace(' ', '-')}.md" for name in commands} | {"cli/global.md"}
    for name, command in commands.items():
        table = pages[f"cli/{name.replace(' ', '-')}.md"]
        rows = [line for line in table.splitlines() if line.startswith("| ")]
        rows = [line for line in rows if not line.startswith("| option")]
        visible = [p for p in command.params if not p.hidden]
        assert len(rows) == len(visible), name
        context = command.make_context(name.split()[-1], [], resilient_parsing=True)
        for param, row in zip(visible, rows, strict=True):
            if param.param_type_name == "argument":
                assert f"`{param.get_help_record(context)[0]}` (argument)" in row, (name, param.name)
                continue
            for option in [*param.opts, *param.secondary_opts]:
                assert f"`{option}`" in row, (name, option)


def test_option_rows_carry_default_choices_and_range(gen):
    table = gen.cli_pages()["cli/finetune-lm.md"]
    epsilon = next(line for line in table.splitlines() if line.startswith("| `--epsilon`"))
    assert "`8.0`" in epsilon and "Range: &gt; 0." in epsilon
    accountant = next(line for line in table.splitlines() if line.startswith("| `--accountant`"))
    assert "`rdp` `prv`" in accountant and "`rdp` |" in accountant
    out = next(line for line in table.splitlines() if line.startswith("| `--out`"))
    assert "| required |" in out


def test_every_generated_part_is_in_a_page_and_up_to_date(gen):
    """The options tables and the reproducing list are written into the pages themselves (so they
    read on GitHub too, where an include line would show raw): every one is in some page, and every
    page's blocks are what docs/gen_pages.py writes now."""
    generated = gen.pages()
    pages = {path: path.read_text(encoding="utf-8") for path in gen.source_pages()}
    text = "\n".join(pages.values())
    rerun = "run python docs/gen_pages.py"
    for name, body in generated.items():
        assert gen.block(name, body) in text, f"generated/{name}: in no page, or stale; {rerun}"
    for path, page in pages.items():
        assert not re.search(r"^--8<--", page, re.MULTILINE), f"{path}: an include line; {rerun}"
        assert gen.inline_blocks(page, generated) == page, f"{path}: a stale block; {rerun}"


def test_the_reproducing_page_lists_every_pipeline(gen):
    page = gen.reproducing_page()
    pipelines = sorted(ROOT.glob("pipelines/**/*.yaml"))
    assert pipelines
    for path in pipelines:
        relative = path.relative_to(ROOT).as_posix()
        assert f"`synthq run {relative}`" in page, relative
        data = yaml.safe_load(path.read_text(encoding="utf-8"))
        for entry in data.get("expected") or []:
            assert " | ".join(gen.expectation(entry)) in page, (relative, entry)
    assert "Issue " not in page and "issue " not in page


def test_expected_figures_read_as_bounds(gen):
    assert gen.expectation({"stage": "s", "metric": ["a", "ndcg@10"], "value": 0.5, "tolerance": 0.01}) == (
        "`s`",
        "`a › ndcg@10`",
        "0.5 ± 0.01",
    )
    assert gen.expectation({"stage": "s", "metric": ["a"], "min": 0.07, "max": 0.15})[2] == "0.07 … 0.15"
    assert gen.expectation({"stage": "s", "metric": ["a"], "max": 0.05})[2] == "≤ 0.05"


def _nav_files(nav) -> list[str]:
    files = []
    for item in nav:
        value = next(iter(item.values())) if isinstance(item, dict) else item
        files += _nav_files(value) if isinstance(value, list) else [value]
    return files


def test_the_nav_holds_every_page_and_every_relative_link_resolves():
    config = yaml.safe_load((ROOT / "mkdocs.yml").read_text(encoding="utf-8"))
    nav = _nav_files(config["nav"])
    pages = {p.relative_to(DOCS).as_posix() for p in DOCS.rglob("*.md") if "generated" not in p.parts}
    # one name per page, whatever the case: a case-insensitive file system (macOS, Windows) would
    # let one overwrite the other at clone time
    tracked = subprocess.run(["git", "ls-files"], cwd=ROOT, capture_output=True, text=True).stdout.split()
    lowered = [path.lower() for path in tracked]
    assert len(lowered) == len(set(lowered)), "two tracked paths differ only in case"
    assert sorted(nav) == sorted(pages)
    for page in pages:
        text = (DOCS / page).read_text(encoding="utf-8")
        text = re.sub(r"```.*?```", "", text, flags=re.S)
        for target in re.findall(r"\]\(([^)#\s]+)(?:#[^)]*)?\)", text):
            if "://" in target:
                continue
            assert ((DOCS / page).parent / target).resolve().is_file(), (page, target)

"""Generate the parts of the docs that must not drift from the code (run by ``make docs`` before
``mkdocs build --strict``), and write them into the pages that show them, so every page reads the
same on GitHub as on the site.

* every command's options table, read from the Typer app's click command tree
  (``typer.main.get_command(synthq.cli.app.app)``), the same objects that ``synthq COMMAND --help``
  prints;
* the reproducing list: one entry per pipeline file under ``pipelines/``: the command, what its
  header comment says it does and needs, and the figures it should reproduce (its ``expected:``
  block, checked by ``synthq run --check``; a paper pipeline's ``paper:`` block, the numbers the
  paper reports).

Each is written to ``docs/generated/<name>`` (not kept in git) and into every page between the
markers ``<!-- generated/<name>: start -->`` and ``<!-- generated/<name>: end -->`` (a page asks
for one with those two lines, or with a line ``--8<-- "generated/<name>"``, which is replaced by
them). ``tests/test_docs.py`` fails when a page's block is not what this script writes.

    python docs/gen_pages.py [--out docs/generated]
"""

from __future__ import annotations

import argparse
import re
import shutil
import sys
from pathlib import Path
from typing import Any

import yaml

ROOT = Path(__file__).resolve().parents[1]
GENERATED = ROOT / "docs" / "generated"
PIPELINES = ROOT / "pipelines"

# ----------------------------------------------------------------------------- command line


def command_tree() -> tuple[Any, dict[str, Any]]:
    """The root click command and every leaf command by its full name (``data info``), in the
    order ``synthq --help`` lists them."""
    sys.path.insert(0, str(ROOT))
    import typer.main

    from synthq.cli.app import app

    root = typer.main.get_command(app)
    leaves: dict[str, Any] = {}

    def walk(group: Any, prefix: str) -> None:
        for name, command in group.commands.items():
            if command.hidden:
                continue
            if getattr(command, "commands", None) is not None:
                walk(command, f"{prefix}{name} ")
            else:
                leaves[prefix + name] = command

    walk(root, "")
    return root, leaves


def visible_params(command: Any) -> list[Any]:
    return [p for p in command.params if not p.hidden]


# The bracketed notes click and synthq append to a help text: [default: 8.0], [required],
# [range: > 0], and click's own range of a typed option, [x>=1].
_TAG = re.compile(r"\s*\[(?:(default|range):\s*([^\[\]]*)|(required)|(x[<>=][^\[\]]*))\]\s*$")


def _split_help(text: str) -> tuple[str, dict[str, str]]:
    """``help  [range: > 0]  [default: 8.0]`` -> (``help``, {"range": "> 0", "default": "8.0"})."""
    tags: dict[str, str] = {}
    while (match := _TAG.search(text)) is not None:
        kind, value, required, click_range = match.groups()
        if required:
            tags["required"] = ""
        elif click_range:
            tags["range"] = click_range.replace("x>=", "≥ ").replace("x<=", "≤ ")
        else:
            tags[kind] = value.strip()
        text = text[: match.start()]
    return text.strip(), tags


def _escape(text: str) -> str:
    """Help text as markdown table cell text: code spans kept, ``<``, ``|`` and ``*`` escaped."""
    parts = re.split(r"(`[^`]*`)", text.replace("\n", " "))
    out = []
    for index, part in enumerate(parts):
        if index % 2:  # a code span
            out.append(part.replace("|", "\\|"))
        else:
            out.append(
                part.replace("&", "&amp;").replace("<", "&lt;").replace(">", "&gt;")
                .replace("|", "\\|").replace("*", "\\*").replace("_", "\\_")
            )  # fmt: skip
    return "".join(out)


def param_names(param: Any) -> list[str]:
    """What a user types: every option string, or an argument's metavar (``DIR...``)."""
    if param.param_type_name == "argument":
        return []
    return [*param.opts, *param.secondary_opts]


def param_row(param: Any, context: Any) -> tuple[str, str, str, str]:
    """(option, value, default, description) of one parameter, from its ``--help`` record."""
    record = param.get_help_record(context)
    declaration, help_text = record or (param.name, param.help or "")
    description, tags = _split_help(help_text or "")
    names = param_names(param)
    if param.param_type_name == "argument":
        option = f"`{declaration}` (argument)"
        value = ""
    else:
        option = ", ".join(f"`{name}`" for name in names)
        if param.is_flag:
            value = "flag"
        else:
            last = names[-1]
            shown = declaration[declaration.index(last) + len(last) :].strip() if last in declaration else ""
            if shown.startswith("<") and shown.endswith(">"):  # a Literal's choices: <rdp|prv>
                value = " ".join(f"`{choice}`" for choice in shown[1:-1].split("|"))
            else:
                value = f"`{shown}`" if shown else ""
    if "range" in tags:
        description += f" Range: {tags['range']}."
    if "required" in tags:
        default = "required"
    elif "default" in tags:
        default = f"`{tags['default']}`" if tags["default"] else ""
    elif param.param_type_name != "argument" and param.is_flag:
        default = "off"
    else:
        default = "—"
    return option, value, default, _escape(description)


def options_table(name: str, command: Any) -> str:
    """The markdown table of a command's options, after its one-line usage and help."""
    context = command.make_context(name.split()[-1], [], resilient_parsing=True)
    usage = " ".join(["synthq", name, *command.collect_usage_pieces(context)])
    summary = (command.help or "").strip().split("\n\n")[0].replace("\n", " ")
    lines = [
        f"<!-- generated by docs/gen_pages.py from `synthq {name} --help`; do not edit -->",
        "",
        "```text",
        usage,
        "```",
        "",
        _escape(summary),
        "",
        *_options_rows(command, context),
    ]
    return "\n".join(lines) + "\n"


def _options_rows(command: Any, context: Any) -> list[str]:
    """The options table of a click command: header, then one row per visible option."""
    rows = ["| option | value | default | description |", "|---|---|---|---|"]
    return rows + ["| " + " | ".join(param_row(param, context)) + " |" for param in visible_params(command)]


def global_options_table(root: Any) -> str:
    context = root.make_context("synthq", [], resilient_parsing=True)
    lines = [
        "<!-- generated by docs/gen_pages.py from `synthq --help`; do not edit -->",
        "",
        *_options_rows(root, context),
    ]
    return "\n".join(lines) + "\n"


def command_file(name: str) -> str:
    """``data info`` -> ``data-info.md``."""
    return name.replace(" ", "-") + ".md"


def cli_pages() -> dict[str, str]:
    """Relative path under ``docs/generated`` -> text, for every command and the global options."""
    root, leaves = command_tree()
    pages = {f"cli/{command_file(name)}": options_table(name, command) for name, command in leaves.items()}
    pages["cli/global.md"] = global_options_table(root)
    return pages


# ----------------------------------------------------------------------------- pipelines


def pipeline_files() -> list[Path]:
    """Every pipeline under ``pipelines/``: the demo first, then the study, the strong start, any
    other top-level one, then the paper's."""
    order = {"demo.yaml": 0, "study.yaml": 1, "strong-start.yaml": 2}
    top = sorted(PIPELINES.glob("*.yaml"), key=lambda p: (order.get(p.name, 3), p.name))
    return top + sorted(p for p in PIPELINES.rglob("*.yaml") if p.parent != PIPELINES)


def header(path: Path) -> list[str]:
    """The comment lines before the first YAML key, without ``# ``."""
    lines = []
    for line in path.read_text(encoding="utf-8").splitlines():
        if not line.startswith("#"):
            break
        lines.append(line[1:].removeprefix(" ").rstrip())
    return lines


_ISSUE = re.compile(r"\b[Ii]ssue #?\d+'s\s+")


_README = (("the README's multi-GPU section", "the Scaling page"), ('README "Results"', '"Results"'))


def _scrub(text: str) -> str:
    """No internal issue numbers on the site (``Issue 31's strong start`` -> ``The strong start``),
    and the README's long sections named by the pages they moved to."""
    for old, new in _README:
        text = text.replace(old, new)
    return _ISSUE.sub(lambda m: "The " if m.group(0)[0] == "I" else "the ", text)


def describe(path: Path) -> dict[str, Any]:
    """Command, run-time note, description paragraphs and hardware of one pipeline file."""
    lines = header(path)
    relative = path.relative_to(ROOT).as_posix()
    command = f"synthq run {relative}"
    note = ""
    if lines and lines[0].startswith("synthq run"):
        rest = lines[0][len("synthq run") :].strip()
        rest = rest.split(None, 1)[1] if " " in rest else ""
        note = rest.strip().removeprefix("(").removesuffix(")")
        lines = lines[1:]
    paragraphs: list[str] = []
    current: list[str] = []
    for line in [*lines, ""]:
        if line.strip():
            current.append(line)
        elif current:
            paragraphs.append("\n".join(current))
            current = []
    text = _scrub(" ".join(" ".join(p.split()) for p in paragraphs))
    hardware = ""
    match = re.search(r"Hardware:\s*(.*)", text)
    if match:
        sentences = re.split(r"(?<=[.;])\s+(?=[A-Z])", match.group(1))
        keep = [sentences[0]]
        for sentence in sentences[1:]:
            if not re.search(r"GPU|TPU|CPU|hour|day|laptop|minute|GB|core", sentence):
                break
            keep.append(sentence)
        hardware = " ".join(keep)
        hardware = hardware[:1].upper() + hardware[1:]
    elif note:
        hardware = note
    data = yaml.safe_load(path.read_text(encoding="utf-8")) or {}
    return {
        "path": relative,
        "command": command,
        "note": note,
        "paragraphs": [_scrub(p) for p in paragraphs],
        "hardware": hardware,
        "stages": len(data.get("stages") or []),
        "expected": data.get("expected") or [],
        "paper": data.get("paper") or [],
    }


def _number(value: Any) -> str:
    return (
        "∞"
        if isinstance(value, float) and value == float("inf")
        else f"{value:g}"
        if isinstance(value, float)
        else str(value)
    )


def expectation(entry: dict) -> tuple[str, str, str]:
    """(stage, metric, expected) of one ``expected:`` figure."""
    metric = entry.get("metric")
    metric_text = " › ".join(str(m) for m in metric) if isinstance(metric, list) else str(metric)
    if "value" in entry:
        bound = f"{_number(entry['value'])} ± {_number(entry.get('tolerance', 0))}"
    elif "min" in entry and "max" in entry:
        bound = f"{_number(entry['min'])} … {_number(entry['max'])}"
    elif "min" in entry:
        bound = f"≥ {_number(entry['min'])}"
    elif "max" in entry:
        bound = f"≤ {_number(entry['max'])}"
    else:
        bound = "—"
    return f"`{entry.get('stage', '?')}`", f"`{metric_text}`", bound


def _paper_rows(rows: list[dict]) -> list[str]:
    keys: list[str] = []
    for row in rows:
        keys += [k for k in row if k not in keys]
    lines = ["| " + " | ".join(keys) + " |", "|" + "---|" * len(keys)]
    for row in rows:
        cells = [_number(row.get(k, "")) if row.get(k) is not None else "" for k in keys]
        lines.append("| " + " | ".join(_escape(c) for c in cells) + " |")
    return lines


def _anchor(path: str) -> str:
    return re.sub(r"[^a-z0-9]+", "-", path.lower()).strip("-")


def reproducing_page() -> str:
    entries = [describe(p) for p in pipeline_files()]
    lines = [
        "<!-- generated by docs/gen_pages.py from pipelines/**/*.yaml; do not edit -->",
        "",
        "| pipeline | command | needs | what it should reproduce |",
        "|---|---|---|---|",
    ]
    for entry in entries:
        if entry["expected"]:
            figures = f"{len(entry['expected'])} figures, checked by `--check`"
        elif entry["paper"]:
            figures = f"the paper's {len(entry['paper'])} reported numbers, printed beside ours"
        else:
            figures = "—"
        lines.append(
            f"| [`{entry['path']}`](#{_anchor(entry['path'])}) | `{entry['command']}` | "
            f"{_escape(entry['hardware']) or '—'} | {figures} |"
        )
    for entry in entries:
        lines += ["", f"### `{entry['path']}` {{ #{_anchor(entry['path'])} }}", ""]
        lines += ["```bash", entry["command"] + (" --check" if entry["expected"] else ""), "```", ""]
        if entry["note"]:
            lines += [f"*{_escape(entry['note'])}* · {entry['stages']} stages", ""]
        else:
            lines += [f"{entry['stages']} stages", ""]
        for paragraph in entry["paragraphs"]:
            if re.search(r"^\s{2,}\S", paragraph, re.M) or "\n" in paragraph and " - " in paragraph:
                lines += ["```text", paragraph, "```", ""]
            else:
                lines += [_escape(" ".join(paragraph.split())), ""]
        if entry["expected"]:
            lines += [
                "Expected figures (`synthq run --check` prints `ok` or `REGRESSION` for each and exits 1 "
                "on any regression):",
                "",
                "| stage | metric | expected |",
                "|---|---|---|",
            ]
            lines += ["| " + " | ".join(expectation(e)) + " |" for e in entry["expected"]]
            lines.append("")
        if entry["paper"]:
            lines += ["The paper's reported numbers (`synthq report --paper` prints them beside ours):", ""]
            lines += _paper_rows(entry["paper"])
            lines.append("")
    return "\n".join(lines).rstrip() + "\n"


# ----------------------------------------------------------------------------- main


def pages() -> dict[str, str]:
    """Every generated file: relative path under ``docs/generated`` -> text."""
    return {**cli_pages(), "reproducing.md": reproducing_page()}


_BLOCK = re.compile(
    r'^(?:--8<-- "generated/(?P<include>[^"]+)"|<!-- generated/(?P<name>\S+): start -->\n.*?'
    r"^<!-- generated/(?P=name): end -->)$",
    re.MULTILINE | re.DOTALL,
)


def block(name: str, text: str) -> str:
    """The generated file ``name`` as a page holds it, between its two markers."""
    return f"<!-- generated/{name}: start -->\n{text.rstrip()}\n<!-- generated/{name}: end -->"


def inline_blocks(page: str, generated: dict[str, str]) -> str:
    """``page`` with every generated block (or ``--8<--`` include) holding the current text."""

    def fresh(match: re.Match) -> str:
        name = match.group("include") or match.group("name")
        if name not in generated:
            raise KeyError(f"a page asks for generated/{name}, which docs/gen_pages.py does not write")
        return block(name, generated[name])

    return _BLOCK.sub(fresh, page)


def source_pages() -> list[Path]:
    """The hand-written pages (every ``docs/**/*.md`` outside ``docs/generated``)."""
    return sorted(p for p in (ROOT / "docs").rglob("*.md") if GENERATED not in p.parents)


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--out", type=Path, default=GENERATED)
    args = parser.parse_args(argv)
    if args.out.exists():
        shutil.rmtree(args.out)
    written = pages()
    for relative, text in written.items():
        target = args.out / relative
        target.parent.mkdir(parents=True, exist_ok=True)
        target.write_text(text, encoding="utf-8")
    updated = []
    for page in source_pages():
        old = page.read_text(encoding="utf-8")
        new = inline_blocks(old, written)
        if new != old:
            page.write_text(new, encoding="utf-8")
            updated.append(page.relative_to(ROOT).as_posix())
    print(f"{len(written)} pages -> {args.out}; blocks brought up to date in {len(updated)} page(s)")


if __name__ == "__main__":
    main()

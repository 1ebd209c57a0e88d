"""The performance table of the docs site (``docs/performance.md``), generated from
``benchmarks/results.json`` (see
:mod:`benchmarks.collect`): each row's ratio comes from ONE benchmark run that measured both
sides, next to the anchor issue #18 compares it with and the aim.

    python benchmarks/readme_table.py [benchmarks/results.json] [--page docs/performance.md]

The table replaces the text between ``<!-- bench-table:start -->`` and ``<!-- bench-table:end -->``
in that page (the README links to it).
"""

from __future__ import annotations

import argparse
import json
from pathlib import Path

START, END = "<!-- bench-table:start -->", "<!-- bench-table:end -->"

# The anchors: other implementations measured on the same 2-core machine (issue #18), not here.
ANCHORS = {
    "full": "Opacus as shipped 2.18×; published book-keeping ≈ 1.2×",
    "lora": "Opacus per-sample hooks, same LoRA model: 1.07×",
    "group": "naive 8-backward group clipping 4.3×",
    "sample": "vmap per-query DP-SGD 36–47×",
}


def _guide_data(record: dict) -> str:
    """Which shipped log a first-hour record ran on (its ``model`` tag; the embedded one without)."""
    if record.get("model") == "pylibs-long":
        return "long documents (`data/pylibs-long`: 622 documents, p95 696 tokens)"
    return f"`{record['model']}`" if "model" in record else "data"


def conditions(payload: dict | None, latest: str | None = None) -> str:
    """The run's conditions: 1-minute load average at its end, timed steps, threads of its rows."""
    if not payload:
        return ""
    parts = []
    load = payload.get("load_average", [None])[0]
    if load is not None:
        parts.append(f"load {load:.1f}")
    if "steps" in payload:
        parts.append(f"{payload['steps']} timed step(s) each")
    threads = {row.get("threads") for row in payload.get("results", {}).values() if isinstance(row, dict)}
    threads.discard(None)
    if threads:
        parts.append(f"{'/'.join(map(str, sorted(threads)))} thread(s)")
    measured = payload.get("measured") or {}
    if measured.get("at") and measured["at"][:10] != (latest or "")[:10]:  # another day's run
        parts.append(f"measured {measured['at'][:10]} on {measured.get('cpu') or '?'}")
    return ", ".join(parts)


def _ratio(results: dict, row: str, memory: bool = True) -> str | None:
    value = results.get(row)
    if value is None:
        return None
    text = f"{value['time_ratio']:.2f}× time"
    if memory and "memory_ratio" in value:
        text += f", {value['memory_ratio']:.2f}× memory"
        if "live_memory_ratio" in value:
            text += f" ({value['live_memory_ratio']:.2f}× live)"
    base = results[value["baseline"]]
    return f"{text} ({base['median_step_seconds']:.2f} → {value['median_step_seconds']:.2f} s)"


def rows(results: dict) -> list[tuple[str, str, str, str, str]]:
    """``(work, measured, anchor, aim, conditions)`` for every benchmark present; a row measured
    in an earlier run than the latest says when and on which CPU."""
    benchmarks = results.get("benchmarks", {})

    def _load(payload: dict | None) -> str:
        return conditions(payload, results.get("collected"))

    out = []
    for finetune in [v for k, v in benchmarks.items() if k.startswith("finetune_step[smollm2-135m")]:
        shape = f"batch {finetune['batch']} × {finetune['tokens']} tokens"
        lora = next((k for k in finetune["results"] if k.startswith("dp_ghost_lora")), None)
        full = _ratio(finetune["results"], "dp_ghost_full")
        if full:
            out.append(
                (f"finetune-lm DP step (ghost) vs non-private, full SmolLM2-135M, {shape}", full,
                 ANCHORS["full"], "≤ 1.10× time, ≤ 1.15× memory", _load(finetune))
            )  # fmt: skip
        if lora:
            rank = lora.removeprefix("dp_ghost_lora")
            out.append(
                (f"finetune-lm DP step (ghost) vs non-private, LoRA r = {rank} all-linear, {shape}",
                 _ratio(finetune["results"], lora), ANCHORS["lora"], "≤ 1.05×", _load(finetune))
            )  # fmt: skip
    for phases in [v for k, v in benchmarks.items() if k.startswith("finetune_phases[")]:
        shape = f"batch {phases['batch']} × {phases['tokens']} tokens"
        for kind, sides in phases["results"].items():
            plain, dp = sides["non_private"], sides["dp"]
            trained = "full" if kind == "full" else kind.replace("lora", "LoRA r = ")
            measured = (
                f"forward {plain['forward']:.2f} → {dp['forward']:.2f}; backward {plain['backward']:.2f} → "
                f"{dp['backward']:.2f} (norm pass) + {dp['clipped_sum']:.2f} (clipped sum); "
                f"noise {dp['noise']:.2f}; optimizer {plain['optimizer']:.2f} → {dp['optimizer']:.2f}; "
                f"step {plain['step']:.2f} → {dp['step']:.2f}"
            )
            label = (
                f"finetune-lm step by phase (s), non-private → ghost DP, {trained} {phases['model']}, {shape}"
            )
            out.append((label, measured, "—", "—", _load(phases)))
    for noise in [v for k, v in benchmarks.items() if k.startswith("dp_noise[")]:
        found = noise["results"]
        out.append(
            (f"DP noise of one step, {found['coordinates'] / 1e6:.0f} M coordinates ({noise['model']}): "
             "parallel seeded streams vs one generator, a fresh tensor per parameter",
             f"{found['speedup']:.2f}× faster ({found['seconds']['one_generator_fresh_tensors']:.2f} → "
             f"{found['seconds']['engine_streams']:.2f} s)", "—", "—", _load(noise))
        )  # fmt: skip
    for retriever in [v for k, v in benchmarks.items() if k.startswith("retriever_step[")]:
        found = retriever["results"]
        batch = retriever["batch"]
        for mode, label, anchor, aim in (
            ("group", "`--dp group`, one pass for all groups", "group", "≤ 1.15×"),
            ("group_loop", "`--dp group`, one backward pass per group", "group", "≤ 1.15×"),
            (
                "sample",
                "`--dp sample` as run on CPU: query side one pass per chunk, documents a backward "
                "pass per query",
                "sample",
                "≤ 8×",
            ),
            (
                "sample_loop",
                "`--dp sample` without its encoder, a backward pass per query through the whole batch",
                "sample",
                "≤ 8×",
            ),
            (
                "sample_vmap",
                "`--dp sample`, documents' passes vmapped, query side one pass per chunk "
                "(accelerators' path)",
                "sample",
                "≤ 8×",
            ),
        ):
            measured = _ratio(found, f"{mode}@{batch}")
            if measured:
                out.append(
                    (f"train-retriever {label} vs non-private, MiniLM-L6, B = {batch}"
                     + (f", S = {retriever['group_size']}" if mode.startswith("group") else ""), measured,
                     ANCHORS[anchor], aim, _load(retriever))
                )  # fmt: skip
    for generate in [v for k, v in benchmarks.items() if k.startswith("generate_throughput[")]:
        for mode, values in generate["results"].items():
            batched = values.get("batched")
            if batched:
                out.append(
                    (f"generate, {mode}: batched sampler vs one document at a time (HF `generate`), "
                     f"{generate['prompts']} documents, batch {generate['batch']}",
                     f"{batched['speedup']:.2f}× faster ({batched['documents_per_second']:.2f} docs/s)",
                     "—", "—", _load(generate))
                )  # fmt: skip
    for evolve in [v for k, v in benchmarks.items() if k.startswith("evolve_prompts[")]:
        found = evolve["results"]
        out.append(
            (f"evolve generation: the few-shot prefix ({found['common_prefix_tokens']} of "
             f"{found['prompt_tokens']} tokens) prefilled once vs every prompt whole"
             + (", and rows dropped from the batch once they have their query vs kept to the last step"
                if "rows_kept" in found["seconds"] else "")
             + f", {evolve['batch']} prompts",
             f"{found['speedup']:.2f}× faster ({found['seconds']['whole_prompts']:.1f} → "
             f"{found['seconds']['prefix_once']:.1f} s)"
             + (f"; {found['speedup_rows_dropped']:.2f}× ({found['seconds']['rows_kept']:.1f} → "
                f"{found['seconds']['prefix_once']:.1f} s)" if "rows_kept" in found["seconds"] else "")
             + f"; same queries: {found['same_queries']}",
             "—", "—", _load(evolve))
        )  # fmt: skip
    for canary in [v for k, v in benchmarks.items() if k.startswith("canary_scoring[")]:
        out.append(
            ("canary-audit scoring: shared prefix once vs pair by pair",
             f"{canary['results']['speedup']:.2f}× faster", "—", "—", _load(canary))
        )  # fmt: skip
    for startup in [v for k, v in benchmarks.items() if k.startswith("cli_startup")]:
        for command, values in startup["results"].items():
            label = f"synthq {command}" if command not in ("version", "help") else f"synthq --{command}"
            out.append(
                (f"command-line start: `{label}` (fresh process, caches warm)",
                 f"{values['median_seconds']:.2f} s", "gh, ruff, uv: instant",
                 f"< {values['aim_seconds']:g} s", _load(startup))
            )  # fmt: skip
    scale = benchmarks.get("data_scale")
    for passages, adds in (scale or {}).get("results", {}).items():
        warm_ops = ("open_lookup", "pairs", "data_info")
        warm = {op: adds[op]["wall_seconds"] for op in warm_ops if op in adds}
        if warm:
            slowest = max(warm, key=warm.get)
            rehash = adds.get("open_rehash", {}).get("wall_seconds")
            out.append(
                (f"stage start with a {int(passages):,}-passage corpus: what it adds to a fresh process",
                 f"+{warm[slowest]:.2f} s warm (`{slowest}`, the slowest of {len(warm)})"
                 + (f", +{rehash:.2f} s re-hashing" if rehash is not None else ""),
                 "—", "< 2 s", _load(scale))
            )  # fmt: skip
    labels = {
        "audit": "the canary audit of the docs' canary-audit page (`synthq canary-audit`), fresh process",
        "demo": "`make demo` from nothing (`synthq run pipelines/demo.yaml`), then `--check`",
    }
    for run in ("audit", "demo"):
        wall = benchmarks.get(f"pipeline_wall[{run}]")
        if wall:
            found = wall["results"]
            measured = f"{found['wall_seconds'] / 60:.1f} min"
            power = found.get("power")
            if power:
                measured += (
                    f"; ε = ∞ generator bound {power['generator_inf_lower_bound']:.2f} "
                    f"({power['correct']} correct, AUROC {power['auroc']:.2f}; aim ≥ {power['aim']:g})"
                )
            if "check" in found:
                measured += f"; check {found['check']}"
            kinds = found.get("stage_seconds")
            if kinds:
                measured += (
                    " ("
                    + ", ".join(
                        f"{kind} ×{value['stages']} {value['seconds'] / 60:.1f}"
                        for kind, value in kinds.items()
                    )
                    + " min)"
                )
            out.append(
                (labels[run], measured, "—", f"≤ {found['aim_seconds'] / 60:g} min",
                 ", ".join(filter(None, [_load(wall), f"timed {found['timed']}"])))
            )  # fmt: skip
    for name, first_hour in sorted(benchmarks.items()):
        if name != "first_hour" and not name.startswith("first_hour["):
            continue
        steps = first_hour["steps"]
        parts = [
            f"{name} {step['wall_seconds'] / 60:.1f} min / {step['peak_rss_gb']:.1f} GB"
            for name, step in steps.items()
        ]
        total, peak = first_hour["total_wall_seconds"] / 60, first_hour["max_peak_rss_gb"]
        measured = f"{total:.1f} min, peak {peak:.1f} GB ({', '.join(parts)})"
        aims = first_hour["aims"]
        out.append(
            (f"the README guide's own-data commands as written, on the shipped {_guide_data(first_hour)} "
             "(`first_hour.py`)",
             measured, "—", f"≤ {aims['total_wall_seconds'] / 60:g} min, ≤ {aims['peak_rss_gb']:g} GB each",
             _load({k: v for k, v in first_hour.items() if k != "steps"}))  # its steps are commands
        )  # fmt: skip
    for name, bf16 in sorted(benchmarks.items()):
        if not name.startswith("cpu_precision"):
            continue
        work = {
            "generate": "generate (sampler)",
            "finetune_dp": "finetune-lm DP step",
            "retriever": "retriever step",
        }
        found = bf16["results"]
        ratios = [
            f"{label} {found[f'{row}@bf16']['time_ratio']:.2f}×"
            for row, label in work.items()
            if f"{row}@bf16" in found
        ]
        flags = ", ".join(bf16.get("cpu_flags", [])) or "no bf16 instructions"
        out.append(
            (f"`--precision bf16` on this CPU against fp32 ({flags}), same inputs, one process",
             "time " + ", ".join(ratios), "—", "< 1× where the CPU has native bf16", _load(bf16))
        )  # fmt: skip
    evaluation = benchmarks.get("eval_throughput")
    if evaluation and "generated_search_only" in evaluation:
        search = evaluation["generated_search_only"]
        out.append(
            (f"eval exact search vs BEIR's, {search.get('docs', '?')} random vectors",
             f"{search['speedup_vs_beir']:.2f}× faster", "—", "—", _load(evaluation))
        )  # fmt: skip
    return out


def table(results: dict) -> str:
    """The performance table; a row measured in an earlier run than the latest says when and on
    which CPU (re-running one script refreshes its rows only, and VMs change CPUs)."""
    machine = results.get("machine", {})
    lines = [
        f"Last measured {results.get('collected', '?')} on {machine.get('cpu', '?')}, "
        + f"{machine.get('cores', '?')} cores, {machine.get('memory_gb', '?')} GB, "
        + f"torch {machine.get('torch', '?')}"
        + (f", {machine['gpu']}" if machine.get("gpu") else ", no GPU")
        + ". Every ratio is from one run that measured both sides; a load above the core count "
        "means other work shared the CPU (ratios then carry more noise than the times suggest). "
        "Memory: peak RSS of one step in a process of its own; `live`: the same with malloc "
        "returning every freed block over 1 MiB at once (`MALLOC_MMAP_THRESHOLD_`), so that the "
        "peak follows the tensors alive rather than what glibc's heap kept.",
        "",
        "| work | measured | anchor | aim | conditions |",
        "|---|---|---|---|---|",
    ]
    lines += [f"| {' | '.join(row)} |" for row in rows(results)]
    return "\n".join(lines)


DEFAULT_PAGE = Path("docs/performance.md")


def update_page(results: dict, page: Path) -> None:
    """Replace the table between the markers of ``page`` (a page without them is refused)."""
    text = page.read_text(encoding="utf-8")
    if START not in text or END not in text:
        raise SystemExit(f"{page} has no {START} … {END} block")
    head, rest = text.split(START, 1)
    _, tail = rest.split(END, 1)
    page.write_text(f"{head}{START}\n{table(results)}\n{END}{tail}", encoding="utf-8")


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("results", type=Path, nargs="?", default=Path("benchmarks/results.json"))
    parser.add_argument("--page", type=Path, default=DEFAULT_PAGE, help="the page holding the table markers")
    args = parser.parse_args()
    update_page(json.loads(args.results.read_text(encoding="utf-8")), args.page)


if __name__ == "__main__":
    main()

"""Hugging Face model cards for model artifacts, so the privacy guarantee travels with the weights.

A generator (``finetune-lm``) or retriever (``train-retriever``) artifact is a directory a user
may upload to the Hub as it is; the Hub shows its ``README.md``. :func:`write_model_card` is
called by :mod:`synthq.artifacts.create` when such an artifact is finished (stages need not know), and
writes the guarantee — ε, δ, privacy unit, mechanism, accountant, what it was derived from and
its assumptions — from the manifest. A card the model library already wrote
(sentence-transformers writes one) keeps its content; the guarantee section is added to it.
"""

from __future__ import annotations

import math
from pathlib import Path

MODEL_STAGES = {"finetune-lm": "query generator", "train-retriever": "dual-encoder retriever"}
CARD = "README.md"
SECTION = "## Privacy guarantee (synthq)"


def _epsilon(value) -> str:
    value = float(value)
    return "∞ (no differential privacy)" if math.isinf(value) else f"{value:.4g}"


def _per_unit(privacy: dict) -> str:
    bound = (privacy.get("details") or {}).get("max_queries_per_user")
    unit = privacy.get("unit", "?")
    return f"per user, ≤ {bound} queries each" if unit == "user" and bound else f"per {unit}"


def guarantee_section(manifest: dict) -> str:
    """The card's guarantee section (Markdown) for a manifest."""
    privacy = manifest.get("privacy", {})
    epsilon = float(privacy.get("epsilon", math.inf))
    lines = [
        SECTION,
        "",
        f"This {MODEL_STAGES.get(manifest.get('stage'), 'model')} was written by synthq "
        f"{manifest.get('synthq', '')} (stage `{manifest.get('stage')}`).",
        "",
        "| | |",
        "|---|---|",
        f"| ε | {_epsilon(epsilon)} |",
        f"| δ | {float(privacy.get('delta', 0.0)):.3g} |",
        f"| privacy unit | {privacy.get('unit', '?')} (ε {_per_unit(privacy)} of the private data) |",
        f"| mechanism | {privacy.get('mechanism', '?')} |",
        f"| accountant | {privacy.get('accountant') or '—'} |",
    ]
    derived = privacy.get("derived_from") or []
    if derived:
        lines.append(f"| derived from | {', '.join(f'`{h[:16]}`' for h in derived)} (manifest sha256) |")
    for key, value in (privacy.get("details") or {}).items():
        lines.append(f"| {key} | {value} |")
    if privacy.get("note"):
        lines += ["", privacy["note"]]
    assumptions = privacy.get("assumptions") or []
    if assumptions:
        lines += ["", "The guarantee holds under these assumptions:", ""]
        lines += [f"- {assumption}" for assumption in assumptions]
    if math.isinf(epsilon):
        lines += ["", "**Not private**: this model was trained on private data without a DP mechanism."]
    inputs = manifest.get("inputs") or []
    if inputs:
        lines += ["", "Trained from:", ""]
        lines += [
            f"- {record.get('stage') or record.get('kind', 'input')}: `{record.get('path')}` "
            f"(sha256 `{str(record.get('sha256', ''))[:16]}`)"
            for record in inputs
        ]
    lines += ["", "The full record is `manifest.json` (`synthq info DIR`)."]
    lines += ["", "For a privacy review, run in this directory `synthq ledger . --statement`."]
    return "\n".join(lines) + "\n"


def write_model_card(directory: Path, manifest: dict) -> Path | None:
    """Write (or extend) ``directory/README.md`` for a model artifact; other stages get none."""
    if manifest.get("stage") not in MODEL_STAGES:
        return None
    path = Path(directory) / CARD
    section = guarantee_section(manifest)
    if path.is_file():
        text = path.read_text(encoding="utf-8")
        text = text.split(f"\n{SECTION}\n")[0].rstrip() + "\n\n" + section
    else:
        epsilon = float(manifest.get("privacy", {}).get("epsilon", math.inf))
        tags = ["synthq", "differential-privacy" if math.isfinite(epsilon) else "non-private"]
        text = "---\ntags:\n" + "".join(f"- {tag}\n" for tag in tags) + "---\n\n"
        text += f"# synthq {MODEL_STAGES[manifest['stage']]}\n\n" + section
    path.write_text(text, encoding="utf-8")
    return path

"""Results of several evaluations published together: their rows merged, and the guarantee of the whole.

``report`` publishes the results of every model in every evaluation it is given: each
(dataset, split, model) appears once, and :func:`combined_guarantee` counts each DP release behind
them once and composes independent ones.
"""

from __future__ import annotations

from pathlib import Path

from synthq.artifacts.manifest import Artifact
from synthq.privacy.guarantee import Guarantee, compose_all
from synthq.reporting.eval_files import read_checked_rows
from synthq.reporting.row_privacy import merged_releases, row_privacy


def merge_rows(evals: list[Artifact]) -> tuple[list[dict], list[tuple[str, Guarantee]]]:
    """The rows of all evaluations, each (dataset, split, model) once (:func:`merge_row_lists`),
    and the (hash, guarantee) of every model whose results they publish."""
    row_lists = _distinct_datasets(evals, [read_checked_rows(artifact) for artifact in evals])
    sources = []
    for artifact, rows in zip(evals, row_lists, strict=True):
        for row in rows:
            model = row.get("model_id") or row["retriever"]
            if "privacy" in row:
                sources.append((model, Guarantee.from_manifest(row["privacy"])))
            else:  # results written before rows carried their guarantee: the eval's own
                sources.append((artifact.manifest_hash, artifact.privacy))
    return merge_row_lists(row_lists), sources


def _dataset_reads(artifact: Artifact) -> dict[str, tuple[str, str]]:
    """Dataset name -> (where it was read, its recorded digest), from an eval's inputs."""
    reads = {}
    for record in artifact.inputs:
        if record.get("kind") in ("data", "public-split") and (record.get("name") or record.get("path")):
            where = str(record.get("path") or record["name"])
            # a row names its dataset as eval shows it: a directory by its last component
            reads[Path(str(record.get("name") or where)).name] = (where, str(record.get("sha256")))
    return reads


def _distinct_datasets(evals: list[Artifact], row_lists: list[list[dict]]) -> list[list[dict]]:
    """Rows whose dataset name is shared by different datasets across the evaluations (``a/tiny``
    and ``b/tiny``, or one directory whose content changed) renamed apart, so one table never
    mixes them and no row replaces another's: by their last two path components where those
    differ, else by the digest's first 8 characters."""
    reads = [_dataset_reads(artifact) for artifact in evals]
    seen: dict[str, set[tuple[str, str]]] = {}
    for per_eval in reads:
        for name, read in per_eval.items():
            seen.setdefault(name, set()).add(read)
    clashing = {name for name, found in seen.items() if len(found) > 1}
    if not clashing:
        return row_lists

    def label(name: str, read: tuple[str, str]) -> str:
        tails = {"/".join(Path(path).parts[-2:]) for path, _ in seen[name]}
        if len(tails) == len(seen[name]):
            return "/".join(Path(read[0]).parts[-2:])
        return f"{name} [{read[1].split(':')[-1][:8]}]"

    renamed = []
    for per_eval, rows in zip(reads, row_lists, strict=True):
        renamed.append(
            [
                {**row, "dataset": label(row["dataset"], per_eval[row["dataset"]])}
                if row["dataset"] in clashing and row["dataset"] in per_eval
                else row
                for row in rows
            ]
        )
    return renamed


def merge_row_lists(row_lists: list[list[dict]]) -> list[dict]:
    """Rows of several evaluations, each (dataset, split, model) once, shown the same whatever
    the order the evaluations are given in: a model evaluated in several of them carries the
    union of their releases (:func:`synthq.reporting.row_privacy.merged_releases`; a choice on
    private dev queries made in one of them stays with it) and every way it was chosen; its
    metrics are the first evaluation's (the same model on the same data). Two different models
    with the same name get their hash appended so the tables never mix them up."""
    groups: dict[tuple, list[dict]] = {}
    for rows in row_lists:
        for row in rows:
            model = row.get("model_id") or row["retriever"]
            groups.setdefault((row["dataset"], row.get("split"), model), []).append(row)
    merged, names = [], {}
    for (_, _, model), occurrences in groups.items():
        row = dict(occurrences[0])
        if len(occurrences) > 1:
            row["releases"] = merged_releases(occurrences)
            row["assumptions"] = list(
                dict.fromkeys(a for r in occurrences for a in r.get("assumptions") or [])
            )
            privacy = row_privacy(occurrences)
            row["privacy"] = privacy.scores.model_dump(mode="json")
            row["epsilon"] = privacy.scores.epsilon
            selections = [r["selection"] for r in occurrences if r.get("selection")]
            if selections:
                hows = sorted({s["how"] for s in selections})
                row["selection"] = {
                    "how": "; ".join(hows),
                    "epsilon": max(float(s["epsilon"]) for s in selections),
                }
        if names.setdefault(row["retriever"], model) != model:
            row["retriever"] = f"{row['retriever']} [{model.split(':')[-1][:8]}]"
        merged.append(row)
    return merged


def combined_guarantee(sources: list[tuple[str, Guarantee]]) -> Guarantee:
    """The guarantee of one artifact that publishes results of several models.

    Args:
        sources: ``(manifest hash, guarantee)`` of every model whose results are published.

    Each DP release of the private data is counted once: models that post-process the same
    release (retrievers trained on synthetic data from one generator, whose ``derived_from``
    starts with that generator) share its guarantee, and a model with its own accountant (direct
    DP) is its own release. Releasing results of several independent releases of the same data
    composes (basic composition: ε and δ add). With a single release this is exactly that
    release's guarantee, i.e. the largest ε of the models; taking the largest ε when there are
    several independent releases would understate the loss. Public models add nothing; one
    non-private model makes the whole artifact ε = ∞. The unit is the weakest of the releases'
    (:func:`synthq.privacy.guarantee.compose_all`), and the parts are kept so ε is recomputed on open.
    """
    derived = sorted({h for key, g in sources for h in [*g.derived_from, key] if g.mechanism != "public"})
    private = [(key, g) for key, g in sources if g.mechanism != "public" and g.epsilon > 0]
    if not private:
        return Guarantee.public("results of public models (BM25, untrained encoders) on public data only")
    if any(not g.is_private for _, g in private):
        non_private = Guarantee.non_private("includes results of a model trained on private data without DP")
        return non_private.model_copy(update={"derived_from": derived})
    releases: dict[str, Guarantee] = {}
    for key, g in private:
        release = g.derived_from[0] if g.derived_from else key
        # Within one release every model is its post-processing; the largest recorded ε is kept
        # so that a model that composed extra accounting on top is never understated.
        if release not in releases or g.epsilon > releases[release].epsilon:
            releases[release] = g
    if len(releases) == 1:
        (only,) = releases.values()
        return only.model_copy(
            update={"derived_from": derived, "mechanism": f"{only.mechanism}+post-processing"}
        )
    combined = compose_all(list(releases.values()), f"basic composition of {len(releases)} DP releases")
    return combined.model_copy(update={"derived_from": derived})

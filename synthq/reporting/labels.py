"""What a retriever is, read off its lineage: method labels, synthetic-set recipes, variants.

Tables, plots and dev selection name rows by method (:func:`describe_method`: synthetic with its
generator, queries per document and filters / original / direct DP, then the encoder) and merge
rows into systems by ``variant`` (:func:`training_settings`: the training options without seed,
a synthetic set replaced by its recipe, :func:`synthetic_recipe`). Both walk the manifests of the
artifacts a retriever was trained from (synthetic set, filters, generator).
"""

from __future__ import annotations

import hashlib
import json
import math
from pathlib import Path

from synthq.artifacts.freshness import without_added_defaults
from synthq.artifacts.manifest import Artifact, is_artifact, open_artifact
from synthq.runtime.errors import ArtifactError


def _synthetic_origin(synthetic_path: str) -> tuple[str | None, int, list[str]]:
    """For table labels, read off the set's recipe (:func:`synthetic_recipe`): the generator's
    model name (``, per user`` for a user-level generator, ``(per-user clipping)`` when it clipped
    each user's combined gradient), the queries per document, and the
    filters applied on the way (``filter`` artifacts over a ``generate`` one)."""
    recipe, filters = synthetic_recipe(synthetic_path), []
    kept_per_document = math.inf  # a likelihood filter keeps at most --keep per document
    while recipe is not None and "filter" in recipe:
        own = recipe["filter"]
        method = own.get("method")
        if method and method != "none":
            filters.insert(0, f"{method}-filtered")
        if method == "likelihood":
            kept_per_document = min(kept_per_document, int(own.get("keep") or 1))
        if own.get("holdout_documents"):
            filters.insert(0, f"{own['holdout_documents']} docs held out")
        recipe = recipe["of"]
    if recipe is None:
        return None, 1, filters
    if "evolve" in recipe:  # Private Evolution: a public model, its queries chosen by noisy votes
        own = recipe["evolve"]
        per_document = int(min(int(own.get("queries_per_document") or 1), kept_per_document))
        per_user = ", per user" if own.get("privacy_unit") == "user" else ""
        return f"PE {Path(str(own.get('model'))).name}{per_user}", per_document, filters
    per_document = int(min(int(recipe["generate"].get("num_queries") or 1), kept_per_document))
    generator = recipe["generator"]
    if not generator or "model" not in generator:
        public = recipe.get("public_generator")  # generate --generator PUBLIC_MODEL: the ε = 0 control
        if public:
            few_shot = recipe["generate"].get("few_shot")
            how = f"few-shot {few_shot}" if few_shot else "zero-shot"
            return f"public {Path(str(public)).name}, {how}", per_document, filters
        return None, per_document, filters
    if generator.get("max_steps") == 0 and generator.get("warm_start"):  # no DP step: public pairs only
        return (
            f"{Path(str(generator['model'])).name}, warm start {generator['warm_start']} only",
            per_document,
            filters,
        )
    per_user = ", per user" if generator.get("privacy_unit") == "user" else ""
    if generator.get("user_clipping") == "per-user":
        per_user += " (per-user clipping)"
    return Path(str(generator["model"])).name + per_user, per_document, filters


def describe_method(artifact: Artifact, family: bool = False) -> str:
    """A method label for tables and plots: synthetic (generator, queries per document when
    more than one, filters) / original / direct DP (mode), then the encoder. Rows with the same
    label form one line in the privacy-utility plot and one group in dev selection.

    ``family=True`` leaves out what tells one synthetic set of a generator from another (queries
    per document, filters, held-out documents): the label under which ``eval --select-data``
    chooses among those sets."""
    config = artifact.config
    encoder = Path(str(config.get("encoder", "?"))).name
    if config.get("dp"):
        per_user = ", per user" if config.get("privacy_unit") == "user" else ""
        return f"direct DP ({config['dp']}{per_user}), {encoder}"
    data = str(config.get("data", ""))
    if (Path(data) / "manifest.json").is_file():
        generator, generated, filters = _synthetic_origin(data)
        per_document = min(generated, config.get("queries_per_document") or math.inf)
        per_document_text = f"{per_document} queries/doc" if per_document > 1 else None
        details = (generator,) if family else (generator, per_document_text, *filters)
        detail = ", ".join(x for x in details if x)
        return f"synthetic ({detail}), {encoder}" if detail else f"synthetic, {encoder}"
    return f"original (non-private), {encoder}"


_RUN_FLAGS = {"out", "force", "resume", "device", "generation_batch_size", "batch_size", "encode_batch_size"}


_EVOLVE_SEEDS = {"seed", "generation_seed"}


def synthetic_recipe(path: str) -> dict | None:
    """What a synthetic set is one draw of: its generate (and filter) settings and its generator's
    training settings, without outputs, run flags and seeds. Two sets from independently trained
    generators with the same recipe, or from one generator with different sampling seeds, are
    replicates, as two training seeds are (``None`` when ``path`` is not a synthetic artifact)."""
    try:
        artifact = open_artifact(path, verify=False)
        # a field added since a set was written counts at its old-behaviour value as absent
        config = without_added_defaults(artifact.config)
        if artifact.stage == "filter":
            own = {k: v for k, v in config.items() if k not in _RUN_FLAGS | {"synthetic"}}
            return {"filter": own, "of": synthetic_recipe(config["synthetic"])}
        if artifact.stage == "evolve":
            return {"evolve": {k: v for k, v in config.items() if k not in _RUN_FLAGS | _EVOLVE_SEEDS}}
        if artifact.stage == "generate":
            generator = config.get("generator")
            recipe = {
                "generate": {k: v for k, v in config.items() if k not in _RUN_FLAGS | {"generator", "seed"}},
                "generator": _generator_recipe(generator),
            }
            if recipe["generator"] is None and not is_artifact(Path(str(generator))):
                recipe["public_generator"] = generator
            return recipe
    except (ArtifactError, KeyError, OSError, TypeError):
        return None
    return None


def _generator_recipe(path: str | None) -> dict | None:
    """A generator's training settings without outputs, run flags and seed (``None`` when the set
    records no generator that can be opened)."""
    try:
        generator = open_artifact(path, verify=False) if path else None
    except (ArtifactError, OSError, TypeError):
        return None
    return (
        None
        if generator is None
        else {
            k: v
            for k, v in without_added_defaults(generator.config).items()
            if k not in _RUN_FLAGS | {"seed"}
        }
    )


def training_settings(artifact: Artifact) -> tuple[dict, str | None, str | None]:
    """A retriever's training options (without output path and run flags), its ``variant`` — a
    hash of those options without the seed, with a synthetic set replaced by its recipe
    (:func:`synthetic_recipe`), so retrievers that differ only by seed or by the generator
    replicate they were trained on share it (``None`` when the config records no seed: such a
    retriever is its own system) — and its ``replicate``: the manifest hash of the synthetic set
    it was trained on (``None`` for other data)."""
    skip = {"out", "force", "resume", "device"}
    settings = {k: v for k, v in without_added_defaults(artifact.config).items() if k not in skip}
    data = str(settings.get("data", ""))
    recipe = synthetic_recipe(data) if (Path(data) / "manifest.json").is_file() else None
    replicate = None
    if recipe is not None:
        replicate = open_artifact(data, verify=False).manifest_hash[:12]
    if "seed" not in settings:
        return settings, None, replicate
    identity = {k: v for k, v in settings.items() if k != "seed"}
    if recipe is not None:
        identity["data"] = recipe
    variant = json.dumps(identity, sort_keys=True, default=str)
    return settings, hashlib.sha256(variant.encode()).hexdigest()[:16], replicate


def training_fields(artifact: Artifact) -> dict:
    """What a retriever's rows carry for tables, merges and dev selection: its ``seed``, training
    ``settings``, ``variant`` and ``replicate`` (:func:`training_settings`) and its ``family``
    (:func:`describe_method` with ``family=True``)."""
    settings, variant, replicate = training_settings(artifact)
    return {
        "seed": artifact.config.get("seed"),
        "settings": settings,
        "variant": variant,
        "replicate": replicate,
        "family": describe_method(artifact, family=True),
    }

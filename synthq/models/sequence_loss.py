"""The training loss of a query generator, per sequence, and the model inputs it needs.

Every DP clipping engine (:mod:`synthq.dp.lm.clippers`, :mod:`synthq.dp.lm.hooks`) and the non-private
step use these, so the quantity being clipped is the same everywhere: one value per training
pair, the mean negative log-likelihood of its query tokens.
"""

from __future__ import annotations

import torch


def label_window(kind: str, labels: torch.Tensor) -> int:
    """How many final positions of a causal batch need logits: the query tokens sit at the end of
    left-padded rows, so the model's vocabulary projection (a fifth of SmolLM2's compute at
    ~100-token prompts) can skip the prompt. 0 (= all positions) for seq2seq models."""
    if kind != "causal":
        return 0
    columns = torch.nonzero((labels != -100).any(0)).flatten()
    return int(labels.shape[1] - columns[0]) + 1 if len(columns) else 0


def per_sequence_loss(kind: str, logits: torch.Tensor, labels: torch.Tensor) -> torch.Tensor:
    """Mean negative log-likelihood of each sequence's label tokens (one value per row).

    ``logits`` may cover only the last positions (``logits_to_keep``); labels are aligned to
    them."""
    if kind == "causal":
        labels = labels[:, labels.shape[1] - logits.shape[1] :]
        logits, labels = logits[:, :-1], labels[:, 1:]
    mask = labels != -100
    log_probs = torch.log_softmax(logits.float(), dim=-1)
    picked = log_probs.gather(-1, labels.clamp(min=0).unsqueeze(-1)).squeeze(-1)
    return -(picked * mask).sum(-1) / mask.sum(-1).clamp(min=1)


def model_inputs(
    kind: str, batch: dict[str, torch.Tensor], traceable: bool = False, window: int | None = None
) -> dict[str, torch.Tensor]:
    """Forward-pass inputs for a training batch.

    Seq2seq models also get the labels (the model shifts them into decoder inputs). With
    ``traceable`` (inside ``vmap``), T5's padding mask becomes a 4-D additive mask: transformers
    returns such masks as-is instead of inspecting their values, which ``vmap`` cannot trace."""
    inputs = {k: v for k, v in batch.items() if k != "labels" or kind == "seq2seq"}
    if kind == "causal":  # inside vmap the window must be given: it is computed from data
        inputs["logits_to_keep"] = label_window(kind, batch["labels"]) if window is None else window
    if kind == "seq2seq" and traceable:
        mask = inputs["attention_mask"]
        inputs["attention_mask"] = (1.0 - mask[:, None, None, :].float()) * torch.finfo(torch.float32).min
    return inputs

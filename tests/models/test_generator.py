"""QueryGenerator on tiny seq2seq and causal models: formats, masking, batching invariance."""

from __future__ import annotations

import pytest
import torch

from synthq.models.generator import QueryGenerator

DOCS = ["Boil eggs for nine minutes for a firm yolk.", "Git rebase replays your commits on another branch."]
QUERIES = ["how long to boil an egg", "what does rebase do"]


@pytest.fixture(params=["seq2seq", "causal"])
def generator(request, tiny_t5_dir, tiny_causal_dir):
    path = tiny_t5_dir if request.param == "seq2seq" else tiny_causal_dir
    return QueryGenerator.load(path, max_source_length=64)


def test_kind_and_padding_side(generator):
    expected = "left" if generator.kind == "causal" else "right"
    assert generator.tokenizer.padding_side == expected
    batch = generator.generation_batch(DOCS)
    first_column = batch["attention_mask"][:, 0] if expected == "left" else batch["attention_mask"][:, -1]
    assert first_column.min() == 0 or batch["attention_mask"].all()  # padding on the stated side


def test_labels_cover_only_query_and_eos(generator):
    batch = generator.training_batch(DOCS, QUERIES, max_target_length=32)
    eos = generator.tokenizer.eos_token_id
    for row in range(len(DOCS)):
        labels = batch["labels"][row]
        label_ids = labels[labels != -100].tolist()
        assert label_ids[-1] == eos
        text = generator.tokenizer.decode(label_ids[:-1]).strip()
        assert text == QUERIES[row]


def test_log_likelihood_is_independent_of_batch_composition(generator):
    together = generator.query_log_likelihood(DOCS, QUERIES, batch_size=2)
    alone = torch.cat([generator.query_log_likelihood([d], [q]) for d, q in zip(DOCS, QUERIES, strict=True)])
    assert torch.allclose(together, alone, atol=1e-4)
    assert (together < 0).all()


def test_log_likelihood_matches_the_model_loss(generator):
    batch = generator.training_batch(DOCS[:1], QUERIES[:1])
    with torch.no_grad():
        loss = generator.model(**batch).loss  # mean over label tokens
    tokens = (batch["labels"] != -100).sum()
    assert generator.query_log_likelihood(DOCS[:1], QUERIES[:1]).item() == pytest.approx(
        -(loss * tokens).item(), rel=1e-4
    )


def test_greedy_generation_batched_equals_one_at_a_time(generator):
    batch = generator.generation_batch(DOCS)
    together = generator.decode_new_tokens(
        generator.model.generate(**batch, max_new_tokens=6, do_sample=False), batch
    )
    alone = []
    for doc in DOCS:
        single = generator.generation_batch([doc])
        alone += generator.decode_new_tokens(
            generator.model.generate(**single, max_new_tokens=6, do_sample=False), single
        )
    assert together == alone


def test_save_and_reload_round_trip(generator, tmp_path):
    generator.save(tmp_path / "g", generation_defaults={"do_sample": True, "top_p": 0.8})
    again = QueryGenerator.load(tmp_path / "g")
    assert again.kind == generator.kind and again.max_source_length == 64
    assert torch.allclose(
        again.query_log_likelihood(DOCS, QUERIES), generator.query_log_likelihood(DOCS, QUERIES), atol=1e-5
    )
    assert again.model.generation_config.top_p == 0.8


def test_shared_prefix_scoring_equals_scoring_each_pair(generator):
    """The canary audit's fast path (encoder / common prefix once) gives every candidate the same
    log-likelihood as scoring each (document, query) pair on its own."""
    document = "the moon orbits the earth and its phases follow a cycle of about a month"
    candidates = [f"moon phase code {secret}" for secret in ("4759382421", "9538433184", "0000000001")]
    candidates += ["moon phase", "a different query entirely"]  # a prefix of others; no shared prefix
    expected = generator.query_log_likelihood([document] * len(candidates), candidates, batch_size=1)
    shared = generator.candidate_log_likelihoods(document, candidates, batch_size=2)
    torch.testing.assert_close(shared, expected, rtol=1e-4, atol=1e-4)
    only_secrets = generator.candidate_log_likelihoods(document, candidates[:3], batch_size=3)
    torch.testing.assert_close(only_secrets, expected[:3], rtol=1e-4, atol=1e-4)


def _trainable(generator) -> dict[str, torch.Tensor]:
    return {name: p for name, p in generator.model.named_parameters() if p.requires_grad}


@pytest.mark.parametrize(("kind", "targets"), [("causal", "q_proj,v_proj"), ("seq2seq", "q,v")])
def test_lora_targets_put_adapters_on_the_named_layers_only(tiny_t5_dir, tiny_causal_dir, kind, targets):
    """--lora-targets: adapters on the named linear layers and nowhere else, as many trainable
    coordinates as rank × (in + out) summed over those layers of the base model."""
    from synthq.models.generator import apply_lora

    path = tiny_t5_dir if kind == "seq2seq" else tiny_causal_dir
    names = targets.split(",")
    base = QueryGenerator.load(path, max_source_length=64)
    expected = sum(
        3 * (module.in_features + module.out_features)
        for name, module in base.model.named_modules()
        if isinstance(module, torch.nn.Linear) and name.rsplit(".", 1)[-1] in names
    )
    apply_lora(base, rank=3, targets=targets)
    trainable = _trainable(base)
    assert sum(p.numel() for p in trainable.values()) == expected > 0
    for name in trainable:  # ...model.layers.0.self_attn.q_proj.lora_A.default.weight
        assert "lora_" in name and name.split(".lora_")[0].rsplit(".", 1)[-1] in names
    everywhere = QueryGenerator.load(path, max_source_length=64)
    apply_lora(everywhere, rank=3)
    assert sum(p.numel() for p in _trainable(everywhere).values()) > expected  # all-linear adapts more


def test_lora_targets_naming_no_layer_are_refused_with_the_names_the_model_has(tiny_causal_dir):
    from synthq.models.generator import apply_lora
    from synthq.runtime.errors import SettingError

    generator = QueryGenerator.load(tiny_causal_dir, max_source_length=64)
    with pytest.raises(SettingError, match=r"no linear layer named query, value .*q_proj.*v_proj"):
        apply_lora(generator, rank=2, targets="q_proj,query,value")


def test_the_tied_output_layer_is_never_a_lora_target(tiny_causal_dir, tiny_t5_dir):
    """Merging an adapter into lm_head would change the input embeddings it shares its weight
    with: the shipped generator would not be the one trained. Refused, for both kinds."""
    from synthq.models.generator import apply_lora, check_lora_targets
    from synthq.runtime.errors import SettingError

    for path in (tiny_causal_dir, tiny_t5_dir):
        with pytest.raises(SettingError, match="no linear layer named lm_head"):
            apply_lora(QueryGenerator.load(path, max_source_length=64), rank=2, targets="lm_head")
        with pytest.raises(SettingError, match="no linear layer named lm_head"):
            check_lora_targets(path, "lm_head")  # from the config alone, no weights
    check_lora_targets(tiny_causal_dir, "q_proj,v_proj")
    check_lora_targets(tiny_t5_dir, "q,v")

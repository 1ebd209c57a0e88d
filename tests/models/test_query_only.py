"""Query-only generators: the cached-prefix forward is activated LoRA (PEFT's aLoRA over the whole
sequence), a row computes what it computes alone, the prefix store, save and load, generation."""

from __future__ import annotations

import json

import pytest
import torch

from synthq.models.generator import QueryGenerator, apply_lora
from synthq.models.query_only import (
    PrefixStore,
    QueryOnlyView,
    base_prefix_states,
    round_through,
)
from synthq.models.sequence_loss import model_inputs, per_sequence_loss

DOCS = [
    "Boil eggs for nine minutes for a firm yolk.",
    "Git rebase replays your commits on top of another branch to keep history linear.",
    "Adults need seven to nine hours of sleep.",
]
QUERIES = ["how long to boil an egg", "what does rebase do", "hours of sleep adults"]


def query_only_generator(path, dtype: str = "float32", seed: int = 0) -> QueryGenerator:
    """A tiny causal generator with LoRA whose adapters are non-zero (B = 0 at init would make
    every comparison trivially the base model's)."""
    generator = QueryGenerator.load(path, max_source_length=64)
    torch.manual_seed(seed)
    apply_lora(generator, rank=4, alpha=8)
    with torch.no_grad():
        for name, parameter in generator.model.named_parameters():
            if "lora_B" in name:
                parameter.normal_(0, 0.5)
    generator.enable_query_only(dtype)
    generator.model.eval()
    return generator


def test_cached_prefix_forward_is_pefts_activated_lora_over_the_whole_sequence(tiny_causal_dir):
    from peft import LoraConfig, get_peft_model
    from transformers import AutoModelForCausalLM

    generator = query_only_generator(tiny_causal_dir)
    view = QueryOnlyView(generator)
    batch = view.training_batch(DOCS, QUERIES, max_target_length=16)
    losses = per_sequence_loss("causal", view.model(**model_inputs("causal", batch)).logits, batch["labels"])

    # the same adapter weights as a PEFT aLoRA over the full [prefix | invocation | query] rows
    invocation = generator.invocation_ids()
    base = AutoModelForCausalLM.from_pretrained(tiny_causal_dir, dtype=torch.float32)
    config = LoraConfig(
        r=4, lora_alpha=8, lora_dropout=0.0, target_modules="all-linear", task_type="CAUSAL_LM",
        alora_invocation_tokens=invocation,
    )  # fmt: skip
    alora = get_peft_model(base, config)
    alora.load_state_dict(generator.model.state_dict())
    alora.eval()
    prefixes = generator.prefix_ids(DOCS)
    targets = generator.target_ids(QUERIES, 16)
    for row, (prefix, target) in enumerate(zip(prefixes, targets, strict=True)):
        ids = torch.tensor([prefix + invocation + target])
        logits = alora(input_ids=ids, attention_mask=torch.ones_like(ids)).logits
        labels = torch.tensor([[-100] * (len(prefix) + len(invocation)) + target])
        expected = per_sequence_loss("causal", logits, labels)[0]
        torch.testing.assert_close(losses[row], expected, atol=1e-5, rtol=1e-5)
    # and the adapter matters: the base model alone scores otherwise
    with alora.disable_adapter():
        ids = torch.tensor([prefixes[0] + invocation + targets[0]])
        labels = torch.tensor([[-100] * (len(prefixes[0]) + len(invocation)) + targets[0]])
        base_loss = per_sequence_loss("causal", alora(input_ids=ids).logits, labels)[0]
    assert abs(float(base_loss) - float(losses[0].detach())) > 1e-3


def test_a_rows_prefix_cache_and_loss_do_not_depend_on_its_batch(tiny_causal_dir):
    generator = query_only_generator(tiny_causal_dir)
    view = QueryOnlyView(generator)
    batch = view.training_batch(DOCS, QUERIES, max_target_length=16)
    together = per_sequence_loss(
        "causal", view.model(**model_inputs("causal", batch)).logits, batch["labels"]
    )
    for row in range(len(DOCS)):
        alone = view.training_batch(DOCS[row : row + 1], QUERIES[row : row + 1], max_target_length=16)
        loss = per_sequence_loss(
            "causal", view.model(**model_inputs("causal", alone)).logits, alone["labels"]
        )
        torch.testing.assert_close(together[row], loss[0], atol=1e-5, rtol=1e-5)
    prefixes = generator.prefix_ids(DOCS)
    batched = base_prefix_states(generator.model, prefixes, generator.tokenizer.pad_token_id)
    for prefix, state in zip(prefixes, batched, strict=True):
        alone = base_prefix_states(generator.model, [prefix], generator.tokenizer.pad_token_id)[0]
        assert state.shape == alone.shape and state.shape[3] == len(prefix)
        torch.testing.assert_close(state, alone, atol=1e-5, rtol=1e-5)


def test_prefix_cache_is_the_base_models_not_the_adapters(tiny_causal_dir):
    generator = query_only_generator(tiny_causal_dir)
    prefix = generator.prefix_ids(DOCS[:1])
    state = base_prefix_states(generator.model, prefix, generator.tokenizer.pad_token_id)[0]
    with torch.no_grad():
        for name, parameter in generator.model.named_parameters():
            if "lora_B" in name:
                parameter.mul_(3.0)
    again = base_prefix_states(generator.model, prefix, generator.tokenizer.pad_token_id)[0]
    torch.testing.assert_close(state, again)


@pytest.mark.parametrize("in_memory", [True, False], ids=["memory", "memory-mapped"])
def test_prefix_store_holds_each_prompts_rounded_cache_and_deletes_its_file(
    in_memory, tmp_path, tiny_causal_dir
):
    generator = query_only_generator(tiny_causal_dir, dtype="bfloat16")
    view = QueryOnlyView(generator)
    store, rows = view.store(
        DOCS + DOCS[:1], tmp_path, memory_limit=1 << 30 if in_memory else 0, batch_size=2
    )
    assert rows == [0, 1, 2, 0] and len(store) == 3  # a repeated document is cached once
    assert (store.path is None) == in_memory
    for index, state in enumerate(view.states(DOCS)):
        torch.testing.assert_close(store.state(index), state, atol=1e-2, rtol=1e-2)
        assert torch.equal(round_through(store.state(index), torch.bfloat16), store.state(index))
    layers, heads, dim = 2, 2, 8
    assert store.nbytes == sum(store.lengths) * 2 * layers * heads * dim * 2
    store.close()
    assert not list(tmp_path.iterdir())


def test_prefix_store_refuses_a_large_cache_without_a_private_directory(tiny_causal_dir):
    generator = query_only_generator(tiny_causal_dir)
    with pytest.raises(MemoryError, match="no private directory"):
        PrefixStore(generator.model, generator.prefix_ids(DOCS), 0, memory_limit=0)


def test_query_only_needs_a_frozen_encoder_and_a_template_tail(tiny_t5_dir, tiny_causal_dir):
    from synthq.runtime.errors import SettingError

    t5 = QueryGenerator.load(tiny_t5_dir)
    apply_lora(t5, rank=4)  # on the encoder too: its output could not be cached
    with pytest.raises(SettingError, match="decoder only"):
        t5.enable_query_only()
    generator = QueryGenerator.load(tiny_causal_dir)
    generator.template = "Query for {document}"
    with pytest.raises(SettingError, match="no text after"):
        generator.enable_query_only()


def test_saved_query_only_generator_loads_with_the_same_scores(tmp_path, tiny_causal_dir):
    generator = query_only_generator(tiny_causal_dir, dtype="bfloat16")
    before = generator.query_log_likelihood(DOCS, QUERIES)
    generator.save(tmp_path / "gen")
    saved = json.loads((tmp_path / "gen" / "synthq_generator.json").read_text())
    assert saved["query_only"] == {"adapter": "query_adapter", "prefix_dtype": "bfloat16"}
    adapter = json.loads((tmp_path / "gen" / "query_adapter" / "adapter_config.json").read_text())
    assert adapter["alora_invocation_tokens"] == generator.invocation_ids()
    assert not (tmp_path / "gen" / "adapter_config.json").exists()  # the base model loads plain
    loaded = QueryGenerator.load(tmp_path / "gen")
    assert loaded.query_only and loaded.prefix_dtype == "bfloat16"
    torch.testing.assert_close(loaded.query_log_likelihood(DOCS, QUERIES), before, atol=1e-4, rtol=1e-4)
    # the candidates of one document score as one at a time does
    one = loaded.candidate_log_likelihoods(DOCS[0], QUERIES)
    torch.testing.assert_close(one, loaded.query_log_likelihood([DOCS[0]] * 3, QUERIES), atol=1e-5, rtol=1e-5)


def test_a_loaded_query_only_model_is_activated_lora_for_any_other_reader(tmp_path, tiny_causal_dir):
    """A plain forward over whole rows (``model.generate``, the canary audit's sampling) of the
    loaded model acts from the invocation on: PEFT's aLoRA, the same scores as synthq's path."""
    generator = query_only_generator(tiny_causal_dir, dtype="float32")
    generator.save(tmp_path / "gen")
    loaded = QueryGenerator.load(tmp_path / "gen")
    ours = loaded.query_log_likelihood(DOCS, QUERIES)
    prompts = loaded._prompt_ids(DOCS)  # prefix + invocation, tokenized apart
    targets = loaded.target_ids(QUERIES, 128)
    for row, (prompt, target) in enumerate(zip(prompts, targets, strict=True)):
        ids = torch.tensor([prompt + target])
        with torch.no_grad():
            logits = loaded.model(input_ids=ids).logits
        log_probs = torch.log_softmax(logits[0, len(prompt) - 1 : -1], -1)
        whole = log_probs.gather(-1, torch.tensor(target).unsqueeze(-1)).sum()
        torch.testing.assert_close(whole, ours[row], atol=1e-4, rtol=1e-4)


def test_generation_decodes_what_the_trained_path_scores(tmp_path, tiny_causal_dir):
    """Greedy queries of the sampler are, token by token, the arg-max of the query-only forward
    that training and scoring use (frozen prefix cache, adapted invocation and query)."""
    from synthq.models.sampling import Request, sample_queries

    generator = query_only_generator(tiny_causal_dir, dtype="bfloat16")
    documents = [DOCS[0], DOCS[1], DOCS[0]]  # a repeated document shares one prefix pass
    requests = [Request(f"d{i}", d, i) for i, d in enumerate(documents)]
    new_tokens = 5
    sampled = sample_queries(generator, requests, 0, 1.0, 1.0, new_tokens, greedy=True, stop_at_newline=False)
    view = QueryOnlyView(generator)
    eos = generator.tokenizer.eos_token_id
    for document, text in zip(documents, sampled, strict=True):
        state = view.states([document])
        tokens: list[int] = []
        for _ in range(new_tokens):
            batch = segment_batch_of(view, state, tokens)
            with torch.no_grad():
                logits = view.model(**batch).logits[0, -1]
            tokens.append(int(logits.argmax()))
            if tokens[-1] == eos:
                break
        expected = generator.tokenizer.decode(tokens, skip_special_tokens=True).split("\n")[0].strip()
        assert text == expected


def segment_batch_of(view: QueryOnlyView, state, tokens: list[int]) -> dict:
    from synthq.models.query_only import segment_batch

    batch = segment_batch(state, view.generator.invocation_ids(), [tokens], view.tokenizer.pad_token_id)
    batch.pop("labels")
    return batch


def test_seq2seq_query_only_reads_the_cached_encoder_output_and_saves_a_plain_model(tmp_path, tiny_t5_dir):
    """T5: adapters on the decoder only, so the frozen encoder's cached output is what a full
    forward computes; merged, the saved model is a plain T5 with the same scores."""
    generator = QueryGenerator.load(tiny_t5_dir, max_source_length=64)
    torch.manual_seed(0)
    apply_lora(generator, rank=4, alpha=8, decoder_only=True)
    assert not any("encoder." in n for n, p in generator.model.named_parameters() if p.requires_grad)
    with torch.no_grad():
        for name, parameter in generator.model.named_parameters():
            if "lora_B" in name:
                parameter.normal_(0, 0.5)
    generator.model.eval()
    full = generator.query_log_likelihood(DOCS, QUERIES)
    generator.enable_query_only()
    assert generator.prefix_dtype == "float32"
    view = QueryOnlyView(generator)
    store, rows = view.store(DOCS)
    batch = view.batch([store.state(r) for r in rows], QUERIES, 128)
    cached = per_sequence_loss(
        "seq2seq", view.model(**model_inputs("seq2seq", batch)).logits, batch["labels"]
    )
    plain = generator.training_batch(DOCS, QUERIES, 128)
    expected = per_sequence_loss(
        "seq2seq", generator.model(**model_inputs("seq2seq", plain)).logits, plain["labels"]
    )
    torch.testing.assert_close(cached, expected, atol=1e-5, rtol=1e-5)
    generator.save(tmp_path / "t5")
    assert "query_only" not in json.loads((tmp_path / "t5" / "synthq_generator.json").read_text())
    loaded = QueryGenerator.load(tmp_path / "t5")
    assert not loaded.query_only
    torch.testing.assert_close(loaded.query_log_likelihood(DOCS, QUERIES), full, atol=1e-4, rtol=1e-4)

"""Model resolution: packaged aliases, local directories, and clear offline errors."""

from __future__ import annotations

import pytest

from synthq.models.resolve import aliases, resolve_model
from synthq.runtime.errors import ModelResolutionError


def test_aliases_are_registered():
    assert {"minilm-l6", "smollm2-135m"} <= set(aliases())


def test_minilm_alias_loads_and_embeds():
    from sentence_transformers import SentenceTransformer

    model = SentenceTransformer(str(resolve_model("minilm-l6")), device="cpu")
    embeddings = model.encode(["how long to boil an egg", "boiled egg timing", "roth ira rules"])
    assert embeddings.shape == (3, 384)
    similarity = embeddings @ embeddings.T
    assert similarity[0, 1] > similarity[0, 2]  # a real, trained encoder


def test_local_directory(tiny_causal_dir, tmp_path):
    assert resolve_model(str(tiny_causal_dir)) == tiny_causal_dir
    (tmp_path / "empty").mkdir()
    with pytest.raises(ModelResolutionError, match="not a model directory"):
        resolve_model(str(tmp_path / "empty"))
    with pytest.raises(ModelResolutionError, match="no such model directory"):
        resolve_model(str(tmp_path / "missing"))


def test_offline_hub_id_names_the_alternatives():
    with pytest.raises(ModelResolutionError) as error:
        resolve_model("google-t5/t5-base-definitely-not-cached")
    message = str(error.value)
    assert "minilm-l6" in message and "smollm2-135m" in message and "local model directory" in message


@pytest.mark.slow
def test_smollm2_alias_converts_once_and_generates(monkeypatch, tmp_path):
    from transformers import AutoModelForCausalLM, AutoTokenizer

    monkeypatch.setenv("SYNTHQ_CACHE", str(tmp_path))
    path = resolve_model("smollm2-135m")
    assert path == tmp_path / "models" / "smollm2-135m" and (path / "config.json").is_file()
    assert resolve_model("smollm2-135m") == path  # cached: no second conversion
    tokenizer = AutoTokenizer.from_pretrained(path)
    model = AutoModelForCausalLM.from_pretrained(path)
    assert model.config.model_type == "llama"
    assert sum(p.numel() for p in model.parameters()) > 100_000_000
    inputs = tokenizer("The capital of France is", return_tensors="pt")
    output = model.generate(**inputs, max_new_tokens=3, do_sample=False)
    assert "Paris" in tokenizer.decode(output[0])


def test_a_file_or_a_path_under_a_local_directory_is_never_looked_up_on_the_hub(tmp_path, monkeypatch):
    """Issue #74: a weights file or a mistyped ``runs/gen`` was taken for a hub id (30 s of
    network wait before the error)."""
    import huggingface_hub

    def no_network(*args, **kwargs):
        raise AssertionError("looked up on the hub")

    monkeypatch.setattr(huggingface_hub, "snapshot_download", no_network)
    monkeypatch.chdir(tmp_path)
    (tmp_path / "model.safetensors").write_bytes(b"weights")
    (tmp_path / "runs").mkdir()
    with pytest.raises(ModelResolutionError, match="is a file, not a model directory"):
        resolve_model("model.safetensors")
    with pytest.raises(ModelResolutionError, match=r"no such model directory \(./runs is a local directory"):
        resolve_model("runs/gen")

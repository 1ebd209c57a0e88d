"""Model artifacts carry a Hugging Face model card stating their guarantee."""

from __future__ import annotations

from synthq.artifacts.create import create_artifact
from synthq.artifacts.manifest import open_artifact
from synthq.privacy.accounting import epsilon_for
from synthq.privacy.guarantee import Guarantee


def test_model_artifacts_carry_a_model_card(tmp_path):
    guarantee = Guarantee(
        epsilon=epsilon_for(0.91, 1e-5, 0.05, 300).epsilon, delta=1e-5, unit="query", mechanism="dp-adam",
        accountant="rdp", details={"noise_multiplier": 0.91, "sample_rate": 0.05, "steps": 300},
        derived_from=["ab" * 32],
    )  # fmt: skip
    with create_artifact(tmp_path / "gen", "finetune-lm", {"epsilon": 8}) as writer:
        (writer.dir / "model.safetensors").write_bytes(b"w")
        writer.privacy = guarantee
    card = (tmp_path / "gen" / "README.md").read_text()
    facts = (f"| ε | {guarantee.epsilon:.4g} |", "| δ | 1e-05 |", "query", "dp-adam", "| accountant | rdp |",
             "noise_multiplier | 0.91", "abababab")  # fmt: skip
    for fact in facts:
        assert fact in card
    assert "run in this directory `synthq ledger . --statement`" in card  # the reviewer's statement
    assert open_artifact(tmp_path / "gen").manifest["files"]["README.md"]  # hashed and verified
    with create_artifact(tmp_path / "ret", "train-retriever", {}) as writer:
        (writer.dir / "README.md").write_text("---\nlibrary_name: sentence-transformers\n---\n# ST card\n")
        writer.privacy = Guarantee.non_private("trained on private queries without DP")
    card = (tmp_path / "ret" / "README.md").read_text()
    assert card.startswith("---\nlibrary_name: sentence-transformers") and "# ST card" in card
    assert "| ε | ∞ (no differential privacy) |" in card and "Not private" in card
    with create_artifact(tmp_path / "ev", "eval", {}) as writer:
        writer.privacy = Guarantee.public()
    assert not (tmp_path / "ev" / "README.md").exists()

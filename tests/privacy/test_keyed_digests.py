"""Private data named by keyed digests, and the owner's key through `synthq key`."""

from __future__ import annotations

from typer.testing import CliRunner

from synthq.artifacts.manifest import open_artifact
from synthq.cli.app import app
from synthq.privacy import keys
from synthq.runtime.hashing import sha256_tree
from tests.helpers import finetune, private_copy, released_text


def test_private_data_is_identified_by_a_keyed_digest(tmp_path, tiny_beir, tiny_causal_dir, monkeypatch):
    data = private_copy(tmp_path, tiny_beir)
    artifact = finetune(tmp_path, data, tiny_causal_dir, "gen", epsilon=8.0, max_steps=2)
    plain = sha256_tree(data)
    recorded = artifact.inputs[0]["sha256"]
    assert recorded.startswith("hmac:") and plain not in released_text(artifact)
    assert keys.private_data_digest(plain) == recorded  # stable under the same key
    monkeypatch.setenv("SYNTHQ_STATE", str(tmp_path / "another-installation"))
    assert keys.private_data_digest(plain) != recorded  # meaningless under another
    foreign = open_artifact(artifact.path)  # readable, but not verifiable here
    assert not foreign.verified and any("sealed under another key" in a for a in foreign.privacy.assumptions)


def test_the_key_command_shows_exports_and_imports(tmp_path, monkeypatch):
    runner = CliRunner()
    shown = runner.invoke(app, ["key"])
    assert shown.exit_code == 0 and keys.key_id() in shown.output
    exported = runner.invoke(app, ["key", "--export", str(tmp_path / "team.key")])
    assert exported.exit_code == 0 and (tmp_path / "team.key").stat().st_mode & 0o777 == 0o600
    monkeypatch.setenv("SYNTHQ_STATE", str(tmp_path / "colleague"))
    other = keys.key_id()
    refused = runner.invoke(app, ["key", "--import", str(tmp_path / "team.key")])
    assert refused.exit_code != 0 and keys.key_id() == other
    installed = runner.invoke(app, ["key", "--import", str(tmp_path / "team.key"), "--replace"])
    assert installed.exit_code == 0 and keys.key_id() != other

"""How manifests record paths: absolute, so the ledger works from any directory, but never through a
symbolic link's target (which may name more than the user chose to publish)."""

from __future__ import annotations

import os

from synthq.runtime.paths import recorded_path


def test_a_path_is_recorded_absolute_and_a_link_is_not_resolved(tmp_path, monkeypatch):
    target = tmp_path / "vault" / "cohort-of-a-named-clinic"
    target.mkdir(parents=True)
    (tmp_path / "current").symlink_to(target)
    monkeypatch.chdir(tmp_path)
    assert recorded_path("current") == str(tmp_path / "current")
    assert "cohort" not in recorded_path("current")
    assert recorded_path("vault/../current") == str(tmp_path / "current")
    assert recorded_path("smollm2-135m") == "smollm2-135m"  # not a path: as given
    assert os.path.isabs(recorded_path("vault"))

"""The expected minutes hold on the machine at hand: the reference machine's figure times this
machine's factor (a short probe here over its time there, cached per machine for an hour, or
SYNTHQ_MACHINE_FACTOR), and every figure says what it rests on. The probe itself is injected:
these tests are deterministic."""

from __future__ import annotations

import json

import pytest

from synthq.models import stage_costs
from synthq.runtime.errors import SettingError


@pytest.fixture
def probing(monkeypatch, tmp_path):
    monkeypatch.delenv(stage_costs.MACHINE_FACTOR, raising=False)
    monkeypatch.setenv(stage_costs.MACHINE_PROBE, "1")
    monkeypatch.setenv("SYNTHQ_CACHE", str(tmp_path / "cache"))
    stage_costs._this_machine.cache_clear()
    yield
    stage_costs._this_machine.cache_clear()


def test_the_probe_factor_is_the_probe_here_over_its_time_on_the_reference(probing):
    reference = stage_costs.reference_probe_seconds()
    calls = []

    def probe():
        calls.append(1)
        return 4.1 * reference

    speed = stage_costs.machine_speed(probe=probe, now=1000.0)
    assert speed == stage_costs.MachineSpeed(pytest.approx(4.1), "probe")
    # cached for this machine: a second command within the hour runs no probe
    assert stage_costs.machine_speed(probe=probe, now=1000.0 + 3000).factor == pytest.approx(4.1)
    assert len(calls) == 1
    # an hour later the load may have changed: probed again
    stage_costs.machine_speed(probe=lambda: 2 * reference, now=1000.0 + stage_costs.PROBE_MAX_AGE + 1)
    stored = json.loads(stage_costs._probe_path().read_text())
    assert list(stored) == [stage_costs._machine_key()]
    assert stored[stage_costs._machine_key()]["seconds"] == pytest.approx(2 * reference)


def test_the_probes_reference_time_is_its_share_of_the_measured_retriever_step():
    per_pair = stage_costs.reference_costs()["retriever_seconds_per_pair"]
    expected = stage_costs.PROBE_PAIRS * per_pair / 6 * stage_costs.PROBE_LAYER_SHARE
    assert stage_costs.reference_probe_seconds() == pytest.approx(expected)


def test_an_injected_factor_wins_and_probe_0_keeps_the_reference_figure(probing, monkeypatch):
    def no_probe():
        raise AssertionError("probed")

    monkeypatch.setenv(stage_costs.MACHINE_FACTOR, "5")
    assert stage_costs.machine_speed(probe=no_probe) == stage_costs.MachineSpeed(5.0, "SYNTHQ_MACHINE_FACTOR")
    monkeypatch.setenv(stage_costs.MACHINE_FACTOR, "-1")
    with pytest.raises(SettingError, match="SYNTHQ_MACHINE_FACTOR must be a number > 0"):
        stage_costs.machine_speed(probe=no_probe)
    monkeypatch.delenv(stage_costs.MACHINE_FACTOR)
    monkeypatch.setenv(stage_costs.MACHINE_PROBE, "0")
    assert stage_costs.machine_speed(probe=no_probe) is None


def test_the_line_a_stage_prints_gives_this_machines_minutes_and_their_basis(probing, monkeypatch):
    assert stage_costs.expected_line(600, speed=None) == (
        "expected about 10 min on 2 CPU cores (synthq's reference machine; a GPU takes far less)"
    )
    line = stage_costs.expected_line(600, speed=stage_costs.MachineSpeed(4.1, "probe"))
    assert line == (
        "expected about 41 min on this machine (probe: 4.1× the reference machine, 2 CPU cores, where "
        "it takes 10 min; a GPU takes far less)"
    )
    monkeypatch.setenv(stage_costs.MACHINE_FACTOR, "2.5")  # what a stage's default reads, once a process
    assert stage_costs.expected_line(3 * 3600).startswith("expected about 7.5 h on this machine")
    assert stage_costs.expected_line(None).startswith("expected time: no measured cost")


def test_a_plan_takes_an_old_probe_and_says_how_old(probing):
    reference = stage_costs.reference_probe_seconds()
    stage_costs.machine_speed(probe=lambda: 3 * reference, now=0.0)
    later = 5 * 3600.0

    def no_probe():
        raise AssertionError("probed")

    old = stage_costs.machine_speed(probe=no_probe, now=later, max_age=float("inf"))
    assert old == stage_costs.MachineSpeed(pytest.approx(3.0), "probe 5 h ago")
    assert stage_costs.machine_speed(probe=lambda: reference, now=later).basis == "probe"  # a stage probes


@pytest.mark.parametrize(
    "stored", [None, {}, {"at": 0.0}, {"seconds": "x", "at": 0.0}, {"seconds": -1, "at": 0.0}]
)
def test_a_first_plan_on_a_machine_or_a_damaged_record_probes(probing, stored):
    reference = stage_costs.reference_probe_seconds()
    if stored is not None:
        stage_costs._write_probe({stage_costs._machine_key(): stored})
    speed = stage_costs.machine_speed(probe=lambda: 2 * reference, now=100.0, max_age=float("inf"))
    assert speed == stage_costs.MachineSpeed(pytest.approx(2.0), "probe")

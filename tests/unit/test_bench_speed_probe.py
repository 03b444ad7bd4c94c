"""bench/speed_probe.py: the machine-speed probe of the benchmarks (its pure parts and one real sample)."""
from __future__ import annotations

import pathlib
import sys
import time

import pytest

sys.path.insert(0, str(pathlib.Path(__file__).resolve().parents[2] / 'bench'))

import speed_probe as sp  # noqa: E402  pylint: disable=wrong-import-position


def test_the_mean_takes_only_the_samples_inside_the_window():
    samples = [(10.0, 0.030), (15.0, 0.040), (20.0, 0.050), (25.0, 0.090)]
    assert sp.mean_between(samples, 14.0, 20.0) == pytest.approx(0.045)
    assert sp.mean_between(samples, 10.0, 10.0) == pytest.approx(0.030)   # both ends inside
    assert sp.mean_between(samples, 30.0, 40.0) is None


def test_a_run_on_a_slower_machine_is_brought_down_to_the_faster_ones_speed():
    # the rollout ran while the probe took 40 ms, its floor while it took 30 ms: the rollout's 120 s at the
    # floor's speed are 90 s
    assert sp.at_speed(120.0, 0.040, 0.030) == pytest.approx(90.0)
    assert sp.at_speed(120.0, 0.030, 0.030) == pytest.approx(120.0)
    assert sp.at_speed(120.0, None, 0.030) is None
    assert sp.at_speed(120.0, 0.040, 0.0) is None


def test_the_probe_samples_in_its_thread_until_stopped():
    probe = sp.SpeedProbe(every=0.05).start()
    deadline = time.monotonic() + 10
    while len(probe.samples) < 3 and time.monotonic() < deadline:
        time.sleep(0.02)
    probe.stop()
    taken = len(probe.samples)
    assert taken >= 3
    assert all(cpu > 0 for _t, cpu in probe.samples)
    time.sleep(0.2)
    assert len(probe.samples) == taken                                    # stopped: no more samples
    assert probe.mean(0, time.time()) == pytest.approx(sum(c for _t, c in probe.samples) / taken)


def test_a_period_that_is_not_positive_is_refused():
    with pytest.raises(ValueError, match='every: 0'):
        sp.SpeedProbe(every=0)

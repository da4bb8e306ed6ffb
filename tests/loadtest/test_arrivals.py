"""Arrival processes: Poisson and gamma gaps have the right mean and spread; closed loop / burst / open loop
are told apart correctly; bad values are refused."""

import itertools
import math
import random
import statistics

import pytest

from loadtest.arrivals import ArrivalKind, LoadPoint, arrival_offsets, gamma_intervals

N = 20_000


def _gaps(rate, burstiness, seed=0):
    return list(itertools.islice(gamma_intervals(rate, burstiness, random.Random(seed)), N))


def test_poisson_gaps_are_exponential_with_mean_one_over_rate():
    scipy_stats = pytest.importorskip("scipy.stats")
    gaps = _gaps(50.0, 1.0)
    mean = statistics.fmean(gaps)
    # standard error of the mean of N exponentials is mean/sqrt(N) ~ 0.7%; 3% is > 4 sigma.
    assert mean == pytest.approx(1 / 50, rel=0.03)
    assert statistics.pstdev(gaps) / mean == pytest.approx(1.0, rel=0.03)  # CV of an exponential is 1
    # Kolmogorov-Smirnov against Exp(rate): a correct sampler fails this 0.1% of the time.
    assert scipy_stats.kstest(gaps, "expon", args=(0, 1 / 50)).pvalue > 1e-3


def test_poisson_counts_in_windows_have_variance_equal_to_mean():
    offsets = list(itertools.islice(arrival_offsets(100.0, 1.0, random.Random(1)), N))
    counts = [0] * int(offsets[-1])  # arrivals in each 1 s window: Poisson(100)
    for t in offsets:
        if int(t) < len(counts):
            counts[int(t)] += 1
    assert statistics.fmean(counts) == pytest.approx(100, rel=0.05)
    assert statistics.pvariance(counts) == pytest.approx(100, rel=0.35)  # ~200 windows: var of var is large


@pytest.mark.parametrize("burstiness", [0.25, 4.0])
def test_gamma_keeps_the_mean_rate_and_sets_cv_to_one_over_sqrt_burstiness(burstiness):
    gaps = _gaps(20.0, burstiness)
    mean = statistics.fmean(gaps)
    assert mean == pytest.approx(1 / 20, rel=0.05)
    assert statistics.pstdev(gaps) / mean == pytest.approx(1 / math.sqrt(burstiness), rel=0.06)


def test_offsets_start_at_zero_and_are_seeded():
    a = list(itertools.islice(arrival_offsets(10.0, 1.0, random.Random(7)), 50))
    b = list(itertools.islice(arrival_offsets(10.0, 1.0, random.Random(7)), 50))
    assert a[0] == 0.0 and a == b and a == sorted(a)
    assert list(itertools.islice(arrival_offsets(math.inf, 1.0, random.Random(0)), 3)) == [0.0, 0.0, 0.0]


def test_load_point_kinds():
    assert LoadPoint(max_concurrency=4).kind is ArrivalKind.CLOSED_LOOP
    assert LoadPoint().kind is ArrivalKind.BURST
    assert LoadPoint(5.0).kind is ArrivalKind.POISSON
    assert LoadPoint(5.0, burstiness=0.5).kind is ArrivalKind.GAMMA
    assert LoadPoint(5.0, max_concurrency=2).kind is ArrivalKind.POISSON
    assert "closed-loop" in LoadPoint(max_concurrency=4).describe()


@pytest.mark.parametrize(
    "kwargs", [{"request_rate": 0}, {"request_rate": -1}, {"burstiness": 0}, {"max_concurrency": 0}]
)
def test_load_point_refuses_bad_values(kwargs):
    with pytest.raises(ValueError):
        LoadPoint(**kwargs)

"""MIB's summaries of a faithfulness curve (integrated circuit performance ratio, circuit-model
distance) against a hand computation on a made-up curve, with intervals clustered by fact."""

from __future__ import annotations

import numpy as np
import pytest
import torch
from scipy.stats import bootstrap

from mechlingo.analyses.circuits.faithfulness import curve_areas


def _curve(ups: list[list[float]]) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    """Per-row readouts whose ``readout - corrupted`` are ``ups`` (one list per point), with
    ``clean - corrupted = 1`` on every row."""
    corrupted = torch.tensor([-3.0, -2.0, -4.0, -1.0], dtype=torch.float64)
    clean = corrupted + 1.0
    readout = torch.stack([corrupted + torch.tensor(u, dtype=torch.float64) for u in ups])
    return readout, clean, corrupted


def test_areas_of_a_made_up_curve_by_hand():
    # x = 0, 0.1, 0.5, 1 and f = 0, 0.5, 0.8, 1 (the ends added: corrupted and clean runs)
    readout, clean, corrupted = _curve([[0.4, 0.6, 0.5, 0.5], [0.7, 0.9, 0.8, 0.8]])
    got = curve_areas(readout, [1, 5], 10, clean, corrupted, ["a", "b", "c", "d"])
    cpr = 0.1 * (0 + 0.5) / 2 + 0.4 * (0.5 + 0.8) / 2 + 0.5 * (0.8 + 1) / 2  # 0.735
    cmd = 0.1 * (1 + 0.5) / 2 + 0.4 * (0.5 + 0.2) / 2 + 0.5 * (0.2 + 0) / 2  # 0.265
    assert got["cpr"]["value"] == pytest.approx(cpr) == pytest.approx(0.735)
    assert got["cmd"]["value"] == pytest.approx(cmd) == pytest.approx(0.265)
    assert got["n"] == 4 and got["points"] == 4
    assert got["cpr"]["lo"] <= got["cpr"]["value"] <= got["cpr"]["hi"]
    # above 1 the distance counts the overshoot: f = 0, 1.5, 1 at x = 0, 0.5, 1
    readout, clean, corrupted = _curve([[1.5] * 4])
    over = curve_areas(readout, [5], 10, clean, corrupted, list("abcd"))
    assert over["cpr"]["value"] == pytest.approx(0.5 * 0.75 + 0.5 * 1.25)
    assert over["cmd"]["value"] == pytest.approx(0.5 * (1 + 0.5) / 2 + 0.5 * (0.5 + 0) / 2)


def test_area_intervals_are_clustered_by_fact_and_match_scipy():
    g = torch.Generator().manual_seed(3)
    n = 9
    ups = torch.rand(3, n, generator=g, dtype=torch.float64) * torch.tensor([[0.5], [0.9], [1.1]])
    corrupted = torch.randn(n, generator=g, dtype=torch.float64)
    gap = 0.5 + torch.rand(n, generator=g, dtype=torch.float64)
    clean, readout = corrupted + gap, corrupted + ups * gap
    ids = [f"f{i}" for i in range(n)]
    got = curve_areas(readout, [2, 20, 60], 100, clean, corrupted, ids)
    # a fact's rows count once: a repeated row changes nothing
    twice = curve_areas(
        torch.cat([readout, readout[:, :1]], 1), [2, 20, 60], 100,
        torch.cat([clean, clean[:1]]), torch.cat([corrupted, corrupted[:1]]), [*ids, "f0"],
    )  # fmt: skip
    for k in ("cpr", "cmd"):
        assert twice[k] == pytest.approx(got[k])
    x = np.array([0, 2, 20, 60, 100]) / 100

    def areas(num, den):  # num [point, fact], den [fact]: the curve with its two ends
        f = np.concatenate([[0.0], num.mean(1) / den.mean(), [1.0]])
        return np.trapezoid(f, x), np.trapezoid(np.abs(1 - f), x)

    num = (readout - corrupted).numpy()
    den = gap.numpy()
    est = areas(num, den)
    assert got["cpr"]["value"] == pytest.approx(float(est[0]))
    ref = bootstrap(
        (np.arange(n),), lambda i: np.array(areas(num[:, i], den[i])), vectorized=False,
        n_resamples=2000, method="percentile", rng=np.random.default_rng(0),
    ).confidence_interval  # fmt: skip
    assert (got["cpr"]["lo"], got["cpr"]["hi"]) == pytest.approx((ref.low[0], ref.high[0]))
    assert (got["cmd"]["lo"], got["cmd"]["hi"]) == pytest.approx((ref.low[1], ref.high[1]))
    few = curve_areas(readout[:, :2], [2, 20, 60], 100, clean[:2], corrupted[:2], ids[:2])
    assert np.isnan(few["cpr"]["lo"]) and np.isfinite(few["cpr"]["value"])

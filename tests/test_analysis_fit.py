"""The weighted fit of log d = a + b·L: recovery, independence, edge cases."""

import json

import numpy as np
import pytest

from analysis.fit import fit_log_width, load_fit, save_fit
from analysis.results import AnalysisInputError

DEPTHS = np.array([6.0, 12.0, 18.0, 24.0, 30.0, 36.0])
TRUE_A, TRUE_B = 5.0, 0.055
# Relative width errors (σ of log d) of different size per point, as in a real sweep.
SIGMA_LOG = np.array([0.10, 0.08, 0.12, 0.06, 0.09, 0.07])


def _draw(rng):
    log_width = TRUE_A + TRUE_B * DEPTHS + rng.normal(0.0, SIGMA_LOG)
    widths = np.exp(log_width)
    return widths, SIGMA_LOG * widths  # Δd = σ_log d · d


def test_fit_recovery_monte_carlo():
    rng = np.random.default_rng(1234)
    estimates, sigmas, inside_a, inside_b = [], [], 0, 0
    for _ in range(200):
        widths, errors = _draw(rng)
        fit = fit_log_width(DEPTHS, widths, errors)
        estimates.append((fit.a, fit.b))
        sigmas.append((fit.sigma_a, fit.sigma_b))
        inside_a += abs(fit.a - TRUE_A) <= 2 * fit.sigma_a
        inside_b += abs(fit.b - TRUE_B) <= 2 * fit.sigma_b
    assert inside_a >= 180 and inside_b >= 180
    empirical = np.std(np.array(estimates), axis=0, ddof=1)
    reported = np.mean(np.array(sigmas), axis=0)
    np.testing.assert_allclose(reported, empirical, rtol=0.25)


def test_fit_matches_closed_form_weighted_least_squares():
    rng = np.random.default_rng(7)
    widths, errors = _draw(rng)
    fit = fit_log_width(DEPTHS, widths, errors)
    y, sigma = np.log(widths), errors / widths
    design = np.stack([np.ones_like(DEPTHS), DEPTHS], axis=1)
    weights = np.diag(1.0 / sigma ** 2)
    normal = design.T @ weights @ design
    cov = np.linalg.inv(normal)
    coef = cov @ design.T @ weights @ y
    np.testing.assert_allclose([fit.a, fit.b], coef, rtol=1e-8, atol=1e-12)
    np.testing.assert_allclose(fit.cov, cov, rtol=1e-8, atol=1e-14)
    residual = y - design @ coef
    chi2 = np.sum(residual ** 2 / sigma ** 2)
    assert fit.chi2_red == pytest.approx(chi2 / (len(DEPTHS) - 2), rel=1e-8)
    mean = np.average(y, weights=1 / sigma ** 2)
    assert fit.r2 == pytest.approx(1 - chi2 / np.sum((y - mean) ** 2 / sigma ** 2), rel=1e-8)


def test_exact_line_gives_zero_chi2_and_unit_r2():
    widths = np.exp(TRUE_A + TRUE_B * DEPTHS)
    fit = fit_log_width(DEPTHS, widths, 0.05 * widths)
    assert fit.a == pytest.approx(TRUE_A, abs=1e-9) and fit.b == pytest.approx(TRUE_B, abs=1e-10)
    assert fit.chi2_red == pytest.approx(0.0, abs=1e-12) and fit.r2 == pytest.approx(1.0)


def test_two_points_fit_without_chi2():
    fit = fit_log_width([6, 12], [200.0, 280.0], [20.0, 30.0])
    assert fit.b == pytest.approx((np.log(280) - np.log(200)) / 6)
    assert fit.chi2_red is None and fit.n_points == 2
    assert fit.sigma_a > 0 and fit.sigma_b > 0


def test_larger_errors_give_larger_uncertainty():
    widths = np.exp(TRUE_A + TRUE_B * DEPTHS)
    small = fit_log_width(DEPTHS, widths, 0.05 * widths)
    large = fit_log_width(DEPTHS, widths, 0.20 * widths)
    assert large.sigma_b == pytest.approx(4 * small.sigma_b)  # absolute sigma: not rescaled by scatter


@pytest.mark.parametrize("depths, widths, errors, match", [
    ([6], [200.0], [10.0], "not enough points"),
    ([6, 6], [200.0, 210.0], [10.0, 10.0], "not enough points"),
    ([6, 12], [200.0, 300.0], [0.0, 10.0], "positive"),
    ([6, 12], [200.0, -3.0], [10.0, 10.0], "positive"),
])
def test_bad_fit_input(depths, widths, errors, match):
    with pytest.raises(AnalysisInputError, match=match):
        fit_log_width(depths, widths, errors)


def test_save_and_load_round_trip(tmp_path):
    rng = np.random.default_rng(3)
    fit = fit_log_width(DEPTHS, *_draw(rng), name="demo")
    save_fit(fit, tmp_path / "fit.json")
    data = json.loads((tmp_path / "fit.json").read_text())
    assert {"a", "b", "cov"} <= set(data)
    assert load_fit(tmp_path / "fit.json") == fit


def test_load_fit_rejects_bad_files(tmp_path):
    (tmp_path / "bad.json").write_text("{not json")
    (tmp_path / "short.json").write_text('{"a": 1.0}')
    with pytest.raises(AnalysisInputError, match="not valid JSON"):
        load_fit(tmp_path / "bad.json")
    with pytest.raises(AnalysisInputError, match="lacks b, cov"):
        load_fit(tmp_path / "short.json")

"""The audit's statistics (``normfl.privacy.audit.stats``): a bound that never claims more than a mechanism leaks,
sees a broken one, and stays at 0 when there is nothing to see. The canaries that feed it through each
mechanism's real code path are issue 30's next step; here the scores are drawn from the mechanism's law."""

import dp_accounting as dpa
import numpy as np
import pytest

from normfl.privacy.audit.stats import eps_lower, rate_bounds

DELTA = 1e-5
THRESHOLDS = np.linspace(0.0, 3.0, 7)


def gaussian_eps(sigma: float) -> float:
    """ε(δ) of one Gaussian release of sensitivity 1 and noise σ (dp-accounting's PLD)."""
    return dpa.pld.PLDAccountant().compose(dpa.GaussianDpEvent(sigma)).get_epsilon(DELTA)


def scores(sigma: float, m: int, seed: int):
    """What the observer sees of a canary of norm 1 under N(0, σ²) noise, projected on its direction."""
    rng = np.random.default_rng(seed)
    return 1.0 + sigma * rng.standard_normal(m), sigma * rng.standard_normal(m)


def test_rate_bounds_are_exact_clopper_pearson():
    lo, hi = rate_bounds(0, 100, 0.05)
    assert lo == 0 and hi == pytest.approx(1 - 0.025 ** (1 / 100), rel=1e-9)
    lo, hi = rate_bounds(100, 100, 0.05)
    assert hi == 1 and lo == pytest.approx(0.025 ** (1 / 100), rel=1e-9)


@pytest.mark.parametrize("sigma", [0.5, 1.0, 2.0])
def test_a_correct_gaussian_is_bounded_below_its_certificate_and_the_bound_has_power(sigma):
    certified = gaussian_eps(sigma)
    got = eps_lower(*scores(sigma, 20_000, 1), DELTA, THRESHOLDS * sigma)["eps_lower"]
    assert 0.3 * certified < got < certified          # 20,000 canaries a side: 39-45% of the certificate


def test_a_privatizer_with_a_tenth_of_the_noise_is_refuted():
    """Thresholds chosen for the claimed σ = 2 (ε = 1.99); the noise actually added is 0.2."""
    claimed = gaussian_eps(2.0)
    assert eps_lower(*scores(0.2, 5_000, 2), DELTA, THRESHOLDS * 2.0)["eps_lower"] > claimed + 2


def test_null_and_correct_audits_stay_within_their_confidence_over_many_seeds():
    """α = 0.05: canaries never inserted give a positive bound, and a correct mechanism a bound above its
    certificate, in at most 5 of 100 audits (the bound is conservative: Bonferroni over 14 tests)."""
    certified = gaussian_eps(1.0)
    def never_inserted(seed):                         # "in" and "out" canaries alike: nothing to see
        rng = np.random.default_rng(seed)
        return rng.standard_normal(2_000), rng.standard_normal(2_000)

    null = [eps_lower(*never_inserted(seed), DELTA, THRESHOLDS)["eps_lower"] for seed in range(100)]
    correct = [eps_lower(*scores(1.0, 2_000, 1000 + seed), DELTA, THRESHOLDS)["eps_lower"] for seed in range(100)]
    assert np.mean(np.array(null) > 0) <= 0.05 and max(null) < 0.5
    assert np.mean(np.array(correct) > certified) <= 0.05

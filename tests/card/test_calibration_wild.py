"""The calibration's wild-cluster-bootstrap comparison (``mechlingo.card.calibration_wild``):
wildboottest's WCR p of a mean against the card's CR2 t test on the same data."""

from __future__ import annotations

import numpy as np
import pytest

pytest.importorskip(
    "wildboottest",
    reason="wildboottest (the test extra) is not installed: pip install 'mechlingo[test]'",
)

from mechlingo.card.calibration_wild import compare_wild, wild_p  # noqa: E402
from mechlingo.card.clustered_tests import mean_test  # noqa: E402
from mechlingo.core.errors import InputError  # noqa: E402


def test_the_wild_p_agrees_with_the_cr2_t_test_on_which_side_of_005_a_mean_falls():
    """12 documents of 6 sentences: a mean 1.5 document SDs away from the null is rejected by
    both, the null itself by neither (the wild p is a bootstrap rate, between 1/199 and 1)."""
    rng = np.random.default_rng(3)
    codes = np.repeat(np.arange(12), 6)
    y = rng.normal(0, 1, 12)[codes] + rng.normal(0, 0.5, len(codes))
    far, near = float(y.mean()) - 1.5, float(y.mean())
    assert wild_p(y, codes, far, b=199) < 0.05 and mean_test(y, codes, null=far).p < 0.05
    assert wild_p(y, codes, near, b=199) > 0.5 and mean_test(y, codes, null=near).p > 0.5


def test_compare_wild_says_what_it_cannot_compare():
    with pytest.raises(InputError):
        compare_wild("median", None, 1)  # type: ignore[arg-type]

"""One sort for every group: the grouped AUROC/AP kernel equals one group at a time."""

from __future__ import annotations

import numpy as np
import pytest
import torch
from sklearn.metrics import average_precision_score, roc_auc_score

from mechlingo.core.errors import InputError
from mechlingo.kernels.grouped import grouped_auroc_and_average_precision
from mechlingo.kernels.ranking import auroc_and_average_precision


@pytest.mark.parametrize("ties", [False, True])
@pytest.mark.parametrize("dtype", [torch.float32, torch.float16, torch.float64])
def test_grouped_equals_one_group_at_a_time(ties, dtype):
    """AUROC bit for bit, AP to float64 rounding, ties (including -0.0 == 0.0) and a constant
    feature included; float64 takes the one-group path."""
    g = torch.Generator().manual_seed(3)
    n, f, n_groups = 113, 29, 5
    x = torch.randn(n, f, generator=g)
    if ties:
        x = torch.randint(0, 3, (n, f), generator=g).float()
        x[:7, 2] = -0.0
    x[:, 0] = 1.5
    x = x.to(dtype)
    grp = torch.randint(0, n_groups, (n,), generator=g)
    grp[:n_groups] = torch.arange(n_groups)
    au, ap = grouped_auroc_and_average_precision(x, grp, n_groups)
    assert au.shape == ap.shape == (n_groups, f) and au.dtype == torch.float64
    for i in range(n_groups):
        ra, rp = auroc_and_average_precision(x, grp == i)
        assert torch.equal(au[i], ra)
        torch.testing.assert_close(ap[i], rp, rtol=0, atol=1e-14)
    xs, gs = x.double().numpy(), grp.numpy()
    for j in (0, 1, 2, f - 1):
        for i in range(n_groups):
            assert abs(float(au[i, j]) - roc_auc_score(gs == i, xs[:, j])) < 1e-12
            assert abs(float(ap[i, j]) - average_precision_score(gs == i, xs[:, j])) < 1e-12
    assert float(au[0, 0]) == 0.5  # a constant feature


def test_grouped_wide_input_in_blocks():
    """More features than one block holds: blocks are independent."""
    g = torch.Generator().manual_seed(4)
    x = torch.randn(600, 1000, generator=g)
    grp = torch.arange(600) % 3
    au, ap = grouped_auroc_and_average_precision(x, grp, 3)
    ra, rp = auroc_and_average_precision(x, grp == 1)
    assert torch.equal(au[1], ra)
    assert np.abs((ap[1] - rp).numpy()).max() < 1e-14


def test_grouped_errors():
    x = torch.randn(6, 2)
    with pytest.raises(InputError, match="one entry per row"):
        grouped_auroc_and_average_precision(x, torch.zeros(5, dtype=torch.long), 2)
    with pytest.raises(InputError, match="in \\[0, 2\\)"):
        grouped_auroc_and_average_precision(x, torch.tensor([0, 1, 2, 0, 1, 0]), 2)
    with pytest.raises(InputError, match="no samples"):
        grouped_auroc_and_average_precision(x, torch.tensor([0, 0, 0, 0, 0, 0]), 2)
    bad = x.clone()
    bad[0, 0] = float("nan")
    with pytest.raises(InputError, match="NaN"):
        grouped_auroc_and_average_precision(bad, torch.tensor([0, 1, 0, 1, 0, 1]), 2)

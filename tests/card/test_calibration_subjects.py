"""The calibration design of facts whose subjects are shared across relations
(``mechlingo.card.calibration_subjects``): the card's interval clustered by fact id covers
the true value too seldom, clustered by subject (the clusters the rows now pass) at least
0.93 within two Monte Carlo SEs. Fast part only (a few CPU-seconds); the table with more
samples is in docs/calibration.md."""

from __future__ import annotations

import pytest

from mechlingo.card.calibration import MIN_COVERAGE
from mechlingo.card.calibration_subjects import compare_subjects, subject_ids, table_markdown
from mechlingo.card.repair_items import item_clusters
from mechlingo.core.errors import InputError


def test_the_design_shares_each_subject_across_its_relations():
    ids = subject_ids(20, 3, 4)
    assert len(ids) == 240 and len(set(ids)) == 60
    assert len(set(item_clusters(ids))) == 20  # the card's own clusters: the subjects


def test_a_continuous_mean_needs_the_subject_clusters():
    r = compare_subjects("mean", 20, 3, 4, reps=80)
    assert (r["g_fact"], r["g_subject"]) == (60, 20)
    cov_f, se_f = r["fact"]
    cov_s, se_s = r["subject"]
    assert cov_f + 2 * se_f < MIN_COVERAGE  # about 0.70: a third of the true variance seen
    assert cov_s + 2 * se_s >= MIN_COVERAGE


def test_a_paired_01_gain_covers_by_subject():
    r = compare_subjects("paired", 20, 3, 11, reps=60)
    assert r["subject"][0] + 2 * r["subject"][1] >= MIN_COVERAGE
    assert r["fact"][0] < r["subject"][0]
    assert "| paired 0/1 gain | 20 subjects x 3 relations (60 facts) x 11 languages | 60 |" in (
        table_markdown([r])
    )


def test_compare_subjects_says_what_it_cannot_compare():
    with pytest.raises(InputError):
        compare_subjects("median", 20, 3, 4)
    with pytest.raises(InputError):
        compare_subjects("mean", 20, 1, 4)

"""Circuits of several languages compared: the score-weighted overlap by hand and against its
null, and compare_languages on the tiny model (the matrices' diagonals are each circuit's own
faithfulness, the Holm p are scipy's, the shared edges lie in every circuit)."""

from __future__ import annotations

import numpy as np
import pytest
from statsmodels.stats.multitest import multipletests

from mechlingo.analyses.circuits.matrix import compare_languages, overlap_null, weighted_overlap
from mechlingo.analyses.circuits.result import find_circuit
from mechlingo.core.errors import InputError
from mechlingo.data import load_facts


def test_weighted_overlap_by_hand():
    mean_a = np.array([3.0, 1.0, 0.0, 0.0] + [0.01] * 96)
    mean_b = np.array([0.0, 1.0, 3.0, 0.0] + [0.01] * 96)
    # a = {0: 0.75, 1: 0.25}, b = {1: 0.25, 2: 0.75}: the shared weight min(0.25, 0.25)
    got = weighted_overlap([0, 1], [1, 2], mean_a, mean_b, range(100), n_null=200)
    assert got["overlap"] == pytest.approx(0.25)
    same = weighted_overlap([0, 1], [0, 1], mean_a, mean_a, range(100), n_null=200)
    assert same["overlap"] == pytest.approx(1.0) and same["p"] == pytest.approx(1 / 201)
    assert same["null_mean"] < 0.1  # two random 2-edge circuits of 100 rarely share an edge
    with pytest.raises(InputError, match="universe"):
        weighted_overlap([0, 500], [1], mean_a, mean_b, range(100))


def test_overlap_null_is_the_hypergeometric_expectation():
    null = overlap_null(10, 10, 50, n_null=4000, seed=1)
    # E|A & B| = 10 * 10 / 50 = 2; the Jaccard's mean lies near 2 / 18
    inter = null * 20 / (1 + null)  # |A & B| = J (|A| + |B|) / (1 + J)
    assert inter.mean() == pytest.approx(2.0, abs=0.05)


@pytest.fixture(scope="module")
def two(tiny):
    out = {}
    for lang in ("en", "fr"):
        facts = load_facts(langs=lang, relations="capital", limit=8)
        out[lang] = find_circuit(tiny, facts, steps=1, sizes=(3, 10), verify=0, target=0.5)
    return out


def test_compare_languages_on_the_tiny_model(tiny, two):
    res = compare_languages(tiny, two, n_null=50)
    cross = res["cross"]
    for lg, r in two.items():
        assert cross[lg][lg]["faithfulness"] == pytest.approx(r.faithfulness["faithfulness"])
        assert res["languages"][lg]["n_edges"] == len(r.circuit)
    assert set(cross["en"]) == {"en", "fr"} and cross["en"]["fr"]["n"] == two["fr"].n
    assert cross["en"]["fr"]["n_edges"] == len(two["en"].circuit)
    jac = res["jaccard"]["en-fr"]
    a = {two["en"].edge_name(e) for e in two["en"].circuit}
    b = {two["fr"].edge_name(e) for e in two["fr"].circuit}
    assert jac["jaccard"] == pytest.approx(len(a & b) / len(a | b))
    assert jac["p_holm"] == pytest.approx(multipletests([jac["p"]], method="holm")[1][0])
    assert {e["edge"] for e in res["edges"]["shared"]} == a & b
    assert {e["edge"] for e in res["edges"]["non_reference_only"]} == b - a
    with pytest.raises(InputError, match="two languages"):
        compare_languages(tiny, {"en": two["en"]})

"""Circuit selection, faithfulness with intervals clustered by fact, and find_circuit end to
end on the tiny model."""

from __future__ import annotations

import json

import numpy as np
import pytest
import torch
from scipy.stats import bootstrap, t

from mechlingo.analyses.circuits.compare import cross_faithfulness, edge_overlap
from mechlingo.analyses.circuits.faithfulness import (
    edge_intervals,
    greedy_edges,
    ratio_interval,
    top_edges,
)
from mechlingo.analyses.circuits.graph import build_graph
from mechlingo.analyses.circuits.result import find_circuit
from mechlingo.core.errors import InputError
from mechlingo.data import load_facts
from tests.viz.test_circuit_figure import drawn_edges


def test_ratio_interval_is_clustered_by_fact():
    """Rows of one fact count once: repeating a fact's rows changes nothing, and the
    interval is scipy's bootstrap of the ratio of per-fact means."""
    g = torch.Generator().manual_seed(0)
    num, den = torch.rand(8, generator=g), 1 + torch.rand(8, generator=g)
    ids = [f"f{i}" for i in range(8)]
    est, lo, hi = ratio_interval(num, den, ids)
    assert est == pytest.approx(float(num.mean() / den.mean()))
    twice = ratio_interval(torch.cat([num, num[:1]]), torch.cat([den, den[:1]]), [*ids, "f0"])
    assert twice == pytest.approx((est, lo, hi))
    ref = bootstrap(
        (num.double().numpy(), den.double().numpy()),
        lambda a, b, axis=-1: a.mean(axis) / b.mean(axis),
        paired=True, vectorized=True, n_resamples=2000, method="percentile",
        rng=np.random.default_rng(0),
    ).confidence_interval  # fmt: skip
    assert (lo, hi) == pytest.approx((ref.low, ref.high))
    assert lo < est < hi


def test_edge_intervals_are_t_intervals_over_fact_means():
    scores = torch.randn(6, 2, 3, 1, generator=torch.Generator().manual_seed(1))
    facts = ["a", "a", "b", "c", "d", "e"]
    mean, lo, hi, n = edge_intervals(scores, facts)
    per = torch.stack([scores[:2].mean(0), *scores[2:]])
    assert n == 5
    x = per[:, 1, 2, 0].double().numpy()
    want = t.interval(0.95, 4, loc=x.mean(), scale=x.std(ddof=1) / np.sqrt(5))
    assert (float(lo[1, 2, 0]), float(hi[1, 2, 0])) == pytest.approx(want, rel=1e-5)
    assert float(mean[1, 2, 0]) == pytest.approx(x.mean(), rel=1e-6)


def test_top_and_greedy_selection(tiny):
    g = build_graph(tiny)
    mean = torch.randn(*g.mask.shape, 2, generator=torch.Generator().manual_seed(2))
    top = top_edges(g, mean, 6)
    vals = [abs(float(mean[e])) for e in top]
    assert vals == sorted(vals, reverse=True) and all(bool(g.mask[s, r]) for s, r, _ in top)
    assert len(top_edges(g, mean, 10**6)) == 2 * g.n_edges
    greedy = greedy_edges(g, mean, 8)
    reached = {len(g.receivers) - 1}
    for s, r, _ in greedy:  # every edge leads to the output through the circuit
        assert r in reached
        reached.update(g.receiver_of(s))


@pytest.fixture(scope="module")
def found(tiny):
    facts = load_facts(langs="en", relations="capital", limit=10)
    return find_circuit(tiny, facts, steps=2, sizes=(0, 3, 10), verify=4, target=0.5)


def test_find_circuit_on_the_tiny_model(tiny, found):
    with pytest.raises(InputError, match="method"):
        find_circuit(tiny, [], method="acdc")
    res = found
    assert res.n >= 3 and len(res.facts) == res.clean.shape[0]
    curve = {p["n_edges"]: p["faithfulness"] for p in res.curve}
    n_all = len(res.ranked)
    assert n_all == res.graph.n_edges * len(res.labels)
    assert curve[0] == pytest.approx(0.0, abs=1e-4)  # nothing clean: the corrupted run
    assert curve[n_all] == pytest.approx(1.0, abs=1e-4)  # everything clean: the clean run
    assert res.faithfulness["faithfulness"] >= 0.5
    assert len(res.verified) == 4 and -1 <= res.spearman <= 1
    data = json.loads(json.dumps(res.to_json()))
    assert {e["edge"] for e in data["edges"]} == {res.edge_name(e) for e in res.circuit}
    assert all("exact" in e for e in data["edges"][:4])
    assert drawn_edges(res.figure().to_plotly_json()) == {e["edge"] for e in data["edges"]}
    # MIB's area under the curve, from the curve's own points (0 and every edge among them)
    x = [p["n_edges"] / n_all for p in res.curve]
    f = [p["faithfulness"] for p in res.curve]
    assert data["areas"]["cpr"]["value"] == pytest.approx(np.trapezoid(f, x), rel=1e-5)
    assert data["areas"]["cmd"]["value"] == pytest.approx(
        np.trapezoid(np.abs(1 - np.array(f)), x), rel=1e-5
    )
    assert data["areas"]["n"] == res.n


def test_cross_faithfulness_of_a_circuit_on_its_own_pairs_is_its_faithfulness(tiny, found):
    own = cross_faithfulness(tiny, found, found)
    assert own["n_edges"] == len(found.circuit)
    assert own["faithfulness"] == pytest.approx(found.faithfulness["faithfulness"], abs=1e-5)


def test_edge_overlap_against_random_circuits():
    universe = list(range(100))
    same = edge_overlap(universe[:5], universe[:5], universe, n_null=500)
    assert same["jaccard"] == 1.0 and same["p"] == pytest.approx(1 / 501)
    # the null of two random 5-edge circuits of 100: E|A & B| = 0.25, Jaccard mostly 0
    assert same["null_mean"] < 0.05
    apart = edge_overlap(universe[:5], universe[5:10], universe, n_null=500)
    assert apart["jaccard"] == 0.0 and apart["p"] == 1.0
    half = edge_overlap([1, 2, 3, 4], [3, 4, 5, 6], universe, n_null=200)
    assert half["jaccard"] == pytest.approx(2 / 6)
    with pytest.raises(InputError, match="universe"):
        edge_overlap([1000], [1], universe)

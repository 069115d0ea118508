"""Clean/corrupted pairs and position groups on the tiny model."""

from __future__ import annotations

import pytest
import torch

from mechlingo.analyses.circuits.pairs import ROLES, make_pairs
from mechlingo.analyses.recall.patching import subject_token_span
from mechlingo.core.errors import InputError
from mechlingo.data import load_facts


def test_subject_and_cross_language_pairs(tiny):
    en = load_facts(langs="en", relations="capital", limit=12)
    fr = load_facts(langs="fr", relations="capital", limit=12)
    for cross, pool in ((False, en), (True, fr)):
        p = make_pairs(tiny, en, pool=pool, cross_language=cross, readout="logit_diff")
        # equal lengths across languages are rare (the templates differ): few cross pairs
        assert len(p.clean) + p.skipped == len(en) and len(p.clean) >= (1 if cross else 3)
        assert torch.equal(p.clean_batch.lengths, p.corrupted_batch.lengths)
        for a, b in zip(p.clean, p.corrupted, strict=True):
            assert a.relation == b.relation and a.answer != b.answer
            assert (a.lang != b.lang) == cross and a.id != b.id
        assert p.readout.kind == "logit_diff" and p.readout.n_examples == len(p.clean)
    with pytest.raises(InputError, match="partner"):
        make_pairs(tiny, en[:1])


def test_position_groups_partition_the_real_tokens(tiny):
    facts = load_facts(langs="en", relations="capital", limit=12)
    p = make_pairs(tiny, facts)
    assert p.labels == list(ROLES)
    real = torch.arange(p.roles.shape[1])[None] < p.clean_batch.lengths[:, None]
    assert torch.equal(p.roles.sum(-1), real.float())  # each real token in exactly one group
    for b, f in enumerate(p.clean):
        first, last = subject_token_span(tiny, f.prompt, f.subject_span, has_bos=True)
        end = int(p.clean_batch.lengths[b]) - 1
        assert p.roles[b, end, ROLES.index("last")] == 1
        assert p.roles[b, last, ROLES.index("subject_last")] == 1
        assert p.roles[b, :first, ROLES.index("start")].all()
    flat = make_pairs(tiny, facts, positions="all")
    assert flat.labels == ["all"] and torch.equal(flat.roles[..., 0], real.float())

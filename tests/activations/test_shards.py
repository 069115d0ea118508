"""Out-of-core expert statistics: shards on disk give exactly the in-memory numbers."""

from __future__ import annotations

import csv

import numpy as np
import pytest
import torch

import mechlingo.activations.pooled as pooled_mod
from mechlingo.activations.shards import (
    MIN_MEMORY,
    PooledShards,
    ShardWriter,
    memory_budget,
    parse_memory,
    shard_scores,
)
from mechlingo.analyses.experts import ExpertError, find_experts
from mechlingo.core.errors import DataError, InputError
from mechlingo.kernels.grouped import grouped_auroc_and_average_precision
from mechlingo.kernels.ranking import auroc_and_average_precision
from tests.conftest import NTREX
from tests.forks import torchrun

TEXTS = {
    "en": ["the cat sat on the mat", "hello world", "a dog", "it is raining today again", "ok"],
    "es": ["el gato", "hola mundo que tal", "un perro grande y feo", "llueve", "vale"],
    "fr": ["le chat", "bonjour", "un chien noir", "il pleut beaucoup aujourd'hui", "oui"],
}


def _same_result(mem, disk) -> None:
    """Every number of an ExpertResult kept on disk equals the in-memory one, bit for bit."""
    assert isinstance(disk.stats.pooled, PooledShards)
    assert torch.equal(disk.stats.pooled.to_tensor(), mem.stats.pooled)
    assert torch.equal(disk.stats.lang_ids, mem.stats.lang_ids)
    assert torch.equal(disk.stats.prob_active, mem.stats.prob_active)
    for name in ("auroc", "ap", "lape"):
        a, b = getattr(mem.neuron_scores, name), getattr(disk.neuron_scores, name)
        assert torch.equal(a.nan_to_num(-7.0), b.nan_to_num(-7.0)), name
    lang = mem.langs[1]
    for value in ("mean", "median"):
        ca, cb = mem.clamp(lang, 5, value=value), disk.clamp(lang, 5, value=value)
        assert ca.neurons.keys() == cb.neurons.keys()
        for layer in ca.neurons:
            assert torch.equal(ca.neurons[layer], cb.neurons[layer])
            assert torch.equal(ca.values[layer], cb.values[layer])
    assert mem.to_dataframe(7).equals(disk.to_dataframe(7))


def test_writer_reader_round_trip_any_block(tmp_path):
    """Rows added in any order and cut into several shards read back as the same matrix,
    by blocks of any width and by columns in sentence order."""
    g = torch.Generator().manual_seed(0)
    x = torch.randn(23, 10, generator=g)
    x[3, 4] = -0.0
    order = torch.randperm(23, generator=g)
    # 5 rows per shard: the buffer is a quarter of the cap, 4 bytes per value
    w = ShardWriter(tmp_path, 10, max_memory=4 * 4 * 10 * 5)
    assert w.rows_per_shard == 5
    for chunk in order.split(7):
        w.add(x[chunk], chunk, chunk % 3)
    w.close()
    s = PooledShards(tmp_path, 10)
    assert s.shape == (23, 10) and s.n_shards == 5
    assert torch.equal(s.to_tensor(), x)
    assert torch.equal(s.lang_ids, torch.arange(23) % 3)
    for width in (1, 3, 10):
        got = torch.cat([b for _, _, b in s.blocks(width)], dim=0)
        assert torch.equal(got, x[s.storage_row_ids].T)
    feats = torch.tensor([7, 2, 7, 0])
    assert torch.equal(s[:, feats], x[:, feats])
    assert torch.equal(s[:, 2:5], x[:, 2:5])


def test_shard_errors(tmp_path):
    with pytest.raises(DataError, match="no pooled shards"):
        PooledShards(tmp_path, 4)
    w = ShardWriter(tmp_path, 4, max_memory=MIN_MEMORY)
    w.add(torch.ones(3, 4), torch.tensor([0, 1, 1]), torch.zeros(3, dtype=torch.long))
    w.close()
    with pytest.raises(DataError, match="exactly once"):
        PooledShards(tmp_path, 4)
    (tmp_path / "r00000-000000.f32").write_bytes(b"\0" * 12)
    with pytest.raises(DataError, match="cut short"):
        PooledShards(tmp_path, 4)
    with pytest.raises(DataError, match="rows of 4 features"):
        w.add(torch.ones(2, 5), torch.arange(2), torch.arange(2))


def test_memory_sizes():
    assert parse_memory("2G") == 2 * 2**30
    assert parse_memory("512MiB") == 512 * 2**20
    assert parse_memory("1.5g") == int(1.5 * 2**30)
    for bad in ("lots", "-1G", "10M"):
        with pytest.raises(InputError):
            parse_memory(bad)
    assert memory_budget() >= MIN_MEMORY
    assert memory_budget("3G") == 3 * 2**30


def test_shard_scores_equal_the_kernel_for_any_block_width(tmp_path):
    """Scores read a block of neurons at a time equal the kernel on the whole matrix, ties
    included, whatever the block width (1 .. all; None: from the cap)."""
    g = torch.Generator().manual_seed(1)
    x = torch.randint(0, 4, (40, 9), generator=g).float()  # many ties
    x[:, 0] = 0.0  # a constant neuron
    lang = torch.arange(40) % 3
    w = ShardWriter(tmp_path, 9, max_memory=4 * 4 * 9 * 6)
    w.add(x, torch.arange(40), lang)
    w.close()
    s = PooledShards(tmp_path, 9)
    for width in (1, 4, 9, None):
        au, ap = shard_scores(s, 3, width=width)
        ga, gp = grouped_auroc_and_average_precision(x, lang, 3)
        assert torch.equal(au, ga) and torch.equal(ap, gp)
        for i in range(3):
            ra, rp = auroc_and_average_precision(x, lang == i)
            assert torch.equal(au[i], ra)
            torch.testing.assert_close(ap[i], rp, rtol=0, atol=1e-14)
    assert s.block_width(MIN_MEMORY, 8) == 9
    assert s.block_width(8 * 40 * 2, 8) == 2


@pytest.mark.parametrize("pool", ["mean", "max"])
def test_out_of_core_equals_in_memory_tiny(tiny, tmp_path, monkeypatch, pool):
    """Rows streamed to 5 shards of 3 sentences (length-sorted batches of 2 cross shard
    boundaries) give the in-memory statistics, scores, clamps and table exactly."""
    mem = find_experts(tiny, TEXTS, pool=pool, batch_size=2)
    n_feat = mem.stats.n_features
    monkeypatch.setattr(pooled_mod, "memory_budget", lambda m: 4 * 4 * n_feat * 3)
    disk = find_experts(
        tiny, TEXTS, pool=pool, batch_size=2, store=tmp_path / "s", max_memory=MIN_MEMORY
    )
    assert disk.stats.meta["out_of_core"]["shards"] == 5
    _same_result(mem, disk)
    with pytest.raises(ExpertError, match="already holds pooled shards"):
        find_experts(tiny, TEXTS, store=tmp_path / "s")


@pytest.mark.slow
@pytest.mark.skipif(not (NTREX / "en.txt").is_file(), reason="no NTREX data")
def test_out_of_core_equals_in_memory_gemma(gemma, tmp_path):
    """On the embedded model (18 x 2,048 neurons), 3 languages x 40 NTREX sentences under the
    smallest cap (64 MiB: shards of 113 rows, so 2 shards) give exactly the in-memory
    result; so do narrow neuron blocks (1,000 neurons)."""
    texts = {
        lg: (NTREX / f"{lg}.txt").read_text(encoding="utf-8").splitlines()[:40]
        for lg in ("en", "es", "de")
    }
    kw = {"max_tokens": 6, "batch_size": 20}
    mem = find_experts(gemma, texts, **kw)
    disk = find_experts(gemma, texts, **kw, store=tmp_path / "s", max_memory=MIN_MEMORY)
    assert disk.stats.meta["out_of_core"]["shards"] == 2
    _same_result(mem, disk)
    au, ap = shard_scores(disk.stats.pooled, 3, width=1000)
    assert torch.equal(au, mem.neuron_scores.auroc) and torch.equal(ap, mem.neuron_scores.ap)
    assert np.isfinite(au.numpy()).all()


def _data(folder):
    folder.mkdir()
    for lang, lines in TEXTS.items():
        (folder / f"{lang}.txt").write_text("\n".join(lines) + "\n", encoding="utf-8")
    return folder


def _top(folder):
    with open(folder / "experts.csv") as f:
        return [(r["lang"], r["layer"], r["neuron"], r["auroc"]) for r in csv.DictReader(f)]


def test_cli_out_of_core_equals_in_memory(tiny_dir, tmp_path, capsys):
    """`mechlingo experts --shard-dir` (out of core) writes the same experts.csv as the default
    in-memory run; a bad --max-memory is a usage error (exit 2) that writes nothing."""
    from mechlingo.cli import main

    data = _data(tmp_path / "data")
    args = ["experts", "--model", str(tiny_dir), "--target", "es", "--k", "4", "--parallel",
            str(data), "--no-curve", "--quiet"]  # fmt: skip
    assert main([*args, "--out", str(tmp_path / "mem")]) == 0
    shards = tmp_path / "shards"
    assert main([*args, "--out", str(tmp_path / "disk"), "--shard-dir", str(shards),
                 "--max-memory", "64M"]) == 0  # fmt: skip
    assert any(shards.glob("*.f32"))
    assert _top(tmp_path / "disk") == _top(tmp_path / "mem")
    assert main([*args, "--out", str(tmp_path / "bad"), "--max-memory", "lots"]) == 2
    assert "--max-memory" in capsys.readouterr().err
    assert not (tmp_path / "bad").exists()


@pytest.mark.skipif(not torch.distributed.is_available(), reason="no torch.distributed")
def test_cli_out_of_core_under_torchrun_equals_one_process(tiny_dir, tmp_path):
    """Under torchrun (forked, :func:`tests.forks.torchrun`) 2 ranks pool half the sentences
    each into one shard folder, score half the neurons each, and rank 0 writes the
    one-process experts."""
    from mechlingo.cli import main

    data = _data(tmp_path / "data")
    args = ["experts", "--model", str(tiny_dir), "--target", "es", "--k", "4", "--parallel",
            str(data), "--no-curve", "--quiet"]  # fmt: skip
    assert main([*args, "--out", str(tmp_path / "one")]) == 0
    cmd = ["-m", "mechlingo.cli", *args, "--out", str(tmp_path / "two"),
           "--shard-dir", str(tmp_path / "shards")]  # fmt: skip
    proc = torchrun(cmd, tmp_path / "torchrun.log")
    assert proc.returncode == 0, proc.stdout[-3000:]
    names = sorted(p.name for p in (tmp_path / "shards").glob("*.f32"))
    assert names == ["r00000-000000.f32", "r00001-000000.f32"]
    assert _top(tmp_path / "two") == _top(tmp_path / "one")


def test_encode_in_chunks_equals_at_once(tiny, monkeypatch):
    """Truncating a chunk of sentences at a time gives the batch of truncating them all."""
    from mechlingo.activations.pooled import encode_sentences

    sents = [s for v in TEXTS.values() for s in v]
    whole = encode_sentences(tiny, sents, max_tokens=4)
    monkeypatch.setattr(pooled_mod, "ENCODE_CHUNK", 4)
    parts = encode_sentences(tiny, sents, max_tokens=4)
    assert torch.equal(parts.tokens, whole.tokens) and torch.equal(parts.lengths, whole.lengths)
    assert (parts.pad_id, parts.has_bos) == (whole.pad_id, whole.has_bos)

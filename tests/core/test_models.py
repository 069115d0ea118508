"""Model loading: the default-model cache, local folders, offline hub ids, passthrough."""

from __future__ import annotations

import json
import os
import subprocess
import sys

import pytest

from mechlingo.core import models
from mechlingo.core.models import ModelLoadError, load_model, weight_mode


def _fake_converter(calls):
    def convert(pkg, work):
        calls.append(work)
        out = work / "model"
        out.mkdir(parents=True)
        (out / "config.json").write_text('{"x": 1}')
        (out / "model.safetensors").write_bytes(b"\x01" * 4096)
        return out

    return convert


def test_default_cache_is_checked_and_rebuilt(tmp_path, monkeypatch):
    monkeypatch.setenv("MECHLINGO_CACHE", str(tmp_path))
    calls = []
    monkeypatch.setattr(models, "_convert_default_gguf", _fake_converter(calls))
    folder = models.ensure_default_model()
    assert len(calls) == 1 and folder == tmp_path / "gemma-3-270m"
    manifest = json.loads((folder / "mechlingo-cache.json").read_text())
    assert manifest["source_sha256"] == models._gguf_package().EXPECTED_SHA256
    assert set(manifest["files"]) == {"config.json", "model.safetensors"}
    # a valid cache is reused
    models.ensure_default_model()
    assert len(calls) == 1
    # no temporary build folders left behind
    assert [p.name for p in tmp_path.iterdir()] == ["gemma-3-270m"]
    # truncated weights: detected and rebuilt
    with open(folder / "model.safetensors", "r+b") as f:
        f.truncate(100)
    ok, why = models._cache_is_valid(folder, manifest["source_sha256"])
    assert not ok and "size" in why
    models.ensure_default_model()
    assert len(calls) == 2
    assert (folder / "model.safetensors").stat().st_size == 4096
    # same size, flipped byte: detected by the checksum and rebuilt
    data = bytearray((folder / "model.safetensors").read_bytes())
    data[10] ^= 0xFF
    (folder / "model.safetensors").write_bytes(bytes(data))
    ok, why = models._cache_is_valid(folder, manifest["source_sha256"])
    assert not ok and "checksum" in why
    models.ensure_default_model()
    assert len(calls) == 3
    # a cache built from another GGUF is rebuilt too
    manifest = json.loads((folder / "mechlingo-cache.json").read_text())
    manifest["source_sha256"] = "0" * 64
    (folder / "mechlingo-cache.json").write_text(json.dumps(manifest))
    models.ensure_default_model()
    assert len(calls) == 4


def test_interrupted_conversion_leaves_no_cache(tmp_path, monkeypatch):
    monkeypatch.setenv("MECHLINGO_CACHE", str(tmp_path))

    def broken(pkg, work):
        (work / "model").mkdir()
        raise RuntimeError("disk full")

    monkeypatch.setattr(models, "_convert_default_gguf", broken)
    with pytest.raises(RuntimeError, match="disk full"):
        models.ensure_default_model()
    assert list(tmp_path.iterdir()) == []


def test_local_folder_and_passthrough(tiny_dir, tiny):
    m = load_model(tiny_dir, device="cpu")
    assert m.cfg.n_layers == 2 and not m.training
    assert weight_mode(m) == "raw"
    assert load_model(tiny) is tiny
    with pytest.raises(ModelLoadError, match="not a TransformerLens model"):
        load_model(object())  # type: ignore[arg-type]


def test_compat_mode_is_recorded(tiny_dir):
    m = load_model(tiny_dir, device="cpu", compat=True)
    assert weight_mode(m) == "compat"


def test_bad_paths(tmp_path):
    with pytest.raises(ModelLoadError, match="does not exist"):
        load_model(tmp_path / "missing.gguf")
    with pytest.raises(ModelLoadError, match="without config.json"):
        load_model(tmp_path)
    with pytest.raises(ModelLoadError, match="does not exist"):
        load_model("./no/such/folder")


def test_hub_id_offline_gives_clear_error(tmp_path):
    env = dict(os.environ, HF_HUB_OFFLINE="1", HF_HOME=str(tmp_path))
    code = (
        "from mechlingo.core.models import load_model, ModelLoadError\n"
        "try:\n    load_model('some-org/some-model')\n"
        "except ModelLoadError as e:\n    print('ERR', e)\n"
    )
    out = subprocess.run(
        [sys.executable, "-c", code], env=env, capture_output=True, text=True, timeout=300
    )
    assert "ERR" in out.stdout, out.stderr[-2000:]
    assert "network access" in out.stdout and "local" in out.stdout


@pytest.mark.slow
def test_default_model_loads_from_cache(gemma):
    assert gemma.cfg.n_layers == 18 and gemma.cfg.d_model == 640 and gemma.cfg.d_mlp == 2048
    assert gemma.cfg.d_vocab == 262144
    assert gemma.cfg.model_name == "google/gemma-3-270m"


@pytest.mark.slow
def test_embedded_tokenizer_is_what_autotokenizer_gives(gemma):
    """The default model's tokenizer comes from ``tokenizer.json`` directly; it must encode,
    pad and decode exactly as the ``GemmaTokenizer`` that ``AutoTokenizer`` builds."""
    import torch
    from transformers import AutoTokenizer

    from mechlingo.data.io import load_facts
    from mechlingo.data.natural_parallel import bundled_parallel

    folder = models.ensure_default_model()
    auto = AutoTokenizer.from_pretrained(str(folder), add_bos_token=True)
    ours = models._embedded_tokenizer(folder)  # the model's own may carry a test's padding
    assert type(auto).__name__ == "GemmaTokenizer" and type(gemma.tokenizer) is type(ours)
    assert ours.backend_tokenizer.to_str() == auto.backend_tokenizer.to_str()
    for name in ("padding_side", "truncation_side", "model_input_names", "all_special_ids",
                 "bos_token_id", "eos_token_id", "pad_token_id", "unk_token_id", "add_bos_token",
                 "clean_up_tokenization_spaces", "model_max_length"):  # fmt: skip
        assert getattr(ours, name) == getattr(auto, name), name
    texts = [f.sentence for f in load_facts(limit=2)]  # 12 languages, 9 scripts
    texts += [line for lines in bundled_parallel().values() for line in lines[::50]]
    texts += ["<start_of_turn>user\nhi<end_of_turn>", "  two  spaces\n\ttab", "𝔘nïcode é"]
    assert ours(texts)["input_ids"] == auto(texts)["input_ids"]
    batch = texts[:5] + texts[-3:]
    assert ours(batch, padding=True).data == auto(batch, padding=True).data
    padded = auto(batch, padding=True, return_tensors="pt")["input_ids"]
    assert torch.equal(gemma.to_tokens(batch), padded)  # left-padded, as GemmaTokenizer pads
    # the backends are the same (above); the Python side decodes alike, special ids included
    ids = [[i] for i in [*range(0, len(auto), 97), *auto.all_special_ids, len(auto) - 1]]
    assert ours.batch_decode(ids) == auto.batch_decode(ids)
    assert ours.decode(padded[0], skip_special_tokens=True) == auto.decode(
        padded[0], skip_special_tokens=True
    )

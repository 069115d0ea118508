"""Exporting steering interventions for steering-vectors, repeng and llama.cpp, and reading
them back.

The round trips check that export -> save -> read gives the same tensors and metadata, the
values and layer indices against a hand computation, that the exported vector applied the
way the target applies it (added to a block output at every token) gives the same logits as
the mechlingo intervention where the two mean the same thing, and that the GGUF is what
llama.cpp's loader accepts (``common_control_vector_load_one``: ``direction.<k>`` tensors with
k >= 1, F32, 1-D, one width; architecture ``controlvector`` with ``model_hint`` and
``layer_count``), read at byte level with the ``gguf`` package's reader.
"""

from __future__ import annotations

import importlib.util
import struct
from types import SimpleNamespace

import gguf
import numpy as np
import pytest
import torch

from mechlingo.activations.runs import run_batch
from mechlingo.core.errors import InterventionError
from mechlingo.core.tokens import encode
from mechlingo.interventions import Ablation, NeuronClamp, SteeringVector
from mechlingo.interventions.export import (
    FORMATS,
    VectorExport,
    export,
    from_library,
    read_export,
    read_gguf,
)

PROMPTS = ["The capital of Italy is", "La capitale", "Die Hauptstadt von"]


@pytest.fixture(scope="module")
def deep(tmp_path_factory):
    """A tiny Gemma-3 bridge with 4 layers (llama.cpp's block 0 is off limits)."""
    from mechlingo.core.models import load_model
    from mechlingo.testing import build_tiny_folder

    folder = build_tiny_folder(tmp_path_factory.mktemp("deep") / "m", n_layers=4)
    return load_model(folder, device="cpu")


def _vec(d: int, seed: int) -> torch.Tensor:
    return torch.randn(d, generator=torch.Generator().manual_seed(seed))


def _steer(model, positions="last"):
    d = int(model.cfg.d_model)
    return (
        SteeringVector(_vec(d, 0), 2, 1.5, positions=positions)  # resid_pre 2 = block 1's output
        + SteeringVector(_vec(d, 1), 3, -0.5, site="resid_post", positions=positions)
        + SteeringVector(_vec(d, 2), 1, 2.0, site="resid_post", positions=positions)
    )


@pytest.mark.parametrize("fmt", FORMATS)
def test_round_trip_same_tensors_and_metadata(deep, tmp_path, fmt):
    iv = _steer(deep)
    iv.parts[0].meta["build"] = {"unit": "resid"}
    ex = export(iv, fmt, model=deep)
    d = int(deep.cfg.d_model)
    # resid_pre 2 and resid_post 1 are the same place (block 1's output): summed at index 1
    want = {1: 1.5 * _vec(d, 0) + 2.0 * _vec(d, 2), 3: -0.5 * _vec(d, 1)}
    assert sorted(ex.vectors) == [1, 3]
    for k, v in want.items():
        torch.testing.assert_close(ex.vectors[k], v, atol=1e-6, rtol=1e-6)
    assert ex.layer_type == "decoder_block" and ex.model_hint == "gemma3_text"
    assert any("positions 'last' do not carry over" in s for s in ex.dropped)
    assert any("units of the mean residual norm" in s for s in ex.dropped)
    assert [p["index"] for p in ex.meta["parts"]] == [1, 3, 1]
    assert ex.meta["parts"][0]["alpha_unit"] == "resid"
    path = ex.save(tmp_path / ("v.gguf" if fmt != "steering-vectors" else "v.safetensors"))
    back = read_export(path)
    assert back.format == fmt and sorted(back.vectors) == sorted(ex.vectors)
    for k in ex.vectors:
        assert torch.equal(back.vectors[k], ex.vectors[k])
    assert (back.layer_type, back.model_hint) == (ex.layer_type, ex.model_hint)
    assert back.dropped == ex.dropped and back.meta == ex.meta
    assert not list(tmp_path.glob(".*.tmp"))  # no temporary file left


def test_exported_vectors_applied_as_the_targets_do_equal_mechlingo(deep):
    # at every token ("all_with_bos") the target's edit is mechlingo's: nothing is dropped but
    # the alpha folding, and the imported intervention (added to block outputs) gives the
    # same logits on the bridge
    iv = _steer(deep, positions="all_with_bos")
    batch = encode(deep, PROMPTS)
    ref = run_batch(deep, batch, iv.fwd_hooks_for(deep, batch))
    for fmt in FORMATS:
        ex = export(iv, fmt, model=deep)
        assert not any("positions" in s for s in ex.dropped)
        back = ex.to_intervention()
        got = run_batch(deep, batch, back.fwd_hooks_for(deep, batch))
        for i, n in enumerate(batch.lengths.tolist()):
            torch.testing.assert_close(got[i, :n], ref[i, :n], atol=1e-4, rtol=0)


def test_gguf_is_what_llama_cpp_loads(deep, tmp_path):
    ex = export(_steer(deep), "llama.cpp", model=deep)
    path = ex.save(tmp_path / "cv.gguf")
    raw = path.read_bytes()
    assert raw[:4] == b"GGUF" and struct.unpack("<I", raw[4:8])[0] == 3
    n_tensors, n_kv = struct.unpack("<QQ", raw[8:24])
    assert n_tensors == 2
    reader = gguf.GGUFReader(str(path))
    keys = [k for k in reader.fields if not k.startswith("GGUF.")]  # the reader's own
    assert len(keys) == n_kv == 4 and "mechlingo.export" in keys
    arch = reader.fields["general.architecture"]
    assert bytes(arch.parts[arch.data[0]]).decode() == "controlvector"
    hint = reader.fields["controlvector.model_hint"]
    assert hint.types == [gguf.GGUFValueType.STRING]
    assert bytes(hint.parts[hint.data[0]]).decode() == "gemma3_text"
    count = reader.fields["controlvector.layer_count"]
    assert count.types == [gguf.GGUFValueType.UINT32] and int(count.parts[count.data[0]][0]) == 2
    d = int(deep.cfg.d_model)
    for t in reader.tensors:
        head, _, k = t.name.partition(".")
        assert head == "direction" and k.isdigit() and int(k) >= 1  # direction.0 is refused
        assert t.tensor_type == gguf.GGMLQuantizationType.F32
        assert len(t.shape) == 1 and int(t.n_elements) == d
        assert np.array_equal(np.asarray(t.data), ex.vectors[int(k)].numpy())


def test_reads_a_repeng_style_gguf(tmp_path):
    # a file as repeng's export_gguf writes it (no mechlingo key), written here by hand
    path = tmp_path / "repeng.gguf"
    writer = gguf.GGUFWriter(str(path), "controlvector")
    writer.add_string("controlvector.model_hint", "llama")
    writer.add_uint32("controlvector.layer_count", 2)
    for k in (3, 5):
        writer.add_tensor(f"direction.{k}", np.full(8, float(k), dtype=np.float32))
    writer.write_header_to_file()
    writer.write_kv_data_to_file()
    writer.write_tensors_to_file()
    writer.close()
    ex = read_gguf(path)
    assert ex.model_hint == "llama" and sorted(ex.vectors) == [3, 5]
    assert torch.equal(ex.vectors[5], torch.full((8,), 5.0))
    iv = ex.to_intervention()
    assert [(p.site, p.layer, p.positions) for p in iv.parts] == [
        ("resid_post", 3, "all_with_bos"),
        ("resid_post", 5, "all_with_bos"),
    ]


def test_from_library_objects_round_trip():
    sv = SimpleNamespace(layer_activations={2: torch.ones(4)}, layer_type="mlp")
    ex = from_library(sv)
    assert ex.format == "steering-vectors" and ex.layer_type == "mlp"
    assert ex.to_intervention().site == "mlp_out"
    cv = SimpleNamespace(model_type="gemma3_text", directions={1: np.zeros(4, np.float32)})
    ex = from_library(cv)
    assert ex.format == "repeng" and ex.model_hint == "gemma3_text"
    with pytest.raises(InterventionError, match="layer_type"):
        from_library(SimpleNamespace(layer_activations={}, layer_type="input_layernorm"))


def test_what_a_format_cannot_express_is_refused(deep):
    d = int(deep.cfg.d_model)
    v = torch.ones(d)
    cases = [
        (NeuronClamp({1: [0]}, 1.0), "llama.cpp", "NeuronClamp"),
        (SteeringVector(v, 2) + Ablation("attn_out", 1), "repeng", "Ablation"),
        (SteeringVector(v, 0), "steering-vectors", "resid_pre 0"),
        (SteeringVector(v, 0, site="resid_post"), "llama.cpp", "direction.0"),
        (SteeringVector(v, 1), "llama.cpp", "block 0"),
        (SteeringVector(torch.ones(int(deep.cfg.d_mlp)), 1, site="mlp_post"), "repeng", "mlp_post"),
        (SteeringVector(v, 1, site="attn_out"), "llama.cpp", "attn_out"),
        (SteeringVector(v, 1, site="resid_mid"), "steering-vectors", "resid_mid"),
        # Gemma 3's self_attn output comes before its post-attention norm: not attn_out
        (SteeringVector(v, 1, site="attn_out"), "steering-vectors", "post_attention_layernorm"),
        (SteeringVector(v, 9, site="resid_post"), "repeng", "out of range"),
        (SteeringVector(torch.ones(d + 1), 2), "llama.cpp", "d_model"),
    ]
    for iv, fmt, why in cases:
        with pytest.raises(InterventionError, match=why):
            export(iv, fmt, model=deep)
    with pytest.raises(InterventionError, match="unknown export format"):
        export(SteeringVector(v, 2), "vllm")


def test_steering_vectors_attn_and_mlp_types_where_the_family_allows(tmp_path):
    from transformers import AutoModelForCausalLM

    from mechlingo.testing import build_tiny_folder

    folder = build_tiny_folder(tmp_path / "llama", "llama")
    hf = AutoModelForCausalLM.from_pretrained(folder, dtype=torch.float32)
    v = torch.ones(32)
    ex = export(SteeringVector(v, 1, 2.0, site="mlp_out"), "steering-vectors", model=hf)
    assert ex.layer_type == "mlp" and torch.equal(ex.vectors[1], 2.0 * v)
    assert ex.model_hint == "llama"
    mixed = SteeringVector(v, 1, site="mlp_out") + SteeringVector(v, 1, site="attn_out")
    with pytest.raises(InterventionError, match="one layer_type"):
        export(mixed, "steering-vectors", model=hf)
    # the export's own intervention, attached to the plain model, is what steering-vectors
    # does there: + vector at the mlp output of layer 1, every token
    ids = torch.tensor([[1, 5, 9, 20]])
    with torch.no_grad():
        clean = hf(ids).logits
        with ex.to_intervention().attach(hf):
            ours = hf(ids).logits
        handle = hf.model.layers[1].mlp.register_forward_hook(lambda m, a, out: out + 2.0 * v)
        try:
            theirs = hf(ids).logits
        finally:
            handle.remove()
    assert not torch.allclose(ours, clean)
    torch.testing.assert_close(ours, theirs, atol=1e-5, rtol=0)


@pytest.mark.skipif(
    importlib.util.find_spec("steering_vectors") is not None, reason="steering-vectors installed"
)
def test_to_library_without_the_package_says_how():
    ex = VectorExport("steering-vectors", {1: torch.ones(4)})
    with pytest.raises(InterventionError, match="pip install steering-vectors"):
        ex.to_library()

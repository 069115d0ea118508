"""The declared extension points: a decoder and a model family defined here, each added with
one registration line, then used by the code that reads the registries (the lens, the command
line, the palette; the tiny-model builder, the sites, the transformers bridge)."""

from __future__ import annotations

import argparse
import warnings
from dataclasses import dataclass, replace

import pytest
import torch

from mechlingo.analyses.decoders import registry
from mechlingo.analyses.decoders.lens import lens_facts, logit_lens
from mechlingo.analyses.decoders.logit import LogitLens
from mechlingo.analyses.decoders.registry import (
    decoder_names,
    get_decoder,
    register_decoder,
    unregister_decoder,
)
from mechlingo.cli.common import UsageError
from mechlingo.cli.decoders import parse_decoders
from mechlingo.core import families
from mechlingo.core.errors import InputError, InterventionError
from mechlingo.core.families import FAMILIES, Family, family_of, register_family
from mechlingo.core.sites import SiteMap, resolve_site
from mechlingo.core.tokens import encode
from mechlingo.interventions import SteeringVector
from mechlingo.interventions.hf import LAYOUTS, HFView, hf_family
from mechlingo.testing import TINY, build_tiny_folder
from mechlingo.viz import palette
from mechlingo.viz.lens import lens_kl_figure

PROMPTS = ["The capital of France is", "La capitale de l'Italie est"]


@pytest.fixture
def restore_registries():
    """Leave the decoder, palette and family registries as they were."""
    decoders, colors = dict(registry._REGISTRY), dict(palette.DECODER)
    fams = dict(FAMILIES)
    yield
    registry._REGISTRY.clear()
    registry._REGISTRY.update(decoders)
    palette.DECODER.clear()
    palette.DECODER.update(colors)
    FAMILIES.clear()
    FAMILIES.update(fams)
    families._reindex()


@dataclass(frozen=True)
class Rotated:
    """A decoder defined by the test: a fixed random rotation of the residual, then the
    logit lens."""

    rotation: torch.Tensor
    name: str = "rotated"

    def check(self, model) -> None:
        if self.rotation.shape != (model.cfg.d_model, model.cfg.d_model):
            raise InputError("the rotation does not match d_model")

    def decode(self, model, entries, acts, langs):
        return acts @ self.rotation.to(acts.dtype)


def _rotation(d: int, seed: int = 0) -> torch.Tensor:
    g = torch.Generator().manual_seed(seed)
    q, _ = torch.linalg.qr(torch.randn(d, d, generator=g))
    return q


def _hand_lens(model, prompt: str, rotation: torch.Tensor | None) -> torch.Tensor:
    """``[entry, vocab]`` log-probabilities at the prompt's last token: the residual after
    ``l`` blocks (rotated), the final norm, ``W_U`` and ``b_U``, from a plain cache."""
    tokens = encode(model, [prompt]).tokens
    with torch.no_grad():
        _, cache = model.run_with_cache(tokens)
        n = model.cfg.n_layers
        names = [f"blocks.{e}.hook_resid_pre" for e in range(n)]
        x = torch.stack([cache[nm][0, -1] for nm in [*names, f"blocks.{n - 1}.hook_resid_post"]])
        if rotation is not None:
            x = x @ rotation
        logits = model.ln_final(x.unsqueeze(0)).squeeze(0) @ model.W_U + model.b_U
    return torch.log_softmax(logits.float(), -1)


def test_a_decoder_defined_here_is_one_registration_line(tiny, restore_registries):
    assert "rotated" not in decoder_names()
    q = _rotation(int(tiny.cfg.d_model))
    register_decoder("rotated", lambda model, **opts: Rotated(q))
    assert decoder_names() == ["logit", "tuned", "patchscope", "rotated"]

    # the lens reads it by name and by object; its output is the hand computation
    res = logit_lens(tiny, PROMPTS, decoder=get_decoder("rotated", tiny), tokens=False,
                     answers={"answer": ["Paris", "Rome"]}, langs=["en", "fr"], top_k=3)  # fmt: skip
    assert res.decoder == "rotated"
    for p, prompt in enumerate(PROMPTS):
        hand = _hand_lens(tiny, prompt, q)
        top = hand.topk(3, dim=-1)
        torch.testing.assert_close(res.top_logprobs[:, p], top.values, atol=1e-4, rtol=1e-4)
        assert torch.equal(res.top_ids[:, p], top.indices)
        plain = _hand_lens(tiny, prompt, None)
        assert not torch.allclose(hand, plain, atol=1e-3)  # the rotation is read, not skipped

    # the command line lists it and accepts it; the glossary's decoder list is the built-ins
    ns = argparse.Namespace(decoder="logit,rotated", tuned_lens=None, patchscope_tokens=0)
    assert parse_decoders(ns) == ["logit", "rotated"]
    from mechlingo.cli.main import build_parser

    lens = build_parser()._subparsers._group_actions[0].choices["lens"]  # type: ignore[union-attr]
    help_text = next(a.help for a in lens._actions if "--decoder" in a.option_strings)
    assert "rotated" in help_text and "patchscope" in help_text

    # a figure draws it in its palette colour: the first fallback colour no decoder uses
    expected = next(c for c in palette.DECODER_FALLBACK if c not in
                    {palette.DECODER[k] for k in ("logit", "tuned", "patchscope")})  # fmt: skip
    assert palette.decoder_color("rotated") == expected
    kl = {"kl": [1.0, 0.5], "lo": [0.9, 0.4], "hi": [1.1, 0.6]}
    fig = lens_kl_figure({"entries": [0, 1], "n_texts": 2, "n_tokens": 9,
                          "decoders": {"logit": kl, "rotated": kl}})  # fmt: skip
    line = {t.name: t.line.color for t in fig.data if t.name}
    assert line == {"logit": palette.DECODER["logit"], "rotated": expected}

    # removed again: unknown to the lens and the command line
    unregister_decoder("rotated")
    assert "rotated" not in decoder_names()
    with pytest.raises(InputError, match="unknown decoder 'rotated'"):
        get_decoder("rotated", tiny)
    with pytest.raises(UsageError, match="choose distinct names from logit, tuned, patchscope"):
        parse_decoders(ns)


def test_the_logit_lens_is_the_identity_decoder_never_none(tiny):
    a = logit_lens(tiny, PROMPTS, {"answer": ["Paris", "Rome"]}, langs=["en", "fr"])
    b = logit_lens(tiny, PROMPTS, {"answer": ["Paris", "Rome"]}, langs=["en", "fr"],
                   decoder=LogitLens())  # fmt: skip
    assert a.decoder == b.decoder == "logit"
    assert torch.equal(a.logprob, b.logprob) and torch.equal(a.top_ids, b.top_ids)
    for p, prompt in enumerate(PROMPTS):
        hand = _hand_lens(tiny, prompt, None)
        torch.testing.assert_close(a.top_logprobs[:, p], hand.topk(5, -1).values, atol=1e-4,
                                   rtol=1e-4)  # fmt: skip


def test_a_registered_decoder_gets_its_options_and_colour(tiny, restore_registries):
    from mechlingo.data import load_facts

    q = _rotation(int(tiny.cfg.d_model), seed=1)
    register_decoder("scaled", lambda model, scale=1.0, **opts: Rotated(q * scale, "scaled"),
                     color="#123456")  # fmt: skip
    assert palette.decoder_color("scaled_lens") == "#123456"
    facts = load_facts(langs=["fr"])[:2]
    res = lens_facts(tiny, facts, decoder="scaled", top_k=2)
    assert res.decoder == "scaled"
    with pytest.raises(InputError, match="does not match d_model"):
        register_decoder("bad", lambda model, **opts: Rotated(torch.eye(3), "bad"))
        get_decoder("bad", tiny)


# --------------------------------------------------------------------------------------
# Families
# --------------------------------------------------------------------------------------


def _load(folder):
    from transformers import AutoModelForCausalLM

    from mechlingo.core.models import load_model

    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        model = load_model(folder, device="cpu")
    hf = AutoModelForCausalLM.from_pretrained(folder, dtype=torch.float32).eval()
    return model, hf


def test_a_family_defined_here_is_one_record(tmp_path, restore_registries):
    register_family(replace(FAMILIES["llama"], name="llama_copy"))
    assert family_of("LlamaForCausalLM").name == "llama_copy"
    assert "llama_copy" in TINY and LAYOUTS["llama_copy"] == FAMILIES["llama"].layout

    copy_model, copy_hf = _load(build_tiny_folder(tmp_path / "copy", "llama_copy", seed=3))
    ref_model, _ = _load(build_tiny_folder(tmp_path / "ref", "llama", seed=3))
    tokens = encode(copy_model, PROMPTS[:1]).tokens
    with torch.no_grad():
        torch.testing.assert_close(copy_model(tokens), ref_model(tokens), atol=0, rtol=0)

    # its sites, and the transformers bridge's layout, come from the record
    sm = SiteMap(copy_model)
    assert sm.family == "llama_copy"
    site = resolve_site(copy_model, "mlp_post", -1)
    assert (site.hook_name, site.width) == ("blocks.1.mlp.hook_post", 64)
    assert hf_family(copy_hf) == "llama_copy"
    view = HFView(copy_hf, "llama_copy", has_bos=True)
    assert view.layout == FAMILIES["llama"].layout and view.cfg.d_mlp == 64

    # an intervention through that layout equals the same intervention on the bridge
    v = torch.randn(int(copy_model.cfg.d_model), generator=torch.Generator().manual_seed(0))
    iv = SteeringVector(v, 1, 3.0, positions="all")
    with torch.no_grad():
        bridge = copy_model.run_with_hooks(tokens, fwd_hooks=iv.fwd_hooks(copy_model))
        with iv.attach(copy_hf):
            plain = copy_hf(tokens).logits
        unsteered = copy_hf(tokens).logits
    torch.testing.assert_close(plain, bridge, atol=1e-4, rtol=1e-4)
    assert not torch.allclose(plain, unsteered, atol=1e-3)

    # a parallel variant: the flag removes resid_mid from the sites and from the bridge
    register_family(replace(FAMILIES["llama"], name="llama_parallel", parallel=True,
                            layout=replace(FAMILIES["llama"].layout, mid=None)))  # fmt: skip
    assert not SiteMap(copy_model).available["resid_mid"]
    with pytest.raises(InterventionError, match="resid_mid"):
        with SteeringVector(v, 1, 1.0, site="resid_mid").attach(copy_hf):
            copy_hf(tokens)

    families.unregister_family("llama_parallel")
    families.unregister_family("llama_copy")
    assert family_of("LlamaForCausalLM").name == "llama"
    assert "llama_copy" not in TINY and "llama_copy" not in LAYOUTS


def test_a_family_record_must_be_consistent():
    with pytest.raises(InputError, match="parallel"):
        replace(FAMILIES["llama"], name="x", parallel=True)
    with pytest.raises(InputError, match="hook for each site"):
        replace(FAMILIES["llama"], name="x", hooks={"resid_pre": "blocks.{layer}.x"})
    with pytest.raises(InputError, match="encoder-decoder"):
        register_family(Family(name="t5", architecture="T5ForConditionalGeneration",
                               examples="", parallel=False, gated_mlp=False, final_norm="",
                               notes=""))  # fmt: skip

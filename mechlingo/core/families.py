"""Model families: the registry of the architectures mechlingo supports, and of those it
refuses.

Where things sit in a model (the final norm and any logit soft-cap, the residual hooks, the
MLP "neuron", the BOS convention) differs between families, so each :class:`Family` in
:data:`FAMILIES` records it (its hooks, :class:`Layout` of transformers modules and
:class:`TinyConfig`) and is checked in CI on a tiny random model
(``tests/core/test_families.py``). :data:`REFUSED` lists architectures whose numbers would mean
something else (encoder-decoders, encoders, state-space and hybrid models), which
:func:`mechlingo.core.models.load_model` refuses by name; an architecture in neither list
loads with a warning. Entry points: :func:`family_of`, :func:`register_family`,
:func:`grows_mid_pass`. ``docs/models.md`` has the table, what each check covers and how to
add a family.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass, field
from types import MappingProxyType
from typing import Any

from mechlingo.core.errors import InputError
from mechlingo.core.types import Model

__all__ = [
    "FAMILIES",
    "REFUSED",
    "STANDARD_HOOKS",
    "SUPPORTED_ARCHITECTURES",
    "Family",
    "Layout",
    "TinyConfig",
    "family_of",
    "grows_mid_pass",
    "register_family",
    "unregister_family",
]

#: The TransformerLens hook of each site (``{layer}`` filled in): the layout every supported
#: family's bridge has (:mod:`mechlingo.core.sites` reads a family's own).
STANDARD_HOOKS: Mapping[str, str] = MappingProxyType(
    {
        "resid_pre": "blocks.{layer}.hook_resid_pre",
        "resid_mid": "blocks.{layer}.hook_resid_mid",
        "resid_post": "blocks.{layer}.hook_resid_post",
        "attn_out": "blocks.{layer}.hook_attn_out",
        "mlp_out": "blocks.{layer}.hook_mlp_out",
        "mlp_post": "blocks.{layer}.mlp.hook_post",
        "attn_z": "blocks.{layer}.attn.hook_z",
        "attn_pattern": "blocks.{layer}.attn.hook_pattern",
    }
)


@dataclass(frozen=True)
class Layout:
    """Where mechlingo's sites are in one family's transformers modules (what
    :mod:`mechlingo.interventions.hf` hooks).

    Attributes:
        layers: path of the decoder layer list in the model (``"model.layers"``).
        attn_out: module (inside a layer) whose output is ``attn_out``.
        mlp_out: module (inside a layer) whose output is ``mlp_out``.
        down: module whose input is ``mlp_post`` (the MLP's down projection).
        o_proj: module whose input is ``attn_z`` (heads concatenated).
        mid: module whose output *is* ``resid_mid`` (BLOOM), ``""`` when ``resid_mid`` is
            resid_pre + attn_out and is edited through attn_out, ``None`` when there is none
            (parallel attention and MLP).
    """

    layers: str
    attn_out: str
    mlp_out: str
    down: str
    o_proj: str
    mid: str | None = ""


_LLAMA = Layout("model.layers", "self_attn", "mlp", "mlp.down_proj", "self_attn.o_proj")
_POSTNORM = Layout(
    "model.layers",
    "post_attention_layernorm",
    "post_feedforward_layernorm",
    "mlp.down_proj",
    "self_attn.o_proj",
)
_PARALLEL = Layout("model.layers", "self_attn", "mlp", "mlp.down_proj", "self_attn.o_proj", None)


@dataclass(frozen=True)
class TinyConfig:
    """How a family's tiny random test model is configured (:mod:`mechlingo.testing` builds
    it): the tokenizer kind, the transformers config class, the config keys of the sizes
    (``{size: key}``, a size being an attribute of ``mechlingo.testing.Sizes``), sliding and
    full attention layers in turn (``sliding``), and ``extra`` config keys."""

    tokenizer: str
    config: str
    names: Mapping[str, str]
    sliding: bool = False
    extra: Mapping[str, Any] = field(default_factory=lambda: MappingProxyType({}))


#: The names most configs (Llama's and its descendants') give the sizes, ``{size: key}``.
_LLAMA_NAMES: Mapping[str, str] = MappingProxyType(
    {
        "d_model": "hidden_size",
        "d_mlp": "intermediate_size",
        "n_layers": "num_hidden_layers",
        "n_heads": "num_attention_heads",
        "n_ctx": "max_position_embeddings",
    }
)
#: With grouped-query attention (the default), and also with a head width of its own.
_GQA = MappingProxyType({**_LLAMA_NAMES, "n_kv_heads": "num_key_value_heads"})
_GQA_HEAD_DIM = MappingProxyType({**_GQA, "head_dim": "head_dim"})
#: The families that name the sizes their own way.
_BLOOM = MappingProxyType({"d_model": "hidden_size", "n_layers": "n_layer", "n_heads": "n_head"})
_GPT2 = MappingProxyType(
    {"d_model": "n_embd", "n_layers": "n_layer", "n_heads": "n_head", "n_ctx": "n_positions"}
)
_XGLM = MappingProxyType(
    {"d_model": "d_model", "d_mlp": "ffn_dim", "n_layers": "num_layers",
     "n_heads": "attention_heads", "n_ctx": "max_position_embeddings"}
)  # fmt: skip
_FALCON = MappingProxyType(
    {"d_model": "hidden_size", "n_layers": "num_hidden_layers", "n_heads": "num_attention_heads"}
)


def _tiny(
    tokenizer: str, config: str, names: Mapping[str, str] = _GQA, *, sliding: bool = False,
    **extra: Any,
) -> TinyConfig:  # fmt: skip
    return TinyConfig(tokenizer, config, names, sliding, MappingProxyType(extra))


# --------------------------------------------------------------------------------------
# Families
# --------------------------------------------------------------------------------------


@dataclass(frozen=True, kw_only=True)
class Family:
    """One model family as mechlingo supports it: what it is, and what the code that depends
    on the architecture reads.

    Attributes:
        name: short name (``"llama"``).
        architecture: the transformers class named in ``config.json`` (``architectures``).
        examples: real checkpoints of the family a multilingual researcher uses.
        parallel: attention and MLP read the same residual: :mod:`mechlingo.core.sites` and
            the transformers bridge offer no ``resid_mid`` site.
        gated_mlp: the MLP is ``down(act(gate(x)) * up(x))``; ``mlp_post`` is then the
            product ``act(gate(x)) * up(x)``, the input of the down projection.
        final_norm: what the logit lens reads through before the unembedding (empty: no
            final norm; otherwise a model without one is refused by the sites).
        notes: known differences from the Gemma 3 default, for ``docs/models.md``.
        layout: its transformers modules (:class:`Layout`; ``None``: no transformers bridge).
        tiny: its tiny test model (:class:`TinyConfig`; ``None``: none).
        hooks: the TransformerLens hook of each site (default :data:`STANDARD_HOOKS`).
        grows_mid_pass: a batch may grow between blocks of one pass (XGLM's attention
            requires a mask of exactly the starting batch size).
    """

    name: str
    architecture: str
    examples: str
    parallel: bool
    gated_mlp: bool
    final_norm: str
    notes: str
    layout: Layout | None = None
    tiny: TinyConfig | None = None
    hooks: Mapping[str, str] = field(default_factory=lambda: STANDARD_HOOKS)
    grows_mid_pass: bool = True

    def __post_init__(self) -> None:
        if set(self.hooks) != set(STANDARD_HOOKS):
            raise InputError(f"family {self.name!r} must give a hook for each site: "
                             f"{sorted(STANDARD_HOOKS)}")  # fmt: skip
        if self.layout is not None and self.parallel != (self.layout.mid is None):
            raise InputError(f"family {self.name!r}: a parallel family's layout has mid=None, "
                             "and only a parallel family's")  # fmt: skip


FAMILIES: dict[str, Family] = {
    f.name: f
    for f in [
        Family(
            name="gemma3",
            layout=_POSTNORM,
            tiny=_tiny("bytelevel", "Gemma3TextConfig", _GQA_HEAD_DIM, sliding=True),
            architecture="Gemma3ForCausalLM",
            examples="google/gemma-3-270m (the embedded default), gemma-3-1b",
            parallel=False,
            gated_mlp=True,
            final_norm="RMSNorm (scale 1 + w)",
            notes="Embeddings scaled by sqrt(d_model); post-attention and post-MLP norms, so "
            "attn_out/mlp_out are read after them; local sliding-window layers.",
        ),
        Family(
            name="gemma2",
            layout=_POSTNORM,
            # small caps, so that they really bend the logits
            tiny=_tiny(
                "metaspace",
                "Gemma2Config",
                _GQA_HEAD_DIM,
                sliding=True,
                final_logit_softcapping=3.0,
                attn_logit_softcapping=5.0,
            ),
            architecture="Gemma2ForCausalLM",
            examples="google/gemma-2-2b, gemma-2-9b",
            parallel=False,
            gated_mlp=True,
            final_norm="RMSNorm (scale 1 + w), then the final logit soft-cap",
            notes="Final logits are soft-capped (cap * tanh(x / cap)): the lens applies the cap "
            "after the unembedding (TransformerLens's output transform); attention logits "
            "are soft-capped too; post-norms as in Gemma 3.",
        ),
        Family(
            name="gemma",
            layout=_LLAMA,
            tiny=_tiny("metaspace", "GemmaConfig", _GQA_HEAD_DIM, num_key_value_heads=1),
            architecture="GemmaForCausalLM",
            examples="google/gemma-2b, gemma-7b",
            parallel=False,
            gated_mlp=True,
            final_norm="RMSNorm (scale 1 + w)",
            notes="Embeddings scaled by sqrt(d_model); multi-query attention.",
        ),
        Family(
            name="llama",
            layout=_LLAMA,
            tiny=_tiny("metaspace", "LlamaConfig", tie_word_embeddings=False),
            architecture="LlamaForCausalLM",
            examples="meta-llama/Llama-3.2-1B, Llama-2-7b, Tower, SeaLLM",
            parallel=False,
            gated_mlp=True,
            final_norm="RMSNorm",
            notes="Untied unembedding; the tiny model's tokenizer prepends <s> itself (Llama 2 "
            "style), mechlingo's batches come out the same as TransformerLens's to_tokens.",
        ),
        Family(
            name="mistral",
            layout=_LLAMA,
            tiny=_tiny(
                "metaspace", "MistralConfig", sliding_window=None, tie_word_embeddings=False
            ),
            architecture="MistralForCausalLM",
            examples="mistralai/Mistral-7B-v0.1",
            parallel=False,
            gated_mlp=True,
            final_norm="RMSNorm",
            notes="As Llama (grouped-query attention, untied unembedding).",
        ),
        Family(
            name="qwen2",
            layout=_LLAMA,
            tiny=_tiny("qwen", "Qwen2Config", tie_word_embeddings=True),
            architecture="Qwen2ForCausalLM",
            examples="Qwen/Qwen2.5-0.5B .. 72B",
            parallel=False,
            gated_mlp=True,
            final_norm="RMSNorm",
            notes="No BOS token and no BOS prepended (default_prepend_bos False): position 0 is a "
            "real token and is pooled/steered like any other; QKV biases; tied unembedding.",
        ),
        Family(
            name="qwen3",
            layout=_LLAMA,
            tiny=_tiny("qwen", "Qwen3Config", _GQA_HEAD_DIM, tie_word_embeddings=True),
            architecture="Qwen3ForCausalLM",
            examples="Qwen/Qwen3-0.6B .. 32B",
            parallel=False,
            gated_mlp=True,
            final_norm="RMSNorm",
            notes="As Qwen 2, plus RMSNorm on queries and keys.",
        ),
        Family(
            name="bloom",
            layout=Layout(
                "transformer.h",
                "self_attention.dense",
                "mlp.dense_4h_to_h",
                "mlp.dense_4h_to_h",
                "self_attention.dense",
                "self_attention",
            ),
            tiny=_tiny("bytelevel", "BloomConfig", _BLOOM),
            architecture="BloomForCausalLM",
            examples="bigscience/bloom-560m .. bloom-7b1, bloomz",
            parallel=False,
            gated_mlp=False,
            final_norm="LayerNorm",
            notes="ALiBi attention biases, no rotary or learned positions; a LayerNorm on the "
            "embeddings (before blocks.0.hook_resid_pre); no BOS prepended (default_prepend_bos "
            "False); GELU MLP, mlp_post is the GELU output.",
        ),
        Family(
            name="cohere",
            layout=_PARALLEL,
            tiny=_tiny("bytelevel", "CohereConfig", logit_scale=0.5, tie_word_embeddings=True),
            architecture="CohereForCausalLM",
            examples="CohereForAI/aya-23-8B, aya-expanse-8b, c4ai-command-r",
            parallel=True,
            gated_mlp=True,
            final_norm="LayerNorm without bias",
            notes="Parallel attention + MLP from one LayerNorm: there is no resid_mid site, "
            "resid_post = resid_pre + attn_out + mlp_out; the logit_scale is folded into W_U "
            "by TransformerLens, so the lens reproduces the scaled logits.",
        ),
        Family(
            name="cohere2",
            layout=_PARALLEL,
            tiny=_tiny(
                "bytelevel",
                "Cohere2Config",
                sliding=True,
                logit_scale=0.5,
                tie_word_embeddings=True,
            ),
            architecture="Cohere2ForCausalLM",
            examples="CohereForAI/c4ai-command-r7b-12-2024, aya-vision's text model",
            parallel=True,
            gated_mlp=True,
            final_norm="LayerNorm without bias",
            notes="As Cohere (parallel block, logit_scale folded into W_U), plus sliding-window "
            "layers interleaved with global layers that have no positional encoding.",
        ),
        Family(
            name="gpt2",
            layout=Layout("transformer.h", "attn", "mlp", "mlp.c_proj", "attn.c_proj"),
            tiny=_tiny("gpt2", "GPT2Config", _GPT2),
            architecture="GPT2LMHeadModel",
            examples="gpt2, mGPT (ai-forever/mGPT)",
            parallel=False,
            gated_mlp=False,
            final_norm="LayerNorm",
            notes="Learned absolute positions; <|endoftext|> is BOS, EOS and padding at once "
            "(padding is told apart by the lengths, never by the id).",
        ),
        Family(
            name="gpt_neox",
            layout=Layout(
                "gpt_neox.layers", "attention", "mlp", "mlp.dense_4h_to_h", "attention.dense", None
            ),
            tiny=_tiny(
                "nospace", "GPTNeoXConfig", _LLAMA_NAMES, rotary_pct=0.5, tie_word_embeddings=False
            ),
            architecture="GPTNeoXForCausalLM",
            examples="EleutherAI/pythia-*, polyglot-ko",
            parallel=True,
            gated_mlp=False,
            final_norm="LayerNorm",
            notes="Parallel attention + MLP with two LayerNorms (no resid_mid); rotary on a part "
            "of each head; no BOS prepended. The tiny model's tokenizer has no leading-space "
            "marker (answers with and without a space are the same token).",
        ),
        Family(
            name="xglm",
            layout=Layout("model.layers", "self_attn", "fc2", "fc2", "self_attn.out_proj"),
            tiny=_tiny("xglm", "XGLMConfig", _XGLM),
            grows_mid_pass=False,
            architecture="XGLMForCausalLM",
            examples="facebook/xglm-564M .. xglm-7.5B",
            parallel=False,
            gated_mlp=False,
            final_norm="LayerNorm",
            notes="Sinusoidal positions, embeddings scaled by sqrt(d_model); the tokenizer "
            "prepends </s> as its BOS.",
        ),
        Family(
            name="phi3",
            layout=_LLAMA,
            tiny=_tiny("metaspace", "Phi3Config", tie_word_embeddings=False),
            architecture="Phi3ForCausalLM",
            examples="microsoft/Phi-3-mini-4k-instruct, Phi-3.5-mini",
            parallel=False,
            gated_mlp=True,
            final_norm="RMSNorm",
            notes="Gate and up projections fused in one matrix (gate_up_proj); TransformerLens "
            "splits it, mlp_post is still the input of the down projection.",
        ),
        Family(
            name="olmo2",
            layout=_POSTNORM,
            tiny=_tiny("bytelevel", "Olmo2Config", tie_word_embeddings=False),
            architecture="Olmo2ForCausalLM",
            examples="allenai/OLMo-2-0425-1B",
            parallel=False,
            gated_mlp=True,
            final_norm="RMSNorm",
            notes="Norms after attention and MLP only (no pre-norms): attn_out/mlp_out are the "
            "normed outputs added to the residual.",
        ),
        Family(
            name="stablelm",
            layout=_LLAMA,
            tiny=_tiny(
                "gpt2", "StableLmConfig", partial_rotary_factor=0.5, tie_word_embeddings=False
            ),
            architecture="StableLmForCausalLM",
            examples="stabilityai/stablelm-2-1_6b (7 European languages)",
            parallel=False,
            gated_mlp=True,
            final_norm="LayerNorm",
            notes="LayerNorms with a gated SiLU MLP; rotary on a part of each head.",
        ),
        Family(
            name="falcon",
            layout=Layout(
                "transformer.h",
                "self_attention",
                "mlp",
                "mlp.dense_4h_to_h",
                "self_attention.dense",
                None,
            ),
            tiny=_tiny("spacetoken", "FalconConfig", _FALCON),
            architecture="FalconForCausalLM",
            examples="tiiuae/falcon-7b, falcon-rw-1b",
            parallel=True,
            gated_mlp=False,
            final_norm="LayerNorm",
            notes="Parallel attention + MLP from one LayerNorm (no resid_mid); multi-query "
            "attention; GELU MLP. The tiny model's tokenizer writes the space as a token of "
            "its own: answers are tracked by the word's first token, never the space.",
        ),
    ]
}

# Architectures TransformerLens 4.3 loads but mechlingo refuses, with the reason.
_ENC_DEC = (
    "is an encoder-decoder: mechlingo's lens, patching and neuron sites assume one "
    "decoder stack reading the prompt (blocks.{l}.hook_resid_*), so its numbers would mix "
    "encoder and decoder layers"
)
_ENCODER = "is an encoder (masked LM or classifier), not a causal LM: there is no next token"
_SSM = (
    "has no attention blocks (state-space/recurrent layers): the attention sites, the "
    "head patching and the logit lens's layer convention do not apply"
)
_HYBRID = (
    "mixes attention and state-space layers: the per-layer sites are not the same hook in "
    "every block, so layer sweeps would silently skip or misread layers"
)
REFUSED: dict[str, str] = {
    **{
        a: _ENC_DEC
        for a in (
            "T5ForConditionalGeneration",
            "MT5ForConditionalGeneration",
            "T5WithLMHeadModel",
            "MBartForConditionalGeneration",
            "M2M100ForConditionalGeneration",
            "MarianMTModel",
            "BartForConditionalGeneration",
            "LongT5ForConditionalGeneration",
            "PegasusForConditionalGeneration",
            "BlenderbotForConditionalGeneration",
            "LEDForConditionalGeneration",
            "SwitchTransformersForConditionalGeneration",
            "T5GemmaForConditionalGeneration",
            "T5Gemma2ForConditionalGeneration",
            "Florence2ForConditionalGeneration",
        )
    },
    **{
        a: _ENCODER
        for a in (
            "BertForMaskedLM",
            "BertLMHeadModel",
            "RobertaForMaskedLM",
            "XLMRobertaForMaskedLM",
            "HubertForCTC",
            "HubertModel",
            "Wav2Vec2ForCTC",
            "Wav2Vec2ForPreTraining",
            "Wav2Vec2Model",
            "ViTModel",
            "ViTForImageClassification",
            "DeiTModel",
            "DeiTForImageClassification",
            "ASTForAudioClassification",
        )
    },
    **{
        a: _SSM
        for a in (
            "MambaForCausalLM",
            "Mamba2ForCausalLM",
            "FalconMambaForCausalLM",
            "RwkvForCausalLM",
            "RWKV7ForCausalLM",
            "HyenaDNAForCausalLM",
        )
    },
    **{
        a: _HYBRID
        for a in (
            "JambaForCausalLM",
            "BambaForCausalLM",
            "Zamba2ForCausalLM",
            "FalconH1ForCausalLM",
            "NemotronHForCausalLM",
            "GraniteMoeHybridForCausalLM",
            "RecurrentGemmaForCausalLM",
            "Lfm2ForCausalLM",
            "Lfm2MoeForCausalLM",
            "Qwen3NextForCausalLM",
            "OlmoHybridForCausalLM",
        )
    },
}

#: Architecture -> family name, derived from :data:`FAMILIES` (the family registered last
#: for an architecture wins).
SUPPORTED_ARCHITECTURES: dict[str, str] = {}


def _reindex() -> None:
    SUPPORTED_ARCHITECTURES.clear()
    for f in FAMILIES.values():
        SUPPORTED_ARCHITECTURES[f.architecture] = f.name


_reindex()


def register_family(family: Family) -> Family:
    """Add ``family`` to :data:`FAMILIES` (replacing one of that name); sites, the
    transformers bridge and :mod:`mechlingo.testing` read it from then on, and models of its
    architecture resolve to it.

    Raises:
        InputError: an architecture mechlingo refuses (:data:`REFUSED`).
    """
    if family.architecture in REFUSED:
        raise InputError(f"{family.architecture} {REFUSED[family.architecture]}")
    FAMILIES.pop(family.name, None)
    FAMILIES[family.name] = family
    _reindex()
    return family


def unregister_family(name: str) -> None:
    """Remove a registered family (its architecture goes back to the family before it)."""
    FAMILIES.pop(name, None)
    _reindex()


def family_of(architecture: str) -> Family | None:
    """The :class:`Family` of a transformers architecture class name, or ``None``."""
    name = SUPPORTED_ARCHITECTURES.get(architecture)
    return FAMILIES[name] if name else None


def grows_mid_pass(model: Model) -> bool:
    """Whether a batch may grow between blocks of one forward pass (``patch_activations``'s
    ``batching="grow"``; ``"stack"`` gives the same numbers, it only costs more). Not with
    ALiBi (BLOOM, Falcon-RW, MPT): the bridge builds the bias once per pass as a
    ``[batch * heads, 1, key]`` tensor for the batch the pass started with, which does not
    broadcast over added rows; not in a family whose flag says so (XGLM)."""
    if str(getattr(model.cfg, "positional_embedding_type", "")) == "alibi":
        return False
    family = family_of(str(getattr(model.cfg, "architecture", "")))
    return family is None or family.grows_mid_pass

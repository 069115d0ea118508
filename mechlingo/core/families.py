"""Model families: the registry of the architectures mechlingo supports, and of those it
refuses.

mechlingo makes assumptions about where things sit in a model: the final norm (and any logit
soft-cap) the logit lens reads through, the residual hooks between blocks, the MLP input of
the down projection (the "neuron" of the expert statistics), the BOS convention. Those differ
between families, so every family in :data:`FAMILIES` is checked in CI on a tiny random model
(``tests/test_families.py``, built by :func:`mechlingo.testing.build_tiny_folder`): sites,
lens against TransformerLens's logit lens and the model's own output, padded batches against
one-by-one runs, patching against TransformerLens's patching, interventions, hook clean-up,
expert statistics and alignment embeddings against hooks on the original transformers
modules. ``docs/models.md`` has the table.

:data:`REFUSED` lists architectures that TransformerLens 4 can load but whose numbers would
mean something else in mechlingo (encoder-decoders, encoders, state-space and hybrid
models);
:func:`mechlingo.core.models.load_model` refuses them by name. An architecture in neither list
loads with a warning that it is unchecked.
"""

from __future__ import annotations

from dataclasses import dataclass

from mechlingo.core.types import Model

# --------------------------------------------------------------------------------------
# Families
# --------------------------------------------------------------------------------------


@dataclass(frozen=True, kw_only=True)
class Family:
    """One model family as mechlingo supports it.

    Attributes:
        name: short name (``"llama"``).
        architecture: the transformers class named in ``config.json`` (``architectures``).
        examples: real checkpoints of the family a multilingual researcher uses.
        parallel: attention and MLP read the same residual (no ``resid_mid`` site).
        gated_mlp: the MLP is ``down(act(gate(x)) * up(x))``; ``mlp_post`` is then the
            product ``act(gate(x)) * up(x)``, the input of the down projection.
        final_norm: what the logit lens reads through before the unembedding.
        notes: known differences from the Gemma 3 default, for ``docs/models.md``.

    How its tiny test model is built is :data:`mechlingo.testing.TINY`'s business.
    """

    name: str
    architecture: str
    examples: str
    parallel: bool
    gated_mlp: bool
    final_norm: str
    notes: str


FAMILIES: dict[str, Family] = {
    f.name: f
    for f in [
        Family(
            name="gemma3",
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
            architecture="GemmaForCausalLM",
            examples="google/gemma-2b, gemma-7b",
            parallel=False,
            gated_mlp=True,
            final_norm="RMSNorm (scale 1 + w)",
            notes="Embeddings scaled by sqrt(d_model); multi-query attention.",
        ),
        Family(
            name="llama",
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
            architecture="MistralForCausalLM",
            examples="mistralai/Mistral-7B-v0.1",
            parallel=False,
            gated_mlp=True,
            final_norm="RMSNorm",
            notes="As Llama (grouped-query attention, untied unembedding).",
        ),
        Family(
            name="qwen2",
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
            architecture="Qwen3ForCausalLM",
            examples="Qwen/Qwen3-0.6B .. 32B",
            parallel=False,
            gated_mlp=True,
            final_norm="RMSNorm",
            notes="As Qwen 2, plus RMSNorm on queries and keys.",
        ),
        Family(
            name="bloom",
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
            architecture="StableLmForCausalLM",
            examples="stabilityai/stablelm-2-1_6b (7 European languages)",
            parallel=False,
            gated_mlp=True,
            final_norm="LayerNorm",
            notes="LayerNorms with a gated SiLU MLP; rotary on a part of each head.",
        ),
        Family(
            name="falcon",
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

SUPPORTED_ARCHITECTURES: dict[str, str] = {f.architecture: f.name for f in FAMILIES.values()}


def family_of(architecture: str) -> Family | None:
    """The :class:`Family` of a transformers architecture class name, or ``None``."""
    name = SUPPORTED_ARCHITECTURES.get(architecture)
    return FAMILIES[name] if name else None


# Architectures whose forward pass cannot take a batch that grows between blocks: XGLM's
# attention checks that its mask has exactly the batch size the pass started with.
_NO_GROW = frozenset({"XGLMForCausalLM"})


def grows_mid_pass(model: Model) -> bool:
    """Whether a batch may grow between blocks of one forward pass (``patch_activations``'s
    ``batching="grow"``; ``"stack"`` gives the same numbers, it only costs more). Not with
    ALiBi (BLOOM, Falcon-RW, MPT): the bridge builds the bias once per pass as a
    ``[batch * heads, 1, key]`` tensor for the batch the pass started with, which does not
    broadcast over added rows; not with XGLM, whose attention requires a mask of exactly the
    starting batch size."""
    if str(getattr(model.cfg, "positional_embedding_type", "")) == "alibi":
        return False
    return str(getattr(model.cfg, "architecture", "")) not in _NO_GROW

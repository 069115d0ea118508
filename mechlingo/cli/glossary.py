"""The command line's vocabulary: one flag per concept, one meaning and one default per flag.

:data:`FLAGS` maps every flag of every ``mechlingo`` command to the concept it sets and a
one-line meaning; each command builds a flag's ``--help`` from that meaning (:func:`about`),
so a flag says the same thing in every command. ``docs/glossary.md`` prints the same table,
and ``tests/cli/test_glossary.py`` checks the three against each other: every flag of every
parser is here and in the page, nothing here is missing from the parsers, a flag has the same
kind (switch, number, choice, metavar), the same meaning and the same default in every
command that takes it, and no two flags name one concept. Version 0.1.0 is the first
release: there are no old flag names to translate. The decoder names come from the decoder
registry.
"""

from __future__ import annotations

from mechlingo.analyses.decoders.registry import decoder_names

__all__ = ["CODE_NAMES", "CONCEPT_WORDS", "FLAGS", "about"]

#: flag -> (concept, meaning). A concept is named by one flag only.
FLAGS: dict[str, tuple[str, str]] = {
    # model and run
    "--model": ("model", "the model to load: the embedded default, a hub id, a folder or a .gguf file"),
    "--device": ("device", "where the model runs: cpu, cuda, cuda:N or mps"),
    "--dtype": ("dtype", "floating-point type of the weights"),
    "--chat": ("chat template", "wrap prompts in the tokenizer's chat template: on, off or auto"),
    "--compat": ("layer-norm folding", "fold layer norms (TransformerLens compatibility mode)"),
    "--out": ("output folder", "folder the command writes"),
    "--plotlyjs": ("plotly.js", "how report.html loads plotly.js: inline or from one shared file"),
    "--batch-size": ("batch size", "prompts (or texts) per forward pass"),
    "--quiet": ("progress bars", "no progress bars"),
    "--work": ("work folder", "where checkpoints are kept until --out is written"),
    "--fresh": ("start over", "remove the run's checkpoints first"),
    "--resume": ("go on", "only go on from checkpoints: refuse when there are none"),
    "--dry-run": ("dry run", "print the plan and the estimated CPU time, load no model, write nothing"),
    "--plan": ("power plan", "print the power planner's table from the dev split and stop"),
    # data
    "--facts": ("fact file", "your facts (.jsonl/.tsv, or a folder of them) or a benchmark folder"),
    "--external": ("external benchmark", "a BMLAMA or KLAR folder scored with the vectors chosen on the card's facts"),
    "--parallel": ("parallel-text folder", "folder of line-aligned <lang>.txt files (NTREX, FLORES)"),
    "--flores-split": ("FLORES split", "which FLORES split a --parallel FLORES folder is read from"),
    "--text-file": ("training text file", "your own text, one training text a line"),
    "--langs": ("languages", "comma-separated language codes to read (ISO 639 / BCP 47, FLORES codes too)"),
    "--target": ("target language", "the language of the expert neurons (found, clamped, aligned, replicated)"),
    "--relation": ("relations", "comma-separated fact relations, or 'all'"),
    "--limit": ("facts per relation", "at most this many facts per relation, the same facts in every language"),
    "--templates": ("template family", "prompt family of the bundled facts: natural or measured"),
    "--offset": ("line offset", "parallel lines (of each language or file) skipped first"),
    "--lines": ("lines per language", "parallel lines (sentences) per language, after --offset"),
    "--heldout": ("held-out lines", "held-out parallel lines per language right after the --lines used"),
    "--max-tokens": ("tokens per text", "keep only the first N tokens of each sentence or text"),
    "--split": ("split fractions", "build,dev,test fractions of fact ids"),
    "--salt": ("split salt", "salt of the fact-id hash that splits facts"),
    # scoring and generation
    "--metric": ("metric", "how facts are scored: generate, klar or rank"),
    "--rank-tokens": ("rank tokens", "with --metric rank: cross-entropy over the sentence or the candidate"),
    "--max-new-tokens": ("answer length", "greedy tokens generated for each answer"),
    "--max-rank": ("decodable rank", "rank at or below which an answer counts as decodable"),
    "--seed": ("seed", "the seed of the run's random draws (controls, samples, text order)"),
    "--control-seeds": ("random-control seeds", "seeds of the norm-matched random controls, one control per seed"),
    # lens and decoders
    "--prompt": ("prompt text", "a text read at every position by the token-level lens"),
    "--track": ("tracked languages", "languages whose answers the lens tracks besides the prompt's"),
    "--decoder": ("decoders", f"comma-separated decoders: {', '.join(decoder_names())}"),
    "--tuned-lens": ("tuned-lens folder", "folder of a lens from `mechlingo tuned-lens` (or NAME=DIR,...)"),
    "--patchscope-target": ("patchscope prompt language", "language of the patchscope's identity target prompt"),
    "--patchscope-tokens": ("patchscope continuation", "greedy tokens the patchscope generates per layer"),
    # trace
    "--mid-layers": ("mid-network layers", "lens entries counted as mid-network, A-B or a list"),
    "--patch-prompts": ("patched prompts", "prompts per language for patching and knockout"),
    "--circuit-prompts": ("circuit prompts", "correctly answered prompts per language the measured circuit (EAP-IG edges) is scored on"),
    "--patch-unanswered": ("patch unanswered prompts", "also patch clean prompts the model answers wrongly"),
    "--patch-sites": ("patch sites", "sites of the corrupted-subject patching sweep"),
    "--cells-per-batch": ("cells per batch", "patched copies per forward pass"),
    "--method": ("patching method", "exact activation patching, attribution patching (atp) or both"),
    "--verify-heads": ("verified heads", "top AtP heads verified by exact head patching"),
    # circuit
    "--attribution": ("edge attribution method", "how edges are scored: eap or eap-ig (integrated gradients)"),
    "--ig-steps": ("integrated-gradient steps", "interpolation steps of EAP-IG"),
    "--faithfulness": ("target faithfulness", "the faithfulness the reported circuit must reach"),
    "--selection": ("circuit selection", "top (largest scores) or greedy (grown from the logits)"),
    "--verify-edges": ("verified edges", "top edges re-scored by exact edge patching"),
    "--positions": ("position split", "edges per position group (roles) or summed over positions (all)"),
    "--readout": ("readout", "what a patched run is read out as: logprob or logit_diff"),
    # experts and alignment
    "--k": ("expert counts", "numbers of expert neurons to save and compare"),
    "--pool": ("token pooling", "pooling of activations over a sentence's tokens"),
    "--score": ("expert score", "how neurons are ranked as experts: auroc, ap or lape"),
    "--value": ("clamp value", "value the clamp holds experts at: mean or median"),
    "--layers": ("searched layers", "comma-separated layers searched for expert neurons"),
    "--no-curve": ("skip k curve", "skip the k curve (its generation)"),
    "--samples": ("BOS samples", "samples generated from BOS per k"),
    "--sample-tokens": ("BOS sample length", "greedy tokens generated per BOS sample"),
    "--ppl-budget": ("perplexity budget", "k rule: the most a clamp may raise the target's perplexity"),
    "--ppl-others": ("other languages' budget", "k rule: how other languages' perplexity ratios enter"),
    "--max-memory": ("memory cap", "cap on the memory of the neuron statistics"),
    "--shard-dir": ("shard folder", "folder keeping the neuron statistics out of core"),
    "--clamp": ("clamp folder", "a saved clamp, or an experts folder (the chosen k's clamp)"),
    "--control": ("control folder", "the control intervention folder"),
    "--layer": ("headline layer", "the one layer of the headline numbers"),
    "--centre": ("centring", "subtract the mean embedding first"),
    "--side-effects": ("side effects", "also measure the intervention's side effects against a control"),
    "--side-effects-lines": ("side-effect lines", "parallel lines per language the side effects are measured on"),
    # tuned lens
    "--steps": ("optimizer steps", "optimizer steps of the tuned-lens training"),
    "--max-seconds": ("time cap", "stop the training after this many seconds"),
    "--texts-per-step": ("texts per step", "training texts per optimizer step"),
    "--lr": ("learning rate", "Adam learning rate"),
    "--vocab-sample": ("vocabulary sample", "the training loss's vocabulary: exact, an int (sampled remainder) or auto"),
    # steering
    "--k-shot": ("demonstrations", "solved demonstrations per few-shot prompt"),
    "--per-relation": ("build ids per relation", "build fact ids per relation"),
    "--translation-shots": ("translation shots", "solved translation pairs before each translation prompt"),
    "--plain-task": ("plain task vector", "task vector = plain few-shot mean"),
    "--unit": ("vector unit", "resid (fractions of the residual norm) or raw"),
    "--vectors": ("vector folder", "folder written by `steer build`"),
    "--dev-per-lang": ("dev ids", "dev fact ids per relation"),
    "--test-per-lang": ("test ids", "test fact ids per relation"),
    "--task-layers": ("task layers", "layers tried for the task vector"),
    "--task-alphas": ("task scales", "scales tried for the task vector"),
    "--diff-layers": ("diff layers", "layers tried for the diff vector"),
    "--diff-alphas": ("diff scales", "scales tried for the diff vector"),
    "--top-k": ("re-scored settings", "settings of each vector re-scored on all of dev"),
    "--screen-ids": ("screen ids", "dev fact ids that score the whole grid first"),
    "--en-tolerance": ("English tolerance", "largest allowed drop of English dev accuracy"),
    "--p-threshold": ("dev p threshold", "McNemar p a setting must beat no intervention by on dev"),
    "--config": ("fixed setting", "task_layer,task_alpha,diff_layer,diff_alpha instead of the sweep"),
    "--repeats": ("re-splits", "re-split this many times with other salts"),
    "--transfer": ("transfer matrix", "also measure the transfer matrix: by relation, lang or both"),
    "--transfer-ids": ("transfer sizes", "transfer matrix sizes B,S,D,T"),
    "--transfer-cells": ("transfer cells", "full matrix or only its diagonal"),
    "--transfer-only": ("transfer only", "run only the transfer matrix"),
    # replicate
    "--paper": ("paper", "whose claims: lu2025, sundar2025 or all"),
    "--claims-metric": ("claims' metric", "how the lu2025 claim rows score facts"),
    "--budget": ("budget", "sample sizes of the claims: quick or full"),
    "--settings": ("settings overrides", "overrides of the budget's settings (JSON or a .json file)"),
    "--strict": ("strict exit", "exit with status 3 when a stage failed"),
}  # fmt: skip

#: Words that meant several things in the code, each meaning with its own name now:
#: word -> [(meaning, "module:function:parameter" or "module:name" that carries it)].
CODE_NAMES: dict[str, list[tuple[str, str]]] = {
    "cache": [
        ("key-value cache of decoding", "mechlingo.scoring.evaluate:DecodeOptions:cache"),
        ("checkpoints of a resumable run", "mechlingo.analyses.recall.steer_eval:evaluate_test:checkpoint"),
        ("the model cache folder", "mechlingo.core.artifacts:cleanup_stale:model_cache"),
    ],
    "tuned": [
        ("the tuned lens (decoder `tuned`, --tuned-lens)", "mechlingo.analyses.decoders.tuned_lens:TunedLens"),
        ("the template family measured best on the embedded model", "mechlingo.data.io:TEMPLATE_FAMILIES"),
        ("a chat (instruction-following) model", "mechlingo.core.tokens:looks_chat_model"),
    ],
    "metric": [
        ("the scoring rule of facts (generate, klar, rank)", "mechlingo.scoring.evaluate:evaluate_conditions:metric"),
        ("what a patched run is read out as", "mechlingo.analyses.recall.patching.grid:resolve_grid:readout"),
        ("a column of the side-effects matrix (accuracy, perplexity, output language)", "mechlingo.viz.side_effects:side_effects_heatmap:measures"),
        ("a per-sentence alignment value (retrieval, distances) with its interval", "mechlingo.viz.experts:interval_bars_figure:measures"),
    ],
    "stage": [
        ("one analysis of the claims card (its module, claims and cost)", "mechlingo.card.stages.base:Stage"),
        ("a finished step of a resumable run, kept on disk", "mechlingo.core.checkpoints:Checkpoints"),
        ("a layer band of the recall pipeline (enrichment, recall, conversion)", "mechlingo.analyses.recall.trace_patching:pipeline_phases"),
    ],
    "family": [
        ("a model family: the architectures one record of hooks and layout serves", "mechlingo.core.families:FAMILIES"),
        ("a claim family: the claims adjusted together for multiple testing", "mechlingo.card.claims:row_family"),
        ("a template family: the wording of the bundled prompts (natural or measured)", "mechlingo.data.io:TEMPLATE_FAMILIES"),
    ],
}  # fmt: skip

#: One word per concept in the names of classes, modules, functions and constants:
#: concept -> (its word, the words it must not be called, the modules or packages that hold
#: it). ``tests/cli/test_glossary_names.py`` checks that the word names something in each of
#: those modules (a definition, or a key of the JSON it writes) and that nothing there is
#: named with a forbidden word.
CONCEPT_WORDS: dict[str, tuple[str, tuple[str, ...], tuple[str, ...]]] = {
    "scoring metric": ("metric", ("readout", "measure"), ("mechlingo.scoring.scorers", "mechlingo.card.metric_rule")),
    "patching readout": ("readout", ("metric", "measure"), ("mechlingo.analyses.recall.patching", "mechlingo.analyses.recall.gradients", "mechlingo.analyses.circuits.runs")),
    "side-effect measure": ("measure", ("metric", "readout"), ("mechlingo.scoring.side_effects",)),
    "alignment measure": ("measure", ("metric", "readout"), ("mechlingo.analyses.experts.align", "mechlingo.report.experts", "mechlingo.card.stages.align")),
    "resumable checkpoint": ("checkpoint", ("stage", "cache"), ("mechlingo.core.checkpoints", "mechlingo.cli.work")),
    "card stage": ("stage", ("checkpoint", "phase"), ("mechlingo.card.stages.base",)),
    "recall-pipeline phase": ("phase", ("stage",), ("mechlingo.analyses.recall.trace_patching", "mechlingo.viz.patching")),
}  # fmt: skip


def about(flag: str, detail: str = "") -> str:
    """The ``--help`` text of ``flag``: its one meaning from :data:`FLAGS`, then what the
    command adds (``detail``); every command takes its flags' help from here, so a flag
    means one thing everywhere (``tests/cli/test_glossary.py`` checks each parser)."""
    meaning = FLAGS[flag][1].replace("%", "%%")
    return f"{meaning}; {detail}" if detail else meaning

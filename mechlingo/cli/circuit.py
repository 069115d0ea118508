"""The ``mechlingo circuit`` subcommand: measured circuits per language, compared.

``mechlingo circuit --langs en,fr --relation capital --attribution eap-ig --out DIR`` keeps
each language's correctly answered facts, scores every edge of the model's graph on subject
pairs (EAP or EAP-IG), verifies the top edges by exact edge patching, draws the faithfulness
curve (with MIB's CPR and CMD) and picks the smallest circuit reaching ``--faithfulness``;
then every two languages' circuits are compared (edge overlap against random circuits,
cross-language faithfulness). It writes ``circuits/<lang>.json``, ``curves.json`` and
``curves.csv``, ``overlap.json``, ``cross_faithfulness.json``, ``report.html`` and, last,
``summary.json``. Under ``torchrun`` the prompts are shared out among the ranks. The method:
``docs/methods/circuits.md``; the run is
:func:`mechlingo.analyses.circuits.languages.circuits_by_language`.
"""

from __future__ import annotations

import argparse
import time
from typing import Any

from mechlingo.analyses.circuits import languages
from mechlingo.cli import common, cost
from mechlingo.cli.glossary import about
from mechlingo.cli.streams import outputs_written
from mechlingo.core.defaults import CIRCUIT_PROMPTS
from mechlingo.core.distributed import is_main, sharded_scoring
from mechlingo.core.inert import inert_csv
from mechlingo.report.circuit import circuit_report
from mechlingo.report.page import write_outputs


def _circuit_args(p: argparse.ArgumentParser) -> None:
    common.add_model_args(p)
    common.add_data_args(p)
    common.add_out_arg(p)
    common.add_max_new_tokens_arg(p, note="to keep the facts answered correctly")
    g = p.add_argument_group("circuit")
    g.add_argument("--attribution", choices=("eap", "eap-ig"), default="eap-ig",
                   help=about("--attribution", "eap: edge attribution patching; eap-ig: with "
                   "integrated gradients"))  # fmt: skip
    g.add_argument("--ig-steps", type=int, default=5, help=about("--ig-steps", "of "
                   "--attribution eap-ig; each one more copy of the batch"))  # fmt: skip
    g.add_argument("--faithfulness", type=float, default=0.8, help=about("--faithfulness",
                   "the smallest circuit of the curve reaching it is reported"))  # fmt: skip
    g.add_argument("--selection", choices=("top", "greedy"), default="top",
                   help=about("--selection", "greedy: each edge leading into the circuit"))  # fmt: skip
    g.add_argument("--verify-edges", type=int, default=20, help=about("--verify-edges",
                   "0 = none"))  # fmt: skip
    g.add_argument("--positions", choices=("roles", "all"), default="roles",
                   help=about("--positions", "roles: start, subject, subject_last, relation, "
                   "last"))  # fmt: skip
    g.add_argument("--readout", choices=("logprob", "logit_diff"), default="logprob",
                   help=about("--readout", "the answer's log-probability, or the clean minus "
                   "the corrupted answer's"))  # fmt: skip
    g.add_argument("--circuit-prompts", type=int, default=CIRCUIT_PROMPTS,
                   help=about("--circuit-prompts", "the first ones; the documented runs pass "
                   "40, which leaves at least 20 pairs after the equal-length partner rule"))  # fmt: skip
    cost.add_dry_run_arg(p)


def _check(args: argparse.Namespace, facts: list[Any]) -> None:
    """What the parser cannot check, before the model loads."""
    if args.circuit_prompts < 3:
        raise common.UsageError(
            f"--circuit-prompts {args.circuit_prompts}: a circuit's intervals need at least 3 "
            "facts", fix="give --circuit-prompts 3 or more (20 or more for a real run)"
        )  # fmt: skip
    rels = sorted({f.relation for f in facts})
    if len(rels) > 1:
        raise common.UsageError(
            f"--relation: {len(rels)} relations ({', '.join(rels)}); a circuit is measured on "
            "one relation's subject pairs", fix="give one relation, e.g. --relation capital"
        )  # fmt: skip
    if not facts:
        raise common.UsageError("no facts selected", fix="check --langs, --relation, --facts")


@common.command(
    "circuit", "measured circuits per language (EAP/EAP-IG), faithfulness, overlap", _circuit_args
)
def cmd_circuit(args: argparse.Namespace) -> int:
    facts = common.load_selected_facts(args)
    _check(args, facts)
    groups = 5 if args.positions == "roles" else 1
    steps = args.ig_steps if args.attribution == "eap-ig" else 1
    plan = cost.plan_circuit(
        facts, prompts=args.circuit_prompts, steps=steps, verify=args.verify_edges,
        groups=groups, max_new_tokens=args.max_new_tokens, model=args.model,
    )  # fmt: skip
    if cost.announce(plan, args):
        return 0
    model = common.load_cli_model(args, facts=facts)
    t0 = time.time()
    with sharded_scoring(), common.usage_errors(ValueError):
        lc = languages.circuits_by_language(
            model, facts, prompts=args.circuit_prompts, max_new_tokens=args.max_new_tokens,
            method=args.attribution, steps=steps, readout=args.readout,
            positions=args.positions, selection=args.selection, target=args.faithfulness,
            verify=args.verify_edges, batch_size=args.batch_size, progress=not args.quiet,
        )  # fmt: skip
    meta = common.run_meta(model, args, n_facts=len(facts), seconds=round(time.time() - t0, 1),
                           **_settings(args, steps))  # fmt: skip
    if not is_main():  # under torchrun rank 0 writes and prints
        return 0
    write_outputs(args.out, _files(lc, meta))
    outputs_written()
    _print(lc)
    print(f"wrote {args.out}/circuits/, curves.json, curves.csv, overlap.json, "
          "cross_faithfulness.json, report.html and summary.json")  # fmt: skip
    return 0


def _settings(args: argparse.Namespace, steps: int) -> dict[str, Any]:
    return {
        "attribution": args.attribution, "ig_steps": steps, "readout": args.readout,
        "positions": args.positions, "selection": args.selection,
        "faithfulness_target": args.faithfulness, "verify_edges": args.verify_edges,
        "circuit_prompts": args.circuit_prompts,
    }  # fmt: skip


def _files(lc: languages.LanguageCircuits, meta: dict[str, Any]) -> dict[str, Any]:
    """Every output, ``summary.json`` last (a folder with it is a finished run)."""
    import pandas as pd

    files: dict[str, Any] = {
        f"circuits/{lg}.json": {**r.to_json(), "run": meta} for lg, r in lc.results.items()
    }
    files["curves.json"] = lc.curves()
    files["curves.csv"] = inert_csv(pd.DataFrame(lc.curve_rows()))
    files["overlap.json"] = lc.overlap
    files["cross_faithfulness.json"] = lc.cross
    files["report.html"] = circuit_report(lc, meta)
    files["summary.json"] = {"meta": meta, **lc.summary()}
    return files


def _print(lc: languages.LanguageCircuits) -> None:
    for lg, r in lc.results.items():
        f, a = r.faithfulness, r.areas
        print(f"{lg}: n = {r.n} facts, {len(r.circuit)} of {len(r.ranked)} edges, "
              f"faithfulness {f['faithfulness']:.2f} [{f['lo']:.2f}, {f['hi']:.2f}], "
              f"CPR {a['cpr']['value']:.2f}, CMD {a['cmd']['value']:.2f}")  # fmt: skip
    for lg, why in lc.skipped.items():
        print(f"{lg}: no circuit ({why})")
    done = set()
    for a, row in lc.overlap.items():
        for b, o in row.items():
            if (b, a) not in done:
                done.add((a, b))
                print(f"{a}-{b}: edge Jaccard {o['jaccard']:.2f} (null {o['null_mean']:.3f}, "
                      f"p = {o['p']:.4f})")  # fmt: skip

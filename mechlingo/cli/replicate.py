"""``mechlingo replicate``: the papers' claims checked on a model, in one command.

Writes ``OUT/claims.json`` (the rules, one row per claim, the run's settings and timings),
``OUT/claims.md`` (the verdict table) and ``OUT/report.html`` (the verdict table first, then
the figure behind each row). Checkpoints are kept in ``.OUT.work/`` beside ``OUT`` (or
``--work``), keyed by the model's fingerprint, the data and the settings, by the rule every
long command follows (:mod:`mechlingo.cli.work`): a stopped run (Ctrl-C, SIGTERM, a killed
job) run again goes on after the last checkpoint, ``--fresh`` starts over, and the
stages are removed once ``OUT`` is written. A stage
that fails becomes the rows of its claims with the error; the others still run, and the
command exits 0 with the card written (``--strict``: exit 3 when a stage failed).
The claims are measured by :func:`mechlingo.card.replicate.replicate`.
"""

from __future__ import annotations

import argparse
from pathlib import Path
from typing import Any

from mechlingo.card.plan import Plan
from mechlingo.card.replicate import BUDGETS, METRICS, PAPERS, CardData, CardOptions, replicate
from mechlingo.cli.common import (
    UsageError,
    add_model_args,
    add_out_arg,
    add_parallel_arg,
    command,
    load_cli_model,
)
from mechlingo.cli.glossary import about
from mechlingo.cli.streams import outputs_written
from mechlingo.cli.work import (
    add_work_args,
    all_ranks_have,
    finish_checkpoints,
    require_finished,
    work_folder,
)
from mechlingo.core.checkpoints import Checkpoints
from mechlingo.core.distributed import dist_info, is_main, sharded_scoring
from mechlingo.core.errors import MechlingoError
from mechlingo.core.untrusted import loads
from mechlingo.data import detect_format, load_benchmark, read_facts, read_parallel_dir
from mechlingo.data.natural_parallel import read_documents
from mechlingo.report import write_outputs
from mechlingo.report.replicate import replicate_report

_FACT_SUFFIXES = (".jsonl", ".json", ".tsv", ".tab")


def _replicate_args(p: argparse.ArgumentParser) -> None:
    add_model_args(p)
    p.add_argument("--paper", choices=[*PAPERS, "all"], default="all", help=about("--paper",
                   "lu2025 = recall pipeline, repair vectors; sundar2025 = expert neurons, "
                   "alignment"))  # fmt: skip
    p.add_argument("--budget", choices=sorted(BUDGETS), default="quick", help=about("--budget",
                   "quick: about 10 min on the embedded model on 2 CPU cores; full: about 45 "
                   "min; every verdict comes with its interval in both"))  # fmt: skip
    p.add_argument("--facts", default=None, metavar="FILE|DIR", help=about("--facts", "for the "
                   "lu2025 claims (default: the bundled natural fact-completion stems); a "
                   "BMLAMA or KLAR folder runs the same families on its facts under the "
                   "benchmark's own metric (BMLAMA: rank, KLAR: klar; --claims-metric "
                   "overrides)"))  # fmt: skip
    p.add_argument("--external", default=None, metavar="DIR", help=about("--external", "the "
                   "vectors and layer/scale chosen on the --facts (or bundled) data, scored "
                   "unchanged on the benchmark by its metric; default: none, no external rows"))  # fmt: skip
    add_parallel_arg(p, "for the sundar2025 claims (default: the bundled parallel sentences)")
    p.add_argument("--claims-metric", choices=list(METRICS), default=None,
                   help=about("--claims-metric", "default: the metric rule, which decides on "
                   "dev data before any test item is scored: greedy generation when it "
                   "answers above the floor, candidate ranking otherwise (claims.json gives "
                   "its inputs and decision); generate, rank or klar override the rule, and "
                   "the card says so"))  # fmt: skip
    p.add_argument("--plan", action="store_true", help=about("--plan", "per primary row, its "
                   "power simulated through its own verdict at the budget's units, the minimum "
                   "detectable effect, the facts, documents and random draws 80%% power needs, "
                   "and the CPU time; writes OUT/plan.json and scores no test item"))  # fmt: skip
    p.add_argument("--target", default=None, help=about("--target", "default: es, the papers' "
                   "Spanish intervention"))  # fmt: skip
    p.add_argument("--settings", default=None, metavar="JSON|FILE", help=about("--settings",
                   "e.g. '{\"experts\": {\"ks\": [100, 500]}}' (docs/replicate.md); default: none, "
                   "the budget's own"))  # fmt: skip
    add_out_arg(p)
    p.add_argument("--strict", action="store_true", help=about("--strict", "the card is still "
                   "written"))  # fmt: skip
    add_work_args(p)


def read_facts_arg(path: str) -> list[Any]:
    """Facts from a file, or from every ``.jsonl``/``.tsv`` file of a folder (sorted)."""
    p = Path(path)
    files = (
        sorted(q for q in p.iterdir() if q.suffix.lower() in _FACT_SUFFIXES) if p.is_dir() else [p]
    )
    if not files:
        raise UsageError(f"{path} has no .jsonl or .tsv facts file", where="--facts")
    try:
        facts = [f for q in files for f in read_facts(q)]
    except MechlingoError:
        raise
    except (ValueError, OSError) as err:
        raise UsageError(str(err), where="--facts") from err
    if not facts:
        raise UsageError(f"{path} holds no facts", where="--facts")
    return facts


#: benchmark formats of --facts that make external-transfer rows, and the metric of each
_EXTERNAL = {"bmlama": "rank", "klar": "klar", "klar_flat": "klar"}


def _benchmark(path: str) -> tuple[list[Any], str] | None:
    """``(facts, metric)`` of a BMLAMA or KLAR folder (the loader's facts and the
    benchmark's own scoring rule), or ``None`` when ``path`` is not one."""
    p = Path(path)
    fmt = None
    if p.is_dir():
        try:
            fmt = detect_format(p)
        except (MechlingoError, ValueError, OSError):
            fmt = None
    if fmt not in _EXTERNAL:
        return None
    bench = load_benchmark(p, format=fmt)
    if not bench.facts:
        raise UsageError(f"{path}: the {fmt} folder holds no usable facts", where="--facts")
    return bench.facts, _EXTERNAL[fmt]


def _facts_arg(path: str) -> tuple[list[Any], str | None]:
    """``(facts, metric)`` of ``--facts``: a benchmark folder (BMLAMA, KLAR) gives its facts
    and its own metric; anything else the facts of a file or folder, and no metric (the
    metric rule decides)."""
    got = _benchmark(path)
    return got if got is not None else (read_facts_arg(path), None)


def _external_arg(path: str) -> tuple[list[Any], str]:
    """``--external``: a benchmark folder's facts and metric."""
    got = _benchmark(path)
    if got is None:
        raise UsageError(f"{path} is not a BMLAMA or KLAR folder", where="--external",
                         fix="give a folder of BMLAMA <lang>.tsv files or a KLAR folder")  # fmt: skip
    return got


def _settings_arg(text: str | None) -> dict[str, Any]:
    """``--settings``: JSON text or a ``.json`` file with an object of overrides."""
    if not text:
        return {}
    try:
        src = Path(text).read_text(encoding="utf-8") if text.strip().endswith(".json") else text
        value = loads(src, UsageError, "--settings")
    except (ValueError, OSError) as err:
        raise UsageError(f"--settings is not valid JSON: {err}", where="--settings") from err
    if not isinstance(value, dict):
        raise UsageError("--settings takes a JSON object", where="--settings",
                         fix='e.g. \'{"experts": {"ks": [100, 500]}}\'')  # fmt: skip
    return value


@command("replicate", "the papers' claims checked on a model: claims.json, claims.md, report", _replicate_args)  # fmt: skip
def cmd_replicate(args: argparse.Namespace) -> int:
    facts, bench_metric = _facts_arg(args.facts) if args.facts else (None, None)
    external, ext_metric = _external_arg(args.external) if args.external else (None, "rank")
    parallel = documents = None
    if args.parallel:
        try:
            parallel = read_parallel_dir(args.parallel)
            documents = read_documents(args.parallel, len(next(iter(parallel.values()))))
        except MechlingoError:
            raise
        except (ValueError, OSError) as err:
            raise UsageError(str(err), where="--parallel") from err
    settings = _settings_arg(args.settings)
    require_finished(args, work_folder(args))
    model = load_cli_model(args)
    settings.setdefault("batch_size", args.batch_size)
    if args.target:
        settings.setdefault("experts", {})["target"] = args.target
    options = CardOptions(paper=args.paper, budget=args.budget, settings=settings,
                          metric=args.claims_metric or bench_metric)  # fmt: skip
    work = work_folder(args)  # the message of a stopped run names it (cli.main)
    agree = all_ranks_have if dist_info().world_size > 1 else None
    with sharded_scoring():  # under torchrun each rank scores its share of every batch
        card = replicate(
            model, options, CardData(facts=facts, parallel=parallel, documents=documents,
                                     external=external, external_metric=ext_metric),
            work=work, progress=not args.quiet, fresh=args.fresh, agree=agree, plan=args.plan,
        )  # fmt: skip
    if isinstance(card, Plan):
        write_outputs(args.out, {"plan.json": card.to_json()})
        outputs_written()
        if is_main():  # under torchrun rank 0 writes and speaks
            print(f"wrote {args.out}/plan.json")
        return 0
    card.meta["facts"] = args.facts or "bundled (natural templates)"
    if bench_metric is not None and args.claims_metric is None:
        card.meta["facts_metric"] = f"the benchmark's own metric ({bench_metric})"
    if args.external:
        card.meta["external"] = args.external
    card.meta["parallel"] = args.parallel or "bundled NTREX-128 subset (CC BY-SA 4.0)"
    card.meta["metric"] = card.meta["settings"].get("metric", args.claims_metric)
    write_outputs(
        args.out,
        {"claims.json": card.to_json(), "claims.md": card.to_markdown(),
         "report.html": replicate_report(card)},
    )  # fmt: skip
    outputs_written()
    finish_checkpoints(Checkpoints(work, {}), card.meta["work"])
    failed = [n for n, t in card.meta["stages"].items() if t.get("error")]
    if is_main():  # under torchrun rank 0 writes and speaks
        for r in card.rows:
            print(f"{r['verdict']:>17}  {r['id']}: {r['value_text']}")
        print(f"wrote {args.out}/claims.json, claims.md and report.html")
        if failed:
            print(f"stages that failed (their rows carry the error): {', '.join(failed)}")
    return 3 if failed and args.strict else 0  # 3: see mechlingo.cli.main.main

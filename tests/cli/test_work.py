"""The one rule of interrupted runs (mechlingo.cli.work): checkpoints in ``.OUT.work``,
the same command run again goes on from them, ``--fresh`` starts over. A run stopped in a
later checkpoint and run again writes the same outputs as an uninterrupted run without recomputing
the checkpoints; changed settings do not reuse stale checkpoints. The kill tests SIGKILL each
long command (steer eval with and without --transfer, experts, align, tuned-lens, replicate)
at a random checkpoint, run it again, and count what was recomputed."""

from __future__ import annotations

import argparse
import json
import os
import signal
import time
from pathlib import Path

import pytest
import torch

import mechlingo.analyses.experts.kcurve as experts_mod
import mechlingo.analyses.experts.run as experts_run
import mechlingo.analyses.recall.dev_grid as dev_grid
import mechlingo.analyses.recall.steer_eval as protocol
import mechlingo.analyses.recall.steering as repair
from mechlingo.cli import main
from mechlingo.cli.common import UsageError
from mechlingo.cli.work import settings_key, work_folder
from tests.forks import fork_call, torchrun


def _summary(out: Path) -> dict:
    s = json.loads((out / "summary.json").read_text())
    s["meta"].pop("seconds")  # the only timing field
    return s


def _count(monkeypatch, module, name: str, calls: dict, stop_when=None):
    """Wrap ``module.name`` to count its calls (and raise KeyboardInterrupt when
    ``stop_when(*args, **kw)`` is true)."""
    real = getattr(module, name)

    def wrapper(*a, **kw):
        calls[name] = calls.get(name, 0) + 1
        if stop_when is not None and stop_when(*a, **kw):
            raise KeyboardInterrupt
        return real(*a, **kw)

    monkeypatch.setattr(module, name, wrapper)


# --------------------------------------------------------------------------------------
# The work folder and the key
# --------------------------------------------------------------------------------------


def test_work_folder_beside_out_and_never_inside(tmp_path):
    ns = argparse.Namespace(out=str(tmp_path / "res"), work=None)
    assert work_folder(ns) == tmp_path / ".res.work"
    ns.work = str(tmp_path / "res" / "checkpoints")
    with pytest.raises(UsageError, match="inside --out"):
        work_folder(ns)
    ns.work = str(tmp_path / "res")
    with pytest.raises(UsageError, match="inside --out"):
        work_folder(ns)
    ns.work = str(tmp_path / "elsewhere")
    assert work_folder(ns) == tmp_path / "elsewhere"


def test_settings_key_drops_only_what_changes_no_number():
    ns = argparse.Namespace(out="a", quiet=True, work="w", resume=True, seed=3, k="5,10",
                            batch_size=8, _texts={"en": []}, shard_store=Path("x"))  # fmt: skip
    assert settings_key(ns) == {"batch_size": 8, "k": "5,10", "seed": 3}
    assert settings_key(ns, skip=("k",)) == {"batch_size": 8, "seed": 3}


def test_ranks_reuse_a_stage_only_when_every_rank_has_it(tmp_path):
    """Under torchrun each rank keeps its own checkpoints; ``agree`` (an all-reduce there) says
    whether every rank has a checkpoint: when one rank lacks it, all ranks recompute it."""
    from mechlingo.core.checkpoints import Checkpoints

    calls: list[str] = []
    a = Checkpoints(tmp_path / "r0", {"k": 1}, agree=lambda done: done and other_has[0])
    other_has = [False]
    a.run("s", lambda: calls.append("first") or {"v": 1})
    a2 = Checkpoints(tmp_path / "r0", {"k": 1}, agree=lambda done: done and other_has[0])
    a2.run("s", lambda: calls.append("again") or {"v": 1})  # the other rank lacks it
    other_has[0] = True
    a3 = Checkpoints(tmp_path / "r0", {"k": 1}, agree=lambda done: done and other_has[0])
    a3.run("s", lambda: calls.append("never") or {"v": 1})
    assert calls == ["first", "again"]


def test_torchrun_keeps_stages_per_rank_and_resumes(tmp_path, monkeypatch, tiny):
    import mechlingo.cli.work as work
    from mechlingo.core.distributed import DistInfo

    seen: list[bool] = []
    monkeypatch.setattr(work, "dist_info", lambda: DistInfo(1, 2, 1, None, torch.device("cpu")))
    monkeypatch.setattr(work, "all_ranks_have", lambda done: seen.append(done) or done)
    ns = argparse.Namespace(out=str(tmp_path / "o"), work=None, resume=False, fresh=False,
                            quiet=True, command="experts", seed=0)  # fmt: skip
    st = work.open_checkpoints(ns, tiny, {"d": "x"})
    assert st.key["rank"] == [1, 2]
    st.run("a", lambda: {"v": 1})
    ns.resume = True  # --resume under torchrun: this rank's checkpoints are there
    work.open_checkpoints(ns, tiny, {"d": "x"}).run("a", lambda: {"v": 2})
    assert seen == [False, True]  # the ranks were asked both times; the second reused


def test_resume_refuses_when_there_is_nothing_to_go_on_from(tmp_path, tiny):
    import mechlingo.cli.work as work

    ns = argparse.Namespace(out=str(tmp_path / "o"), work=None, resume=True, fresh=False,
                            quiet=True, command="experts", seed=0)  # fmt: skip
    with pytest.raises(UsageError, match="--resume: no checkpoint"):
        work.open_checkpoints(ns, tiny, {"d": "x"})
    with pytest.raises(UsageError, match="--resume: no checkpoint"):
        work.require_finished(ns, tmp_path / ".o.work")
    ns.resume = False
    work.open_checkpoints(ns, tiny, {"d": "x"}).run("a", lambda: {"v": 1})
    ns.resume = True
    assert work.open_checkpoints(ns, tiny, {"d": "x"}).run("a", lambda: {"v": 2}) == {"v": 1}
    work.require_finished(ns, tmp_path / ".o.work")  # a checkpoint: goes on
    ns.seed = 1  # another setting: another key, nothing of it finished
    with pytest.raises(UsageError, match="--resume: no checkpoint"):
        work.open_checkpoints(ns, tiny, {"d": "x"})
    ns.fresh = True
    with pytest.raises(UsageError, match="contradict"):
        work.open_checkpoints(ns, tiny, {"d": "x"})


# --------------------------------------------------------------------------------------
# steer eval on the tiny model: stopped in the side effects (the last checkpoint), resumed
# --------------------------------------------------------------------------------------


def test_steer_eval_resumes_to_the_same_summary(tiny_dir, tmp_path, monkeypatch, capsys):
    common = ["--model", str(tiny_dir), "--langs", "en,fr,de", "--limit", "30", "--quiet"]
    vdir = tmp_path / "v"
    assert main(["steer", "build", *common, "--k-shot", "2", "--out", str(vdir)]) == 0
    lines = tmp_path / "lines"
    lines.mkdir()
    for lg, text in {"en": "The cat sat", "fr": "Le chat est", "de": "Die Katze sitzt"}.items():
        (lines / f"{lg}.txt").write_text(f"{text}\n{text} again\n", "utf-8")
    grid = ["--task-layers", "0", "--diff-layers", "1", "--task-alphas", "0.1,0.5",
            "--diff-alphas", "0.5", "--top-k", "1", "--screen-ids", "2", "--max-new-tokens",
            "2", "--control-seeds", "0,1", "--repeats", "2", "--side-effects", "--parallel",
            str(lines), "--side-effects-lines", "2"]  # fmt: skip

    def run(out: str, *extra: str) -> int:
        return main(["steer", "eval", *common, "--vectors", str(vdir), *grid, *extra,
                     "--out", str(tmp_path / out)])  # fmt: skip

    assert run("full") == 0
    assert not (tmp_path / ".full.work").exists()  # removed once --out is written
    full = _summary(tmp_path / "full")

    calls: dict = {}
    _count(monkeypatch, protocol, "side_effects", calls, stop_when=lambda *a, **kw: True)
    assert run("b") == 130
    assert not (tmp_path / "b").exists()
    assert "run the same command again" in capsys.readouterr().err
    checkpoints = next((tmp_path / ".b.work").iterdir())
    done = {p.name for p in checkpoints.iterdir() if (p / "result.json").is_file()}
    assert {"r0-sweep", "r1-build", "r1-sweep", "r0-test-orig", "r0-test-random_s1",
            "r0-test-headroom", "r1-test-both"} <= done  # fmt: skip
    assert "side-effects" not in done

    monkeypatch.undo()
    for mod, name in ((repair, "build_steering_vectors"), (dev_grid, "choose_on_dev"),
                      (dev_grid, "score"), (dev_grid, "headroom"),
                      (protocol, "side_effects")):  # fmt: skip
        _count(monkeypatch, mod, name, calls)
    calls.clear()
    assert run("b", "--resume") == 0
    assert calls == {"side_effects": 1}  # nothing else was recomputed
    assert _summary(tmp_path / "b") == full
    assert (tmp_path / "b" / "generations.jsonl").read_text() == (
        tmp_path / "full" / "generations.jsonl"
    ).read_text()

    # changed settings: a resume with another --max-new-tokens reuses no checkpoint
    calls.clear()
    _count(monkeypatch, protocol, "side_effects", {}, stop_when=lambda *a, **kw: True)
    assert run("c") == 130
    monkeypatch.undo()
    for mod, name in ((dev_grid, "choose_on_dev"), (repair, "build_steering_vectors")):
        _count(monkeypatch, mod, name, calls)
    calls.clear()
    assert run("c", "--max-new-tokens", "3") == 0
    assert calls == {"choose_on_dev": 2, "build_steering_vectors": 1}


# --------------------------------------------------------------------------------------
# experts on the tiny model: stopped inside the k curve, resumed
# --------------------------------------------------------------------------------------


def _count_arms(monkeypatch, calls: dict, stop_at_k: int | None = None) -> None:
    """Record in ``calls["arms"]`` the name of every k-curve arm computed (not read back
    from a checkpoint), and raise KeyboardInterrupt when an arm of ``stop_at_k`` is about to be."""
    real = experts_mod._run_arms

    def wrapper(model, lang, todo, *a, **kw):
        if stop_at_k is not None and any(arm.k == stop_at_k for arm in todo):
            raise KeyboardInterrupt
        calls.setdefault("arms", []).extend(arm.name for arm in todo)
        return real(model, lang, todo, *a, **kw)

    monkeypatch.setattr(experts_mod, "_run_arms", wrapper)


def test_experts_resumes_to_the_same_summary(tiny_dir, tmp_path, monkeypatch, capsys):
    from tests.analyses.experts.test_stats import _write_data

    data = _write_data(tmp_path / "data")
    every_arm = ["none", "k3-experts", "k3-random", "k5-experts", "k5-random"]

    def run(out: str, *extra: str) -> int:
        return main(["experts", "--model", str(tiny_dir), "--target", "es", "--k", "3,5",
                     "--parallel", str(data), "--lines", "4", "--heldout", "2", "--samples", "3",
                     "--sample-tokens", "3", "--ppl-budget", "1000", "--quiet", *extra,
                     "--out", str(tmp_path / out)])  # fmt: skip

    def stopped_in_k5(out: str) -> None:
        """Run into ``out`` and press Ctrl-C as the k curve's k = 5 arms start."""
        stopped: dict = {}
        _count_arms(monkeypatch, stopped, stop_at_k=5)
        assert run(out) == 130
        assert stopped["arms"] == every_arm[:3]  # no clamp and k = 3 finished first
        assert "run the same command again" in capsys.readouterr().err
        assert not (tmp_path / out).exists()
        monkeypatch.undo()

    # --resume with nothing to go on from is refused before any computation
    assert run("full", "--resume") == 2
    assert "--resume: no checkpoint" in capsys.readouterr().err
    assert not (tmp_path / "full").exists()
    calls: dict = {}
    _count_arms(monkeypatch, calls)
    assert run("full") == 0
    assert calls["arms"] == every_arm  # each arm run alone, in order
    monkeypatch.undo()
    full = _summary(tmp_path / "full")

    # Ctrl-C in the k curve's second k (the stats, scores, clamps and k = 3 are finished)
    stopped_in_k5("b")
    for mod, name in ((experts_run, "collect_neuron_stats"), (experts_run, "score_neurons")):
        _count(monkeypatch, mod, name, calls)
    _count_arms(monkeypatch, calls)
    calls.clear()
    assert run("b", "--resume") == 0
    assert calls == {"arms": ["k5-experts", "k5-random"]}  # nothing before k = 5
    assert _summary(tmp_path / "b") == full
    for name in ("kcurve.csv", "experts.csv", "es-k5/intervention.safetensors",
                 "es-k5-random/intervention.safetensors"):  # fmt: skip
        assert (tmp_path / "b" / name).read_bytes() == (tmp_path / "full" / name).read_bytes()
    monkeypatch.undo()

    # --fresh starts over, even with checkpoints of the same settings
    stopped_in_k5("c")
    _count(monkeypatch, experts_run, "collect_neuron_stats", calls)
    _count_arms(monkeypatch, calls)
    calls.clear()
    assert run("c", "--fresh") == 0
    assert calls == {"collect_neuron_stats": 1, "arms": every_arm}
    assert _summary(tmp_path / "c") == full
    monkeypatch.undo()

    # changed settings (another --seed): no stale checkpoint is reused
    stopped_in_k5("d")
    _count(monkeypatch, experts_run, "collect_neuron_stats", calls)
    _count_arms(monkeypatch, calls)
    calls.clear()
    assert run("d", "--seed", "1") == 0
    assert calls == {"collect_neuron_stats": 1, "arms": every_arm}
    monkeypatch.undo()

    # adding a k is not another setting: the checkpoints of every other k are reused
    stopped_in_k5("e")
    _count_arms(monkeypatch, calls)
    calls.clear()
    assert run("e", "--k", "2,3,5") == 0
    assert calls == {"arms": ["k2-experts", "k2-random", "k5-experts", "k5-random"]}
    rows = {(r["k"], r["arm"]): r for r in json.loads((tmp_path / "e" / "summary.json")
                                                        .read_text())["k_curve"]["es"]}  # fmt: skip
    for r in full["k_curve"]["es"]:
        assert rows[(r["k"], r["arm"])] == r


# --------------------------------------------------------------------------------------
# Kill tests: SIGKILL at a random checkpoint of each long command, then the same command again
# --------------------------------------------------------------------------------------


def _strip_times(x, also: tuple[str, ...] = ()):
    """``x`` without the fields that measure time (``seconds``, ``cpu_seconds``) or say
    whether a checkpoint was read back (``cached``), and without the fields ``also``."""
    drop = ("seconds", "cpu_seconds", "cached", "work", *also)
    if isinstance(x, dict):
        return {k: _strip_times(v, also) for k, v in x.items() if k not in drop}
    if isinstance(x, list):
        return [_strip_times(v, also) for v in x]
    return x


def _outputs(out: Path, *also: str) -> dict[str, object]:
    """Every file of ``out`` but the report (which prints the seconds): JSON without times."""
    files: dict[str, object] = {}
    for p in sorted(out.rglob("*")):
        if p.is_file() and p.suffix != ".html":
            rel = str(p.relative_to(out))
            files[rel] = (
                _strip_times(json.loads(p.read_text()), also)
                if p.suffix == ".json"
                else p.read_bytes()
            )
    return files


def _log(path: Path) -> list[tuple[str, str]]:
    if not path.is_file():
        return []
    return [tuple(line.split(" ", 1)) for line in path.read_text().splitlines()]


def _kill_and_rerun(argv: list[str], tmp_path: Path, monkeypatch, seed: str) -> dict:
    """An uninterrupted run (in process), a run SIGKILLed (a forked child) when it is about
    to store its N-th computed checkpoint (N drawn at random), and the same command run again:
    equal outputs, and the rerun computes exactly the checkpoints the killed run had not
    stored."""
    import random

    monkeypatch.setenv("MECHLINGO_CHECKPOINT_LOG", str(tmp_path / "full.log"))
    assert main([*argv, "--out", str(tmp_path / "full")]) == 0
    computed = [n for what, n in _log(tmp_path / "full.log") if what == "computed"]
    assert computed, "the command kept no stage"
    assert not (tmp_path / ".full.work").exists()  # removed once --out is written
    n = random.Random(seed).randint(1, len(computed))
    (tmp_path / "tmp").mkdir()
    env = {"MECHLINGO_TEST_KILL_CHECKPOINT": str(n), "MECHLINGO_CHECKPOINT_LOG": str(tmp_path / "killed.log"),
           "TMPDIR": str(tmp_path / "tmp")}  # fmt: skip
    # a forked child is killed as a new interpreter would be (its files stay as the kill left
    # them, its temporary ones in tmp/) without importing the package and its libraries again
    code = fork_call(
        lambda: main([*argv, "--out", str(tmp_path / "b")]), tmp_path / "killed.out", env
    )
    assert code == -9, (tmp_path / "killed.out").read_text()[-3000:]
    assert not (tmp_path / "b").exists()
    stored = [nm for what, nm in _log(tmp_path / "killed.log") if what == "computed"]
    assert stored == computed[: n - 1]
    monkeypatch.setenv("MECHLINGO_CHECKPOINT_LOG", str(tmp_path / "rerun.log"))
    assert main([*argv, "--out", str(tmp_path / "b")]) == 0
    again = [nm for what, nm in _log(tmp_path / "rerun.log") if what == "computed"]
    assert sorted(again) == sorted(computed[n - 1 :])  # only the unfinished part
    assert _outputs(tmp_path / "b") == _outputs(tmp_path / "full")
    assert not (tmp_path / ".b.work").exists()
    return {"checkpoints": len(computed), "killed_at": n, "recomputed": len(again)}


def _lines(folder: Path, n: int = 6) -> Path:
    from tests.analyses.experts.test_stats import _write_data

    return _write_data(folder, n)


@pytest.fixture(scope="module")
def vectors(tiny_dir, tmp_path_factory) -> Path:
    v = tmp_path_factory.mktemp("kill") / "v"
    assert main(["steer", "build", "--model", str(tiny_dir), "--langs", "en,fr,de", "--limit",
                 "30", "--k-shot", "2", "--quiet", "--out", str(v)]) == 0  # fmt: skip
    return v


_EVAL = ["--langs", "en,fr,de", "--limit", "30", "--quiet", "--task-layers", "0",
         "--diff-layers", "1", "--task-alphas", "0.5", "--diff-alphas", "0.5", "--top-k", "1",
         "--screen-ids", "2", "--max-new-tokens", "2", "--control-seeds", "0,1"]  # fmt: skip


def test_kill_steer_eval(tiny_dir, vectors, tmp_path, monkeypatch):
    argv = ["steer", "eval", "--model", str(tiny_dir), "--vectors", str(vectors), *_EVAL]
    got = _kill_and_rerun(argv, tmp_path, monkeypatch, "steer eval")
    assert got["recomputed"] == got["checkpoints"] - got["killed_at"] + 1


def test_kill_steer_eval_transfer(tiny_dir, vectors, tmp_path, monkeypatch):
    argv = ["steer", "eval", "--model", str(tiny_dir), "--vectors", str(vectors), *_EVAL,
            "--relation", "all", "--transfer", "lang", "--transfer-ids", "3,1,1,1",
            "--transfer-cells", "diagonal"]  # fmt: skip
    _kill_and_rerun(argv, tmp_path, monkeypatch, "steer eval --transfer")


def test_kill_experts(tiny_dir, tmp_path, monkeypatch):
    data = _lines(tmp_path / "data")
    argv = ["experts", "--model", str(tiny_dir), "--target", "es", "--k", "3,5", "--parallel",
            str(data), "--lines", "4", "--heldout", "2", "--samples", "3", "--sample-tokens", "3",
            "--ppl-budget", "1000", "--quiet"]  # fmt: skip
    _kill_and_rerun(argv, tmp_path, monkeypatch, "experts")


def test_kill_align(tiny_dir, tiny, tmp_path, monkeypatch):
    from mechlingo.interventions import NeuronClamp

    data = _lines(tmp_path / "data")
    clamp = NeuronClamp({0: [1, 2]}, 3.0).save(tmp_path / "clamp", tiny)
    argv = ["align", "--model", str(tiny_dir), "--parallel", str(data), "--lines", "6",
            "--clamp", str(clamp), "--quiet"]  # fmt: skip
    _kill_and_rerun(argv, tmp_path, monkeypatch, "align")


def test_kill_tuned_lens(tiny_dir, tmp_path, monkeypatch):
    argv = ["tuned-lens", "--model", str(tiny_dir), "--langs", "en,fr", "--steps", "3",
            "--texts-per-step", "2", "--max-tokens", "8", "--lines", "8", "--heldout", "4",
            "--quiet"]  # fmt: skip
    _kill_and_rerun(argv, tmp_path, monkeypatch, "tuned-lens")


def test_kill_replicate(tiny_dir, tmp_path, monkeypatch):
    from tests.card.test_replicate import TINY, _parallel

    data = tmp_path / "par"
    data.mkdir()
    for lg, lines in _parallel().items():
        (data / f"{lg}.txt").write_text("\n".join(lines[:20]) + "\n", encoding="utf-8")
    argv = ["replicate", "--model", str(tiny_dir), "--paper", "sundar2025", "--parallel",
            str(data), "--settings", json.dumps(TINY), "--quiet"]  # fmt: skip
    _kill_and_rerun(argv, tmp_path, monkeypatch, "replicate")


@pytest.mark.slow
def test_kill_experts_under_torchrun(tiny_dir, tmp_path, monkeypatch):
    """``torchrun --nproc_per_node 2`` (forked, :func:`tests.forks.torchrun`): SIGKILL at a
    random checkpoint, the same torchrun command again: each rank reuses what every rank had
    stored, recomputes the rest, and rank 0 writes what a one-process run writes."""
    import random

    data = _lines(tmp_path / "data")
    argv = ["experts", "--model", str(tiny_dir), "--target", "es", "--k", "3,5", "--parallel",
            str(data), "--lines", "4", "--heldout", "2", "--samples", "3", "--sample-tokens", "3",
            "--ppl-budget", "1000", "--quiet"]  # fmt: skip
    monkeypatch.setenv("MECHLINGO_CHECKPOINT_LOG", str(tmp_path / "one.log"))
    assert main([*argv, "--out", str(tmp_path / "one")]) == 0
    computed = [n for what, n in _log(tmp_path / "one.log") if what == "computed"]
    n = random.Random("torchrun").randint(2, len(computed))

    def launch(log: str, kill: int | None):
        env = {"MECHLINGO_CHECKPOINT_LOG": str(tmp_path / log),
               "MECHLINGO_TEST_KILL_CHECKPOINT": None if kill is None else str(kill)}  # fmt: skip
        cmd = ["-m", "mechlingo.cli", *argv, "--out", str(tmp_path / "two")]
        return torchrun(cmd, tmp_path / log.replace("-{rank}", ".out"), env)

    assert launch("killed-{rank}.log", n).returncode != 0
    assert not (tmp_path / "two").exists()
    stored = [[nm for w, nm in _log(tmp_path / f"killed-{r}.log") if w == "computed"]
              for r in (0, 1)]  # fmt: skip
    everywhere = min(len(s) for s in stored)  # the checkpoints every rank had stored
    proc = launch("rerun-{rank}.log", None)
    assert proc.returncode == 0, proc.stdout[-3000:]
    for r in (0, 1):
        log = _log(tmp_path / f"rerun-{r}.log")
        again = [nm for w, nm in log if w == "computed"]
        assert sorted(again) == sorted(computed[everywhere:]), (r, stored, again)
    # equal to the one-process run but for the number of processes each clamp records
    assert _outputs(tmp_path / "two", "world_size") == _outputs(tmp_path / "one", "world_size")


# --------------------------------------------------------------------------------------
# Two runs of one work folder at once; a name near the limit
# --------------------------------------------------------------------------------------


def _hold_stages(ns: argparse.Namespace, model, ready: int) -> None:
    """In a forked child: open this run's checkpoints, finish one, tell the parent, wait."""
    import mechlingo.cli.work as work

    try:
        torch.set_num_threads(1)  # the parent's OpenMP pool does not exist in a fork
        st = work.open_checkpoints(ns, model, {"d": "x"})  # a live run holds its checkpoints
        st.run("a", lambda: {"v": 1})
        os.write(ready, b"ok")
        time.sleep(120)
        st.run("b", lambda: {"v": 2})
    finally:
        os._exit(0)


def test_a_work_folder_in_use_is_refused_and_a_killed_holder_frees_it(tmp_path, tiny):
    """A second run of the same command while the first is alive is refused with one line
    naming the first (its checkpoint untouched, also under --fresh); once the first is
    SIGKILLed, the lock is gone with it and the next run goes on from its checkpoint."""
    import mechlingo.cli.work as work
    from mechlingo.core.errors import OutputError

    ns = argparse.Namespace(out=str(tmp_path / "o"), work=None, resume=False, fresh=False,
                            quiet=True, command="experts", seed=0)  # fmt: skip
    read, write = os.pipe()
    pid = os.fork()
    if pid == 0:
        _hold_stages(ns, tiny, write)
    os.close(write)
    try:
        assert os.read(read, 2) == b"ok"
        for fresh in (False, True):
            ns.fresh = fresh
            with pytest.raises(OutputError) as err:
                work.open_checkpoints(ns, tiny, {"d": "x"})
            assert f"in use by another run (process {pid})" in str(err.value)
            assert "\n" not in str(err.value)
        ns.fresh = False
        assert len(list((tmp_path / ".o.work").glob("*/a/result.json"))) == 1
    finally:
        os.kill(pid, signal.SIGKILL)
        os.waitpid(pid, 0)
        os.close(read)
    st = work.open_checkpoints(ns, tiny, {"d": "x"})
    assert st.run("a", lambda: {"v": 2}) == {"v": 1}  # went on from the killed run's checkpoint
    work.finish_checkpoints(st)
    assert not (tmp_path / ".o.work").exists()  # no lock file left behind


def test_an_out_name_near_the_limit_gets_a_work_folder(tmp_path, tiny):
    """``--out`` a legal 250-byte name: ``.OUT.work`` would pass the 255-byte limit, so the
    work folder gets a shortened name, and the checkpoints work and go away at the end."""
    import mechlingo.cli.work as work

    ns = argparse.Namespace(out=str(tmp_path / ("é" * 125)), work=None, resume=False,
                            fresh=False, quiet=True, command="experts", seed=0)  # fmt: skip
    folder = work.work_folder(ns)
    assert folder.parent == tmp_path and len(os.fsencode(folder.name)) <= 255
    st = work.open_checkpoints(ns, tiny, {"d": "x"})
    assert st.run("a", lambda: {"v": 1}) == {"v": 1}
    assert work.open_checkpoints(ns, tiny, {"d": "x"}).run("a", lambda: {"v": 2}) == {"v": 1}
    work.finish_checkpoints(st)
    assert list(tmp_path.iterdir()) == []

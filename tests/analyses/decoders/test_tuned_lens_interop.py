"""Tuned lenses in the ``tuned-lens`` package's format
(:mod:`mechlingo.analyses.decoders.tuned_lens_interop`): the round trip, the refusals of untrusted or
malformed checkpoints, and (slow) the reference check against the package itself in its own
environment (``scripts/check_tuned_lens_interop.py``: logits within 1e-5 at every layer,
both ways)."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest
import torch
from safetensors.torch import save_file

from mechlingo.analyses.decoders.tuned_lens import TunedLens
from mechlingo.analyses.decoders.tuned_lens_interop import (
    export_package_lens,
    load_package_lens,
    unembedding_hash,
)
from mechlingo.core.errors import ArtifactError, MissingArtifactError, ModelMismatchError
from tests.forks import fork_call
from tests.scripts import load_script

ROOT = Path(__file__).resolve().parents[3]


def _random_lens(model, seed=0):
    lens = TunedLens.for_model(model)
    g = torch.Generator().manual_seed(seed)
    with torch.no_grad():
        lens.weight.copy_(torch.randn(lens.weight.shape, generator=g) * 0.05)
        lens.bias.copy_(torch.randn(lens.bias.shape, generator=g) * 0.5)
    return lens


def test_round_trip_in_the_package_format(tiny, tmp_path):
    lens = _random_lens(tiny)
    folder = export_package_lens(lens, tmp_path / "lens", model=tiny)
    config = json.loads((folder / "config.json").read_text())
    n, d = tiny.cfg.n_layers, tiny.cfg.d_model
    assert config["num_hidden_layers"] == n and config["d_model"] == d
    assert config["lens_type"] == "linear_tuned_lens" and config["bias"] is True
    assert config["unembed_hash"] == unembedding_hash(tiny)
    state = torch.load(folder / "params.pt", weights_only=True)  # the package's layout
    assert sorted(state) == sorted(f"{i}.{p}" for i in range(n) for p in ("weight", "bias"))
    assert torch.equal(state["1.weight"], lens.weight[1].detach())
    back = load_package_lens(folder, tiny)
    assert torch.equal(back.weight, lens.weight) and torch.equal(back.bias, lens.bias)
    assert back.model_info == lens.model_info and back.meta["source"] == "tuned-lens package"
    h = torch.randn(5, d)
    for e in range(n):  # the package's translator: h + W h + b
        expect = h + h @ state[f"{e}.weight"].T + state[f"{e}.bias"]
        torch.testing.assert_close(back(h, e), expect)


def test_safetensors_params_and_no_bias(tiny, tmp_path):
    folder = export_package_lens(_random_lens(tiny, 1), tmp_path / "lens", model=tiny)
    state = torch.load(folder / "params.pt", weights_only=True)
    (folder / "params.pt").unlink()
    save_file(
        {k: v for k, v in state.items() if k.endswith("weight")}, folder / "params.safetensors"
    )
    lens = load_package_lens(folder, tiny)
    assert torch.equal(lens.weight[0], state["0.weight"])
    assert not lens.bias.any()  # a lens trained without bias


class _Payload:
    """Unpickling this would call ``Path.touch``: the kind of object a checkpoint must not
    be allowed to carry."""

    def __init__(self, marker: Path) -> None:
        self.marker = marker

    def __reduce__(self):
        return (Path.touch, (self.marker,))


def test_a_checkpoint_that_needs_more_than_tensors_is_refused(tiny, tmp_path):
    folder = export_package_lens(_random_lens(tiny), tmp_path / "lens", model=tiny)
    marker = tmp_path / "code-ran"
    state = torch.load(folder / "params.pt", weights_only=True)
    torch.save({**state, "0.extra": _Payload(marker)}, folder / "params.pt")
    with pytest.raises(ArtifactError, match="needs more than tensors"):
        load_package_lens(folder, tiny)
    assert not marker.exists()


@pytest.mark.parametrize(
    "edit, error, match",
    [
        (lambda s, c: s.update({"1.weight": torch.zeros(3, 3)}), ArtifactError, "translator 1"),
        (lambda s, c: s.pop("0.weight"), ArtifactError, "translator 0"),
        (lambda s, c: s.update({"9.weight": torch.zeros(1)}), ArtifactError, "unexpected"),
        (lambda s, c: c.update({"lens_type": "mlp"}), ArtifactError, "not supported"),
        (lambda s, c: c.update({"d_model": 0}), ArtifactError, "positive integer"),
        (lambda s, c: c.update({"unembed_hash": "0" * 64}), ModelMismatchError, "unembedding"),
    ],
)
def test_malformed_lenses_are_refused(tiny, tmp_path, edit, error, match):
    folder = export_package_lens(_random_lens(tiny), tmp_path / "lens", model=tiny)
    state = torch.load(folder / "params.pt", weights_only=True)
    config = json.loads((folder / "config.json").read_text())
    edit(state, config)
    torch.save(state, folder / "params.pt")
    (folder / "config.json").write_text(json.dumps(config))
    with pytest.raises(error, match=match):
        load_package_lens(folder, tiny)


def test_other_model_and_missing_files(tiny, tmp_path):
    with pytest.raises(MissingArtifactError, match="config.json"):
        load_package_lens(tmp_path, tiny)
    lens = TunedLens(tiny.cfg.n_layers + 1, tiny.cfg.d_model)
    folder = export_package_lens(lens, tmp_path / "other")
    assert json.loads((folder / "config.json").read_text())["unembed_hash"] is None
    assert load_package_lens(folder).n_layers == tiny.cfg.n_layers + 1  # no model: no check
    with pytest.raises(ModelMismatchError, match="layers"):
        load_package_lens(folder, tiny)


@pytest.mark.slow
def test_agrees_with_the_tuned_lens_package_both_ways(tmp_path):
    """The reference check's three steps (``scripts/check_tuned_lens_interop.py``): ``dump``
    and ``verify`` in mechlingo's environment (forked children of this process,
    :func:`tests.forks.fork_call`), ``check`` in the package's own environment (built once
    by ``scripts/build_tunedlens_env.sh``; skipped with the reason when it cannot be
    built)."""
    venv = ROOT / ".venv-tunedlens"
    env = {**os.environ, "TUNEDLENS_VENV": str(venv), "DEV_PY": sys.executable}
    build = subprocess.run(["bash", str(ROOT / "scripts" / "build_tunedlens_env.sh")],
                           capture_output=True, text=True, env=env, timeout=1800)  # fmt: skip
    if build.returncode != 0:
        pytest.skip(f"the tuned-lens environment could not be built: {build.stderr[-500:]}")
    script = load_script("check_tuned_lens_interop")
    assert fork_call(lambda: script.dump(tmp_path), tmp_path / "dump.log") == 0, (
        tmp_path / "dump.log"
    ).read_text()[-3000:]
    env.pop("PYTHONPATH", None)  # the package's environment sees nothing of this one
    proc = subprocess.run(
        [str(venv / "bin" / "python"), script.__file__, "check", str(tmp_path)],
        capture_output=True, text=True, env=env, timeout=900,
    )  # fmt: skip
    assert proc.returncode == 0, proc.stdout[-3000:] + proc.stderr[-3000:]
    assert "mechlingo -> tuned-lens: agree within 1e-05" in proc.stdout
    code = fork_call(lambda: script.verify(tmp_path), tmp_path / "verify.log")
    verified = (tmp_path / "verify.log").read_text()
    assert code == 0, verified[-3000:]
    assert "tuned-lens -> mechlingo: agree within 1e-05" in verified

"""Files from strangers: every artifact format mechlingo reads, as an attacker would write it.

One test per format and attack. Each hostile file is written byte by byte here (a pickle in
place of safetensors, a header that declares 400 GB in a 1 KB file, a symlink that climbs
out of the folder, JSON nested a million levels deep, NaN values, a layer or neuron the model
has not) and must be refused at load with one line naming the file: no code runs (the
pickle's payload would create a marker file), nothing outside the folder is read, and
nothing large is allocated. A sample goes through the CLI too: exit status 2, one line,
``--out`` not created. See ``docs/security.md``.
"""

from __future__ import annotations

import json
import math
import os
import struct
from pathlib import Path

import pytest
import torch
from safetensors.torch import save_file

from mechlingo.analyses.decoders.tuned_lens import TunedLens, load_tuned_lens
from mechlingo.analyses.recall.steering import SteeringPair
from mechlingo.cli import main
from mechlingo.core.checkpoints import Checkpoints
from mechlingo.core.errors import ArtifactError, DataError, MechlingoError, ModelLoadError
from mechlingo.core.untrusted import MAX_JSON_DEPTH, gguf_header, json_depth
from mechlingo.data.benchmarks import load_benchmark
from mechlingo.data.facts import RecordError
from mechlingo.data.io import MAX_LINE_BYTES, read_facts
from mechlingo.interventions import NeuronClamp, SteeringVector, load_intervention
from mechlingo.interventions.export import export, read_export, read_gguf

# --------------------------------------------------------------------------------------
# What an attacker writes
# --------------------------------------------------------------------------------------


class _Payload:
    """Unpickling this creates ``marker``: the proof that code ran."""

    def __init__(self, marker: Path) -> None:
        self.marker = marker

    def __reduce__(self):
        return (Path.touch, (self.marker,))


def _pickle_file(path: Path, marker: Path) -> None:
    torch.save({"vector": torch.zeros(4), "x": _Payload(marker)}, path)


def _safetensors_raw(path: Path, header: dict, data: bytes = b"") -> None:
    """A safetensors file with a hand-written header (whatever it claims)."""
    h = json.dumps(header).encode()
    path.write_bytes(struct.pack("<Q", len(h)) + h + data)


def _deep_json(depth: int = 200_000) -> str:
    return '{"format": 1, "kind": "SteeringVector", "x": ' + "[" * depth + "]" * depth + "}"


def _gguf_str(s: bytes) -> bytes:
    return struct.pack("<Q", len(s)) + s


def _gguf_file(path: Path, tensors: list[tuple[bytes, list[int], int]], data: bytes,
               kv: bytes = b"", n_kv: int = 0, n_tensors: int | None = None) -> None:  # fmt: skip
    """A GGUF v3 file: ``kv`` (already packed), tensor infos, padding to 32, ``data``."""
    infos = b""
    offset = 0
    for name, dims, nbytes in tensors:
        infos += _gguf_str(name) + struct.pack("<I", len(dims))
        infos += b"".join(struct.pack("<Q", d) for d in dims) + struct.pack("<IQ", 0, offset)
        offset += nbytes
    n = len(tensors) if n_tensors is None else n_tensors
    head = b"GGUF" + struct.pack("<IQQ", 3, n, n_kv) + kv + infos
    head += b"\0" * (-len(head) % 32)
    path.write_bytes(head + data)


def _kv_string(key: bytes, value: bytes) -> bytes:
    return _gguf_str(key) + struct.pack("<I", 8) + _gguf_str(value)


def _edit_json(path: Path, fn) -> None:
    doc = json.loads(path.read_text())
    fn(doc)
    path.write_text(json.dumps(doc))


@pytest.fixture()
def marker(tmp_path):
    m = tmp_path / "code-ran"
    yield m
    assert not m.exists(), "the pickle's payload ran"


@pytest.fixture()
def vec(tiny, tmp_path):
    """A good saved SteeringVector folder of the tiny model."""
    d = int(tiny.cfg.d_model)
    return SteeringVector(torch.ones(d), 1, 0.5).save(tmp_path / "vec", tiny)


@pytest.fixture()
def clamp(tiny, tmp_path):
    return NeuronClamp({0: [1, 2]}, 3.0).save(tmp_path / "clamp", tiny)


@pytest.fixture()
def lens(tiny, tmp_path):
    return TunedLens.for_model(tiny).save(tmp_path / "lens")


# --------------------------------------------------------------------------------------
# A saved intervention folder
# --------------------------------------------------------------------------------------


def test_good_intervention_loads(vec, clamp, tiny):
    assert load_intervention(vec, tiny).alpha == 0.5
    assert load_intervention(clamp, tiny).layers == (0,)


def test_intervention_pickle_is_refused_and_never_run(vec, marker):
    _pickle_file(vec / "intervention.safetensors", marker)
    with pytest.raises(ArtifactError, match="not a valid safetensors"):
        load_intervention(vec)


def test_intervention_tensor_symlink_out_of_the_folder(vec, tmp_path, tiny):
    outside = tmp_path / "elsewhere.safetensors"
    save_file({"vector": torch.ones(int(tiny.cfg.d_model))}, str(outside))
    (vec / "intervention.safetensors").unlink()
    (vec / "intervention.safetensors").symlink_to(outside)
    with pytest.raises(ArtifactError, match="points outside"):
        load_intervention(vec)


def test_intervention_json_symlink_to_a_system_file(vec):
    (vec / "intervention.json").unlink()
    (vec / "intervention.json").symlink_to("/etc/passwd")
    with pytest.raises(ArtifactError, match="points outside"):
        load_intervention(vec)


def test_intervention_json_nested_a_million_levels(vec):
    (vec / "intervention.json").write_text(_deep_json(1_000_000))
    with pytest.raises(ArtifactError, match="deeper than"):
        load_intervention(vec)


def test_intervention_json_of_100_gb_is_not_read(vec):
    with open(vec / "intervention.json", "r+b") as f:
        f.truncate(100 * 2**30)  # sparse: a stranger's 100 GB description
    with pytest.raises(ArtifactError, match="at most"):
        load_intervention(vec)


def test_intervention_header_declaring_400_gb(vec):
    _safetensors_raw(vec / "intervention.safetensors",
                     {"vector": {"dtype": "F32", "shape": [10**11], "data_offsets": [0, 4 * 10**11]}},
                     b"\0" * 1000)  # fmt: skip
    assert (vec / "intervention.safetensors").stat().st_size < 2000
    with pytest.raises(ArtifactError, match="declares"):
        load_intervention(vec)


def test_intervention_header_length_of_100_gb(vec):
    (vec / "intervention.safetensors").write_bytes(struct.pack("<Q", 100 * 2**30) + b"{}")
    with pytest.raises(ArtifactError, match="header claims"):
        load_intervention(vec)


def test_intervention_nan_vector(vec, tiny):
    v = torch.ones(int(tiny.cfg.d_model))
    v[3] = math.nan
    save_file({"vector": v}, str(vec / "intervention.safetensors"))
    with pytest.raises(ArtifactError, match="tensor 'vector' holds NaN or infinite"):
        load_intervention(vec)


@pytest.mark.parametrize("alpha", ["Infinity", "NaN", "-Infinity"])
def test_intervention_non_finite_alpha(vec, alpha):
    text = (vec / "intervention.json").read_text()
    doc = json.loads(text)
    doc["config"]["alpha"] = 12345.5
    (vec / "intervention.json").write_text(json.dumps(doc).replace("12345.5", alpha))
    with pytest.raises(MechlingoError, match="alpha (has NaN or infinite|is (inf|-inf|nan);)"):
        load_intervention(vec)


def test_clamp_with_infinite_values(clamp):
    save_file({"neurons.0": torch.tensor([1, 2]), "values.0": torch.tensor([1.0, math.inf])},
              str(clamp / "intervention.safetensors"))  # fmt: skip
    with pytest.raises(ArtifactError, match="tensor 'values.0' holds NaN or infinite"):
        load_intervention(clamp)


def test_clamp_neuron_out_of_range_is_refused_at_load(clamp, tiny):
    save_file({"neurons.0": torch.tensor([1, 10**6]), "values.0": torch.tensor([1.0, 2.0])},
              str(clamp / "intervention.safetensors"))  # fmt: skip
    assert load_intervention(clamp).layers == (0,)  # without a model nothing says otherwise
    with pytest.raises(MechlingoError, match="out of range"):
        load_intervention(clamp, tiny)


def test_intervention_layer_out_of_range_is_refused_at_load(vec, tiny):
    _edit_json(vec / "intervention.json", lambda d: d["config"].update(layer=999))
    with pytest.raises(MechlingoError, match="999"):
        load_intervention(vec, tiny)


def test_intervention_width_not_the_models(vec, tiny):
    save_file({"vector": torch.ones(int(tiny.cfg.d_model) + 5)},
              str(vec / "intervention.safetensors"))  # fmt: skip
    _edit_json(vec / "intervention.json", lambda d: d["meta"].pop("model"))
    with pytest.warns(UserWarning, match="records no model"):
        with pytest.raises(MechlingoError, match="width"):
            load_intervention(vec, tiny)


def test_intervention_tensor_name_overlap(vec, tiny):
    d = int(tiny.cfg.d_model)
    _safetensors_raw(vec / "intervention.safetensors",
                     {"vector": {"dtype": "F32", "shape": [d], "data_offsets": [0, 4 * d]},
                      "other": {"dtype": "F32", "shape": [d], "data_offsets": [4, 4 * d + 4]}},
                     b"\0" * (4 * d + 4))  # fmt: skip
    with pytest.raises(ArtifactError, match="overlap"):
        load_intervention(vec)


# --------------------------------------------------------------------------------------
# A vectors folder (steer build)
# --------------------------------------------------------------------------------------


@pytest.fixture()
def vdir(tiny, tmp_path):
    d, n = int(tiny.cfg.d_model), int(tiny.cfg.n_layers)
    task = SteeringVector(torch.ones(n, d), None, 1.0)
    diff = SteeringVector(torch.ones(n, d) * 2, None, 1.0)
    folder = tmp_path / "vdir"
    SteeringPair(task, diff, {}, {"unit": "raw"}).save(folder, tiny)
    return folder


def test_vectors_folder_with_a_linked_part(vdir, tmp_path, tiny):
    assert SteeringPair.load(vdir, tiny).unit == "raw"
    elsewhere = tmp_path / "planted"
    (vdir / "task").rename(elsewhere)
    (vdir / "task").symlink_to(elsewhere)
    with pytest.raises(ArtifactError, match="points outside"):
        SteeringPair.load(vdir, tiny)


def test_vectors_build_json_nested_deep(vdir, tiny):
    (vdir / "build.json").write_text("[" * 100_000 + "]" * 100_000)
    with pytest.raises(ArtifactError, match="deeper than"):
        SteeringPair.load(vdir, tiny)


def test_vectors_stack_of_the_wrong_length(vdir, tiny):
    d, n = int(tiny.cfg.d_model), int(tiny.cfg.n_layers)
    save_file({"vector": torch.ones(n + 3, d)}, str(vdir / "task" / "intervention.safetensors"))
    with pytest.raises(MechlingoError, match="layers"):
        SteeringPair.load(vdir, tiny)


# --------------------------------------------------------------------------------------
# A tuned lens
# --------------------------------------------------------------------------------------


def test_good_lens_loads(lens, tiny):
    assert load_tuned_lens(lens, tiny).n_layers == int(tiny.cfg.n_layers)


def test_lens_pickle_is_refused(lens, marker):
    _pickle_file(lens / "translators.safetensors", marker)
    with pytest.raises(ArtifactError, match="not a valid safetensors"):
        load_tuned_lens(lens)


def test_lens_nan_weights(lens, tiny):
    n, d = int(tiny.cfg.n_layers), int(tiny.cfg.d_model)
    w = torch.zeros(n, d, d)
    w[0, 1, 2] = math.nan
    save_file({"weight": w, "bias": torch.zeros(n, d)}, str(lens / "translators.safetensors"))
    with pytest.raises(ArtifactError, match="NaN or infinite"):
        load_tuned_lens(lens)


def test_lens_declaring_a_huge_translator(lens):
    big = 2**20
    _safetensors_raw(lens / "translators.safetensors",
                     {"weight": {"dtype": "F32", "shape": [2, big, big], "data_offsets": [0, 8 * big * big]},
                      "bias": {"dtype": "F32", "shape": [2, big], "data_offsets": [0, 8 * big]}})  # fmt: skip
    with pytest.raises(ArtifactError, match="declares"):
        load_tuned_lens(lens)


def test_lens_of_another_shape_is_refused_before_reading(lens, tiny):
    n, d = int(tiny.cfg.n_layers), int(tiny.cfg.d_model)
    save_file({"weight": torch.zeros(n + 1, d, d), "bias": torch.zeros(n + 1, d)},
              str(lens / "translators.safetensors"))  # fmt: skip
    with pytest.raises(ArtifactError, match="translators"):
        load_tuned_lens(lens, tiny)


def test_lens_description_linked_from_elsewhere(lens, tmp_path):
    other = tmp_path / "other.json"
    other.write_text((lens / "tuned_lens.json").read_text())
    (lens / "tuned_lens.json").unlink()
    (lens / "tuned_lens.json").symlink_to(other)
    with pytest.raises(ArtifactError, match="points outside"):
        load_tuned_lens(lens)


# --------------------------------------------------------------------------------------
# A checkpoint cache entry
# --------------------------------------------------------------------------------------


def _stage(tmp_path) -> tuple[Checkpoints, list]:
    calls: list = []
    s = Checkpoints(tmp_path / "work", {"model": "m", "settings": {"k": 1}})
    s.run("a", lambda: calls.append(1) or {"v": 1})
    return s, calls


def test_stage_result_linked_out_of_the_folder(tmp_path):
    s, _ = _stage(tmp_path)
    secret = tmp_path / "secret.json"
    secret.write_text('{"v": 666}')
    (s.path("a") / "result.json").unlink()
    (s.path("a") / "result.json").symlink_to(secret)
    with pytest.raises(ArtifactError, match="points outside"):
        Checkpoints(tmp_path / "work", {"model": "m", "settings": {"k": 1}}).load("a")
    # run(): the unreadable checkpoint is never reused; it is removed and computed again
    again = Checkpoints(tmp_path / "work", {"model": "m", "settings": {"k": 1}})
    assert again.run("a", lambda: {"v": 2}) == {"v": 2}
    assert secret.read_text() == '{"v": 666}'  # the link's target is left as it was


def test_stage_result_nested_deep(tmp_path):
    s, _ = _stage(tmp_path)
    (s.path("a") / "result.json").write_text("[" * 500_000 + "]" * 500_000)
    with pytest.raises(ArtifactError, match="deeper than"):
        Checkpoints(tmp_path / "work", {"model": "m", "settings": {"k": 1}}).load("a")
    again = Checkpoints(tmp_path / "work", {"model": "m", "settings": {"k": 1}})
    assert again.run("a", lambda: {"v": 2}) == {"v": 2}  # recomputed, not reused


@pytest.mark.parametrize("field", ["mechlingo_version", "model", "settings"])
def test_stage_folder_of_another_key_is_recomputed(tmp_path, field):
    s, calls = _stage(tmp_path)
    _edit_json(s.folder / "key.json", lambda d: d.update({field: "another"}))
    again = Checkpoints(tmp_path / "work", {"model": "m", "settings": {"k": 1}})
    assert again.run("a", lambda: calls.append(2) or {"v": 2}) == {"v": 2}
    assert calls == [1, 2]  # recomputed, never reused


def test_stage_tensors_declaring_400_gb(tmp_path, monkeypatch):
    from mechlingo.analyses.experts import NeuronScores
    from mechlingo.analyses.experts.run import staged_scores

    s = Checkpoints(tmp_path / "work", {"k": 1})
    staged_scores(
        s, "scores", lambda: NeuronScores(torch.zeros(2, 3), torch.zeros(2, 3), torch.zeros(3))
    )
    _safetensors_raw(s.path("scores") / "scores.safetensors",
                     {"auroc": {"dtype": "F32", "shape": [10**11], "data_offsets": [0, 4 * 10**11]}})  # fmt: skip
    with pytest.raises(ArtifactError, match="declares"):
        staged_scores(Checkpoints(tmp_path / "work", {"k": 1}), "scores", lambda: None)


# --------------------------------------------------------------------------------------
# GGUF control vectors and GGUF models
# --------------------------------------------------------------------------------------


@pytest.fixture()
def gguf_cv(tiny, tmp_path):
    iv = SteeringVector(torch.ones(int(tiny.cfg.d_model)), 1, 1.0, site="resid_post")
    return export(iv, "llama.cpp", model=tiny).save(tmp_path / "cv.gguf")


def test_good_control_vector_reads(gguf_cv):
    assert set(read_gguf(gguf_cv).vectors) == {1}


def test_gguf_claiming_a_trillion_tensors(tmp_path):
    p = tmp_path / "x.gguf"
    p.write_bytes(b"GGUF" + struct.pack("<IQQ", 3, 2**40, 0) + b"\0" * 64)
    with pytest.raises(ArtifactError, match="declares"):
        read_gguf(p)


def test_gguf_string_of_a_petabyte(tmp_path):
    p = tmp_path / "x.gguf"
    kv = _gguf_str(b"controlvector.model_hint") + struct.pack("<IQ", 8, 2**50)
    _gguf_file(p, [], b"", kv=kv, n_kv=1)
    with pytest.raises(ArtifactError, match="string of"):
        read_gguf(p)


def test_gguf_array_of_a_billion_items(tmp_path):
    p = tmp_path / "x.gguf"
    kv = _gguf_str(b"tokenizer.ggml.tokens") + struct.pack("<IIQ", 9, 8, 10**9)
    _gguf_file(p, [], b"", kv=kv, n_kv=1)
    with pytest.raises(ArtifactError, match="items"):
        read_gguf(p)


def test_gguf_tensor_larger_than_the_file(tmp_path):
    p = tmp_path / "x.gguf"
    _gguf_file(p, [(b"direction.1", [2**40], 4 * 2**40)], b"\0" * 64)
    with pytest.raises(ArtifactError, match="declares|need"):
        read_gguf(p)


def test_gguf_nan_direction(tmp_path):
    p = tmp_path / "x.gguf"
    data = struct.pack("<4f", 1.0, math.nan, 0.0, 2.0)
    _gguf_file(p, [(b"direction.1", [4], 16)], data, kv=_kv_string(b"general.architecture",
               b"controlvector"), n_kv=1)  # fmt: skip
    with pytest.raises(ArtifactError, match="NaN or infinite"):
        read_gguf(p)


def test_gguf_direction_of_an_absurd_layer(tmp_path):
    p = tmp_path / "x.gguf"
    _gguf_file(p, [(b"direction.99999999", [4], 16)], b"\0" * 16)
    with pytest.raises(ArtifactError, match="direction"):
        read_gguf(p)


def test_gguf_meta_nested_deep(gguf_cv, tmp_path):
    p = tmp_path / "x.gguf"
    kv = _kv_string(b"mechlingo.export", ("[" * 100_000 + "]" * 100_000).encode())
    _gguf_file(p, [(b"direction.1", [4], 16)], b"\0" * 16, kv=kv, n_kv=1)
    with pytest.raises(ArtifactError, match="deeper than"):
        read_gguf(p)


def test_steering_vectors_export_nan_and_pickle(tmp_path, marker):
    p = tmp_path / "sv.safetensors"
    save_file({"layer_activations.1": torch.tensor([1.0, math.inf])}, str(p))
    with pytest.raises(ArtifactError, match="NaN or infinite"):
        read_export(p)
    _pickle_file(p, marker)
    with pytest.raises(ArtifactError, match="neither a GGUF"):
        read_export(p)


def test_gguf_model_claiming_a_trillion_keys(tmp_path):
    p = tmp_path / "model.gguf"
    p.write_bytes(b"GGUF" + struct.pack("<IQQ", 3, 0, 2**40) + b"\0" * 64)
    with pytest.raises(ModelLoadError, match="declares"):
        gguf_header(p, ModelLoadError)


# --------------------------------------------------------------------------------------
# Benchmark folders and facts files
# --------------------------------------------------------------------------------------


def _bmlama(folder: Path) -> Path:
    folder.mkdir()
    (folder / "en.tsv").write_text("Paris is the capital of [MASK].\tFrance\tFrance\n")
    return folder


def test_benchmark_file_linked_from_outside(tmp_path):
    folder = _bmlama(tmp_path / "bench")
    (folder / "fr.tsv").symlink_to("/etc/passwd")
    with pytest.raises(DataError, match="points outside"):
        load_benchmark(folder, format="bmlama")


def test_klar_file_nested_deep(tmp_path):
    f = tmp_path / "klar" / "en" / "capital.json"
    f.parent.mkdir(parents=True)
    f.write_text('{"samples": ' + "[" * 200_000 + "]" * 200_000 + "}")
    with pytest.raises(RecordError, match="deeper than"):
        load_benchmark(tmp_path / "klar", format="klar")


def test_benchmark_jsonl_line_of_hundreds_of_mb(tmp_path):
    folder = tmp_path / "mlama" / "P36"
    folder.mkdir(parents=True)
    (folder / "templates.jsonl").write_text('{"relation": "P36", "template": "[X] [Y]"}\n')
    with open(folder / "en.jsonl", "wb") as f:
        f.write(b'{"sub_label": "' + b"a" * (MAX_LINE_BYTES + 10) + b'"}\n')
    with pytest.raises(DataError, match="bytes long"):
        load_benchmark(tmp_path / "mlama", format="mlama")


def test_facts_line_nested_deep(tmp_path):
    f = tmp_path / "facts.jsonl"
    f.write_text("[" * 1_000_000 + "]" * 1_000_000 + "\n")
    with pytest.raises(RecordError, match="line 1 .*deeper than"):
        read_facts(f)


def test_facts_number_of_ten_thousand_digits(tmp_path):
    f = tmp_path / "facts.jsonl"
    f.write_text('{"id": ' + "9" * 10_000 + "}\n")
    with pytest.raises(RecordError, match="invalid JSON"):
        read_facts(f)


def test_facts_file_of_five_gb_is_not_read(tmp_path):
    f = tmp_path / "facts.jsonl"
    with open(f, "wb") as h:
        h.truncate(5 * 2**30)  # sparse
    with pytest.raises(DataError, match="at most"):
        read_facts(f)


def test_json_depth_ignores_brackets_in_strings():
    assert json_depth(json.dumps({"a": '[[[[" [[', "b": [[1]]})) == 3
    assert json_depth("[" * (MAX_JSON_DEPTH + 1) + "]" * (MAX_JSON_DEPTH + 1)) > MAX_JSON_DEPTH


# --------------------------------------------------------------------------------------
# The same through the command line: exit 2, one line, --out not created
# --------------------------------------------------------------------------------------


def _cli_refuses(argv: list[str], tmp_path: Path, capsys, fragment: str) -> None:
    out = tmp_path / "out"
    code = main([*argv, "--out", str(out)])
    err = capsys.readouterr().err
    assert code == 2, err[-2000:]
    assert "Traceback" not in err
    lines = [ln for ln in err.splitlines() if ln.startswith("mechlingo")]
    assert len(lines) == 1 and fragment in lines[0].lower(), err
    assert not out.exists()


def test_cli_hostile_facts_file(tiny_dir, tmp_path, capsys):
    f = tmp_path / "facts.jsonl"
    f.write_text("[" * 100_000 + "]" * 100_000 + "\n")
    _cli_refuses(["eval", "--model", str(tiny_dir), "--facts", str(f), "--quiet"], tmp_path,
                 capsys, "deeper than")  # fmt: skip


def test_cli_hostile_gguf_model(tmp_path, capsys):
    p = tmp_path / "model.gguf"
    p.write_bytes(b"GGUF" + struct.pack("<IQQ", 3, 2**40, 2**40) + b"\0" * 64)
    _cli_refuses(["eval", "--model", str(p), "--langs", "en", "--limit", "1", "--quiet"],
                 tmp_path, capsys, "declares")  # fmt: skip


def test_cli_hostile_clamp(tiny_dir, tiny, tmp_path, capsys):
    c = NeuronClamp({0: [1, 2]}, 3.0).save(tmp_path / "clamp", tiny)
    (c / "intervention.json").unlink()
    (c / "intervention.json").symlink_to("/etc/hostname")
    _cli_refuses(["align", "--model", str(tiny_dir), "--langs", "en,es", "--lines", "4",
                  "--clamp", str(c), "--quiet"], tmp_path, capsys, "points outside")  # fmt: skip


def test_cli_hostile_tuned_lens(tiny_dir, tiny, tmp_path, capsys):
    lens = TunedLens.for_model(tiny).save(tmp_path / "lens")
    n, d = int(tiny.cfg.n_layers), int(tiny.cfg.d_model)
    save_file({"weight": torch.full((n, d, d), math.nan), "bias": torch.zeros(n, d)},
              str(lens / "translators.safetensors"))  # fmt: skip
    _cli_refuses(["lens", "--model", str(tiny_dir), "--langs", "en", "--limit", "1",
                  "--decoder", "tuned", "--tuned-lens", str(lens), "--quiet"], tmp_path, capsys,
                 "nan or infinite")  # fmt: skip


def test_nothing_was_written_outside(tmp_path):
    """The tests above never write beside their folders (a sanity check of the harness)."""
    assert not any(p.name.startswith(".") and "building" in p.name for p in tmp_path.iterdir())
    assert os.environ.get("MECHLINGO_TEST_KILL_AT") is None


@pytest.mark.parametrize("name", ["../secret.json", "../../etc/passwd", "/etc/passwd", "a/../../x"])
def test_names_climbing_out_of_a_folder_are_refused(tmp_path, name):
    from mechlingo.core.untrusted import inside

    root = tmp_path / "artifact"
    root.mkdir()
    assert inside(root, "a/../ok.json", ArtifactError) == (root / "ok.json").resolve()
    with pytest.raises(ArtifactError, match="points outside"):
        inside(root, name, ArtifactError)
    with pytest.raises(ValueError, match="plain file name"):
        Checkpoints(tmp_path / "w", {"k": 1}).path(name)


def test_no_module_unpickles():
    """Nothing in mechlingo unpickles: no pickle/dill/joblib/marshal import, every
    ``torch.load`` with ``weights_only=True``, no ``np.load(allow_pickle=True)``."""
    import ast

    import mechlingo

    bad = []
    for path in sorted(Path(mechlingo.__file__).parent.rglob("*.py")):
        tree = ast.parse(path.read_text(encoding="utf-8"))
        for node in ast.walk(tree):
            if isinstance(node, (ast.Import, ast.ImportFrom)):
                names = [a.name for a in node.names] + [getattr(node, "module", None) or ""]
                if any(n.split(".")[0] in ("pickle", "dill", "joblib", "marshal", "cloudpickle")
                       for n in names):  # fmt: skip
                    bad.append(f"{path.name}:{node.lineno} imports a pickler")
            if isinstance(node, ast.Call) and isinstance(node.func, ast.Attribute):
                kw = {k.arg: k.value for k in node.keywords}
                owner = getattr(node.func.value, "id", "")
                if node.func.attr == "load" and owner == "torch":
                    flag = kw.get("weights_only")
                    if not (isinstance(flag, ast.Constant) and flag.value is True):
                        bad.append(f"{path.name}:{node.lineno} torch.load without weights_only")
                if node.func.attr == "load" and owner in ("np", "numpy"):
                    flag = kw.get("allow_pickle")
                    if flag is not None and not (isinstance(flag, ast.Constant) and not flag.value):
                        bad.append(f"{path.name}:{node.lineno} np.load(allow_pickle=...)")
                if node.func.attr == "from_pretrained" and "trust_remote_code" in kw:
                    flag = kw["trust_remote_code"]
                    if not (isinstance(flag, ast.Constant) and flag.value is False):
                        bad.append(f"{path.name}:{node.lineno} trust_remote_code")
    assert not bad, bad

"""The one JSON sanitiser (``core.jsonable``) and the one atomic file writer (``core.artifacts``)."""

from __future__ import annotations

import dataclasses
import json
import math
from pathlib import Path

import numpy as np
import pytest
import torch

from mechlingo.core.artifacts import atomic_file
from mechlingo.core.checkpoints import key_hash
from mechlingo.core.jsonable import jsonable
from mechlingo.kernels.significance import Interval


@dataclasses.dataclass
class _Plain:
    a: float
    b: tuple[int, ...]


def test_jsonable_nested_object_by_hand():
    obj = {
        "nan": float("nan"),
        "inf": math.inf,
        "-inf": -math.inf,
        "np_inf": np.float64("inf"),
        "np_f32": np.float32(0.5),
        "np_int": np.int64(7),
        "np_bool": np.bool_(True),
        "t_scalar": torch.tensor(2.5),
        "t_vec": torch.tensor([1.0, float("inf"), float("nan")]),
        "arr": np.array([[1, 2], [3, 4]]),
        "tuple": (1, (2.0, math.inf)),
        "set": {3, 1, 2},
        "path": Path("/tmp/x.json"),
        "iv": Interval(0.5, 0.25, math.inf, 8),
        "dc": _Plain(math.nan, (1, 2)),
        3: "int key",
        "ok": [None, "s", True, 1, 1.5],
    }
    want = {
        "nan": None,
        "inf": None,
        "-inf": None,
        "np_inf": None,
        "np_f32": 0.5,
        "np_int": 7,
        "np_bool": True,
        "t_scalar": 2.5,
        "t_vec": [1.0, None, None],
        "arr": [[1, 2], [3, 4]],
        "tuple": [1, [2.0, None]],
        "set": [1, 2, 3],
        "path": "/tmp/x.json",
        "iv": {"estimate": 0.5, "lo": 0.25, "hi": None, "n": 8, "confidence": 0.95},
        "dc": {"a": None, "b": [1, 2]},
        "3": "int key",
        "ok": [None, "s", True, 1, 1.5],
    }
    got = jsonable(obj)
    assert got == want
    # strict JSON accepts it, and the types are plain Python ones
    text = json.dumps(got, allow_nan=False)
    assert json.loads(text) == want
    assert type(got["np_f32"]) is float and type(got["np_int"]) is int
    assert type(got["np_bool"]) is bool


def test_jsonable_leaves_input_alone_and_key_hash_is_order_free():
    src = {"x": [math.inf], "y": (1, 2)}
    jsonable(src)
    assert src["x"][0] == math.inf and src["y"] == (1, 2)
    assert key_hash({"a": 1, "b": np.int64(2)}) == key_hash({"b": 2, "a": 1})
    assert key_hash({"a": math.nan}) == key_hash({"a": None})


def test_atomic_file_replaces_on_success(tmp_path):
    path = tmp_path / "sub" / "f.txt"
    with atomic_file(path) as tmp:
        assert tmp.parent == path.parent and tmp != path
        tmp.write_text("one")
    assert path.read_text() == "one"
    with atomic_file(path) as tmp:
        tmp.write_text("two")
    assert path.read_text() == "two"
    assert sorted(p.name for p in path.parent.iterdir()) == ["f.txt"]


def test_atomic_file_failure_mid_write_keeps_the_old_file(tmp_path):
    path = tmp_path / "f.bin"
    path.write_bytes(b"old content")
    with pytest.raises(RuntimeError, match="disk gone"):
        with atomic_file(path) as tmp:
            with open(tmp, "wb") as fh:
                fh.write(b"half of the new")
                raise RuntimeError("disk gone")
    assert path.read_bytes() == b"old content"
    assert [p.name for p in tmp_path.iterdir()] == ["f.bin"]  # no temporary left


def test_atomic_file_failure_leaves_no_file_when_none_existed(tmp_path):
    path = tmp_path / "new.json"
    with pytest.raises(ValueError):
        with atomic_file(path) as tmp:
            tmp.write_text("{")
            raise ValueError("bad")
    assert not path.exists() and not list(tmp_path.iterdir())


def test_write_files_writes_intervals_and_nan_as_strict_json(tmp_path):
    from mechlingo.core.artifacts import write_files
    from mechlingo.kernels.significance import paired_gain, wilson

    out = write_files(tmp_path / "o", {"a.json": {"w": wilson(3, 10), "x": math.nan,
                                                  "g": paired_gain([0, 1], [1, 1])}})  # fmt: skip
    text = (out / "a.json").read_text()
    assert "NaN" not in text and "Infinity" not in text
    got = json.loads(text)
    assert got["x"] is None and got["w"] == wilson(3, 10).to_json()
    assert got["g"]["estimate"] == 0.5 and got["g"]["relative"]["estimate"] == 1.0
    assert hash(wilson(3, 10)) == hash(wilson(3, 10))  # extras do not make it unhashable

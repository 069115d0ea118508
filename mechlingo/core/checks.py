"""Checks of files before they are read: a model folder, a GGUF file, a safetensors header.

Each raises an error that names the file, what is wrong and what to do, instead of the
deep library traceback a bad file would otherwise give.
"""

from __future__ import annotations

import os
from pathlib import Path

from mechlingo.core.errors import ModelLoadError
from mechlingo.core.untrusted import loads, read_json, refuse_special

_WEIGHT_GLOBS = ("*.safetensors", "*.bin", "*.pt", "*.pth", "*.safetensors.index.json")
_TOKENIZER_FILES = ("tokenizer.json", "tokenizer.model", "vocab.json", "tokenizer_config.json")


def check_model_folder(path: str | os.PathLike[str]) -> None:
    """Check that a local model folder has what transformers needs (config.json, weights,
    tokenizer files) before anything loads.

    Raises:
        ModelLoadError: naming what is missing.
    """

    folder = Path(path)
    refuse_special(folder / "config.json", ModelLoadError)
    if not (folder / "config.json").is_file():
        raise ModelLoadError(
            f"{folder} is a folder without config.json; a local model must be a transformers "
            "folder (config.json, weights, tokenizer files)"
        )
    read_json(folder / "config.json", ModelLoadError, numbers=False)
    if not any(any(folder.glob(g)) for g in _WEIGHT_GLOBS):
        raise ModelLoadError(
            f"{folder} has config.json but no weights (*.safetensors or *.bin)",
            fix="save the model with save_pretrained(), or pass the folder that has its weights",
        )
    if not any((folder / f).is_file() for f in _TOKENIZER_FILES):
        raise ModelLoadError(
            f"{folder} has no tokenizer files (tokenizer.json, tokenizer.model, ...)",
            fix="save the tokenizer into the same folder with tokenizer.save_pretrained()",
        )
    for f in folder.glob("*.safetensors"):
        refuse_special(f, ModelLoadError)
        check_safetensors_header(f, ModelLoadError)


def check_safetensors_header(path: Path, error: type[Exception]) -> None:
    """A safetensors file starts with an 8-byte header length and a JSON header whose data
    offsets must fit in the file; catches empty, zeroed and truncated files cheaply."""
    refuse_special(path, error)
    try:
        size = path.stat().st_size
        with path.open("rb") as f:
            head = f.read(8)
            n = int.from_bytes(head, "little") if len(head) == 8 else 0
            if len(head) < 8 or n <= 0 or n > min(size - 8, 100_000_000):
                raise error(f"{path} is not a valid safetensors file (empty, zeroed or truncated)")
            raw = f.read(n)
    except OSError:
        raise error(f"{path} is not a valid safetensors file (unreadable header)") from None
    header = loads(raw, error, f"the header of {path}", max_depth=4)
    if not isinstance(header, dict):
        raise error(f"{path} is not a valid safetensors file (its header is not an object)")
    try:
        end = max(
            (int(v["data_offsets"][1]) for k, v in header.items() if k != "__metadata__"),
            default=0,
        )
    except (KeyError, TypeError, ValueError, IndexError):
        raise error(f"{path} is not a valid safetensors file (malformed data_offsets)") from None
    if 8 + n + end > size:
        raise error(
            f"{path} is truncated: its header needs {8 + n + end} bytes, the file has {size}"
        )


def check_gguf_file(path: str | os.PathLike[str]) -> None:
    """Check a ``.gguf`` file's magic and header size before transformers reads it.

    Raises:
        ModelLoadError: empty, not a GGUF file, or a truncated header.
    """

    path = Path(path)
    refuse_special(path, ModelLoadError)
    if path.is_dir():
        raise ModelLoadError(f"{path} is a folder, not a .gguf file")
    size = path.stat().st_size
    if size == 0:
        raise ModelLoadError(f"{path} is empty (0 bytes)", fix="re-download or re-export the file")
    with path.open("rb") as f:
        head = f.read(24)
    if head[:4] != b"GGUF":
        raise ModelLoadError(f"{path} is not a GGUF file (no GGUF magic at its start)")
    if len(head) < 24:
        raise ModelLoadError(
            f"{path} has a truncated header ({size} bytes)", fix="re-download the file"
        )

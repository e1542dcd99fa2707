"""Finds and loads the moejit op library (libmoejit_torch.so), which registers torch.ops.moejit.*.

Where it looks, in order:
  1. <package>/lib/libmoejit_torch.so: an installed package (scripts/build.sh copies the built
     library to python/moejit/lib/ before `pip install ./python`).
  2. <repo>/build/backends/torch/libmoejit_torch.so, relative to this file: running from the source
     tree with PYTHONPATH=python after scripts/build.sh.
No environment variable is read here (every MOEJIT_* knob lives in common/knobs.cpp).
"""

from __future__ import annotations

import pathlib
import threading

import torch

LIBRARY_NAME = "libmoejit_torch.so"
OP_NAMES = ("moe_layer", "route", "experts", "compile", "hf_activations")

_lock = threading.Lock()
_loaded_from: "pathlib.Path | None" = None


def candidate_paths() -> list:
    package = pathlib.Path(__file__).resolve().parent
    return [
        package / "lib" / LIBRARY_NAME,
        package.parent.parent / "build" / "backends" / "torch" / LIBRARY_NAME,
    ]


def _registered() -> bool:
    # True when the moejit ops are already in the dispatcher (this or another copy of the library).
    try:
        return all(hasattr(torch.ops.moejit, op) for op in OP_NAMES)
    except (AttributeError, RuntimeError):
        return False


def find_library(paths=None) -> pathlib.Path:
    """The first existing path of `paths` (default: candidate_paths()); ImportError listing them all."""
    tried = list(paths) if paths is not None else candidate_paths()
    for path in tried:
        if pathlib.Path(path).is_file():
            return pathlib.Path(path)
    looked = "\n  ".join(str(p) for p in tried)
    raise ImportError(
        f"moejit: the op library {LIBRARY_NAME} was not found. Looked in:\n  {looked}\n"
        "Build it with scripts/build.sh (torch must be importable when it configures), which also copies "
        "it to python/moejit/lib/ for `pip install ./python`."
    )


def load_library() -> "pathlib.Path | None":
    """Loads the op library once; returns the path it came from (when the ops were registered before,
    the file torch.ops.load_library loaded, or None). Raises ImportError listing every place it looked."""
    global _loaded_from
    with _lock:
        if _loaded_from is not None:
            return _loaded_from
        if _registered():  # loaded by the caller (torch.ops.load_library): remember which file
            _loaded_from = next((pathlib.Path(p) for p in getattr(torch.ops, "loaded_libraries", ())
                                 if pathlib.Path(p).name == LIBRARY_NAME), None)
            return _loaded_from
        path = find_library()
        # A library that fails to load (missing symbols, another torch) is reported, not skipped:
        # falling back to another copy would hide a broken install.
        try:
            torch.ops.load_library(str(path))
        except OSError as e:
            raise ImportError(f"moejit: could not load the op library {path}: {e}") from e
        _loaded_from = path
        return path


def loaded_from() -> "pathlib.Path | None":
    return _loaded_from

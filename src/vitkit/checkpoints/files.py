"""Safe reading and atomic writing of weight files, recognised by their bytes, never their names.

Nothing here executes code from a file: safetensors and ``.npz`` (without
pickle) hold plain arrays, and PyTorch files go through
``torch.load(weights_only=True)``, which refuses any pickle that names a
function or class outside plain tensors and containers. Truncated or corrupt
files raise a ValueError naming the file and the problem.
"""
from __future__ import annotations

import json
import pickle
import struct
import zipfile
from pathlib import Path
from typing import Any, Dict, Tuple

import numpy as np
import torch
from safetensors import safe_open
from safetensors.torch import save_file
from torch import Tensor

from ..errors import CheckpointError, NotFoundError, UnsafeCheckpointError
from ..utils import PathLike, atomic_path

# kinds of file, from their first bytes
SAFETENSORS, NPZ, TORCH_ZIP, TORCH_LEGACY, JSON, UNKNOWN = (
    "safetensors", "npz", "torch-zip", "torch-legacy", "json", "unknown")


def sniff(path: PathLike) -> str:
    """What a file is, from its contents."""
    p = Path(path)
    with open(p, "rb") as f:
        head = f.read(16)
    if len(head) == 0:
        raise CheckpointError(f"{p} is empty (0 bytes): the download or copy did not complete")
    if head[:4] == b"PK\x03\x04" or head[:4] == b"PK\x05\x06":
        try:
            with zipfile.ZipFile(p) as z:
                names = z.namelist()
        except (zipfile.BadZipFile, OSError, EOFError) as err:
            raise CheckpointError(f"{p} is a truncated or corrupt zip archive ({err}): download it again") from None
        if names and all(n.endswith(".npy") for n in names):
            return NPZ
        if any(n.endswith("data.pkl") for n in names):
            return TORCH_ZIP
        return UNKNOWN
    if head[:1] == b"\x80" and head[1:2] and head[1] <= 5:
        return TORCH_LEGACY
    if len(head) >= 9:
        (n,) = struct.unpack("<Q", head[:8])
        if head[8:9] == b"{" and 0 < n < 100_000_000:
            return SAFETENSORS
    if head.lstrip()[:1] in (b"{", b"[") and _text(head):
        return JSON
    return UNKNOWN


def _text(head: bytes) -> bool:
    """Whether the first bytes read as UTF-8 text (a character may be cut at the end of the window): random
    or binary bytes that happen to start with ``{`` are not JSON."""
    try:
        head.decode("utf-8")
    except UnicodeDecodeError as err:
        return err.start >= len(head) - 3
    return True


def read_safetensors(path: PathLike) -> Tuple[Dict[str, Tensor], Dict[str, str]]:
    p = Path(path)
    try:
        out = {}
        with safe_open(str(p), framework="pt", device="cpu") as f:
            meta = f.metadata() or {}
            for k in f.keys():
                out[k] = f.get_tensor(k)
        return out, meta
    except Exception as err:  # safetensors raises its own error types for bad headers / short files
        raise CheckpointError(f"{p} could not be read as safetensors ({err}): the file is truncated or corrupt, "
                              f"download it again") from None


def read_npz(path: PathLike) -> Dict[str, np.ndarray]:
    p = Path(path)
    try:
        with np.load(p, allow_pickle=False) as z:
            return {k: z[k] for k in z.files}
    except ValueError as err:
        if "pickle" in str(err).lower():
            raise UnsafeCheckpointError(f"refused {p}: it holds pickled Python objects, which would run code when "
                             f"loaded; a weights .npz holds plain arrays only") from None
        raise CheckpointError(f"{p} could not be read as .npz ({err}): the file is truncated or corrupt") from None
    except (zipfile.BadZipFile, EOFError, OSError, KeyError) as err:
        raise CheckpointError(f"{p} could not be read as .npz ({err or type(err).__name__}): the file is truncated "
                              f"or corrupt, download it again") from None


def read_torch(path: PathLike, mmap: bool = False) -> Any:
    """``torch.load(weights_only=True)``: plain tensors and containers only; anything else is refused.
    ``mmap`` maps zip-format files instead of reading them into memory (large checkpoints)."""
    p = Path(path)
    try:
        return torch.load(p, map_location="cpu", weights_only=True, mmap=mmap)
    except pickle.UnpicklingError as err:
        detail = _unpickler_detail(str(err))
        if not _names_code(detail):  # a damaged pickle (bad opcode, short string), not a hostile one
            raise CheckpointError(f"could not be read as a PyTorch file: its pickle is corrupt ({detail})", path=p,
                                  hint="the file is damaged, download or copy it again") from None
        raise UnsafeCheckpointError(
            f"refused: loading it would execute code from the file ({detail}). vitkit loads only plain "
            f"tensors (torch.load weights_only=True)", path=p,
            hint="if you trust its author, re-save just the weights in a trusted session: "
                 "torch.save(torch.load(path, weights_only=False)['state_dict'], 'clean.pth') or convert it to "
                 "safetensors") from None
    except (EOFError, RuntimeError, zipfile.BadZipFile, OSError, ValueError, struct.error, KeyError) as err:
        msg = str(err).split("\n")[0] or type(err).__name__
        raise CheckpointError(f"could not be read as a PyTorch file ({msg})", path=p,
                              hint="the file is truncated or corrupt, download it again") from None


def _unpickler_detail(text: str) -> str:
    """The reason torch's weights-only unpickler gives, without its generic advice: the line naming a
    refused global or object if there is one, else the unpickler's error (a bad opcode, a short string)."""
    lines = [ln.strip() for ln in text.split("\n") if ln.strip()]
    pick = next((ln for ln in lines if _names_code(ln)), None)
    if pick is None:
        for i, ln in enumerate(lines):
            if "WeightsUnpickler error:" in ln:
                pick = ln.split("WeightsUnpickler error:", 1)[1].strip() or (lines[i + 1] if i + 1 < len(lines) else ln)
                break
    pick = pick or next((ln for ln in lines if "Unsupported" in ln), lines[0] if lines else "unpickling failed")
    return pick.replace("WeightsUnpickler error:", "").strip().split(". Please")[0]


def _names_code(detail: str) -> bool:
    """Whether the unpickler refused a named global, class or object (what runs code), rather than bytes
    that are not a valid pickle."""
    return any(word in detail for word in ("GLOBAL", "allowlisted", "Can only", "is blocked"))


def read_json(path: PathLike) -> Any:
    p = Path(path)
    try:
        return json.loads(p.read_text(encoding="utf-8"))
    except (json.JSONDecodeError, UnicodeDecodeError) as err:
        raise CheckpointError(f"{p} is not valid JSON ({err}): the file is truncated or corrupt") from None


def unwrap_state(obj: Any, source: str) -> Dict[str, Tensor]:
    """The state dict inside a loaded PyTorch object: a bare one, or under 'state_dict' / 'model' /
    'model_ema' / 'module' / 'params' of a training checkpoint; a shared 'module.' prefix (DDP) is removed."""
    seen = 0
    while isinstance(obj, dict) and not _is_state(obj) and seen < 4:
        for key in ("state_dict", "model", "model_ema", "state_dict_ema", "module", "params", "net"):
            if isinstance(obj.get(key), dict):
                obj = obj[key]
                break
        else:
            break
        seen += 1
    if not isinstance(obj, dict) or not _is_state(obj):
        what = type(obj).__name__
        keys = f" with keys {sorted(map(str, obj))[:10]}" if isinstance(obj, dict) else ""
        raise CheckpointError(f"{source} holds a {what}{keys}, not a state dict of tensors: save "
                              f"model.state_dict() instead of the whole model or trainer")
    state = {str(k): v for k, v in obj.items() if isinstance(v, Tensor)}
    for prefix in ("module.", "_orig_mod."):
        if state and all(k.startswith(prefix) for k in state):
            state = {k[len(prefix):]: v for k, v in state.items()}
    return state


def _is_state(d: dict) -> bool:
    values = list(d.values())
    return bool(values) and sum(isinstance(v, Tensor) for v in values) >= max(1, len(values) // 2)


def read_tensors(path: PathLike) -> Tuple[str, Dict[str, Any], Dict[str, str]]:
    """(kind, name -> array/tensor, metadata) of a single weights file, recognised from its bytes."""
    p = Path(path)
    if not p.exists():
        raise NotFoundError("does not exist", path=p)
    kind = sniff(p)
    if kind == SAFETENSORS:
        state, meta = read_safetensors(p)
        return kind, state, meta
    if kind == NPZ:
        return kind, read_npz(p), {}
    if kind in (TORCH_ZIP, TORCH_LEGACY):
        return kind, unwrap_state(read_torch(p, mmap=kind == TORCH_ZIP), str(p)), {}
    if kind == JSON:
        raise CheckpointError(f"{p} is a JSON file, not weights: pass the folder that holds it and the weights "
                              f"(a Hugging Face or vitkit checkpoint folder)")
    raise CheckpointError(f"{p} is not a weights file vitkit knows (safetensors, .npz, PyTorch .pth/.bin): "
                          f"its first bytes are {open(p, 'rb').read(8)!r}")


def write_safetensors(state: Dict[str, Tensor], path: PathLike, metadata: Dict[str, str] = None) -> Path:
    path = Path(path)
    with atomic_path(path) as tmp:
        save_file({k: v.detach().contiguous().cpu() for k, v in state.items()}, str(tmp), metadata=metadata)
    return path


def write_torch(state: Dict[str, Tensor], path: PathLike) -> Path:
    path = Path(path)
    with atomic_path(path) as tmp:
        torch.save({k: v.detach().contiguous().cpu() for k, v in state.items()}, tmp)
    return path


def write_npz(arrays: Dict[str, np.ndarray], path: PathLike) -> Path:
    path = Path(path)
    with atomic_path(path) as tmp:
        with open(tmp, "wb") as f:
            np.savez(f, **arrays)
    return path

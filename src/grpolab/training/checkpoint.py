"""Atomic save / resume of a training run.

Layout, under the run directory `out/`:

    out/checkpoints/
        step-000010/                 one complete checkpoint
            config.json, model.safetensors, generation_config.json   (model.save_pretrained)
              or, for a LoRA run (a peft model): adapter_config.json, adapter_model.safetensors,
              README.md (the adapter only; grpolab.model.load.load_policy puts it on its base model)
            tokenizer.json, ...      (tokenizer.save_pretrained, when a tokenizer is given)
            optimizer.pt             torch.save(optimizer.state_dict())
            scheduler.pt             torch.save(scheduler.state_dict()), when a scheduler is given
            rng.pt                   python `random`, numpy (if installed), torch CPU and CUDA states
            NAME.pt                  torch.save(component.state_dict()) for each component (critic.pt)
            trainer_state.json       {"step": 10, "format": 2, ...the trainer's dict}
            manifest.json            {file: {"size": bytes, "sha256": hex}} of every other file, written last
        step-000020/
        latest                       text file: "step-000020"

Atomicity: a checkpoint is written into a hidden temporary directory inside `checkpoints/`, every
file is fsynced, and the directory is renamed to `step-NNNNNN` with `os.replace` (atomic on POSIX, same
file system). Only then is `latest` rewritten, itself through a temporary file + `os.replace`. So a
crash at any point leaves `latest` naming a complete checkpoint (or absent), and a `step-*` directory
only ever appears complete. Leftover temporary directories from a crash are ignored by
`latest_checkpoint` and removed by the next `save_checkpoint`.

Integrity: the manifest lists the size and sha256 of every file. `verify_checkpoint` re-checks them,
and `latest_good_checkpoint` (what resume uses) walks back from the newest checkpoint to the first
one that verifies, naming each bad file it skips: a truncated or bit-flipped file never loads.

Continuations: each resume of a run adds one line to OUT/restarts.jsonl (grpolab.training.resume).
"""

from __future__ import annotations

import hashlib
import json
import os
import random
import re
import shutil
import tempfile
import time
from pathlib import Path

import torch

from grpolab.model.optim import load_state
from grpolab.training.retention import checkpoints_to_delete, remove_checkpoint
from grpolab.util.fields import ConfigError
from grpolab.util.fileio import atomic_write, fsync_dir

CHECKPOINTS = "checkpoints"
LATEST = "latest"
FORMAT_VERSION = 2
MANIFEST = "manifest.json"
_STEP_RE = re.compile(r"^step-(\d+)$")
_TMP_PREFIX = ".tmp-"


def checkpoint_name(step: int) -> str:
    return f"step-{step:06d}"


# -- helpers ---------------------------------------------------------------------------------------


def _fsync_tree(root: Path) -> None:
    for dirpath, _dirnames, filenames in os.walk(root):
        for name in filenames:
            with open(Path(dirpath) / name, "rb") as f:
                os.fsync(f.fileno())
        fsync_dir(Path(dirpath))


def _rng_state() -> dict:
    state = {"python": random.getstate(), "torch": torch.get_rng_state()}
    try:
        import numpy as np
    except ImportError:
        pass
    else:
        kind, keys, pos, has_gauss, cached = np.random.get_state()
        # Plain Python types so the file loads with torch.load(weights_only=True).
        state["numpy"] = (kind, keys.tolist(), int(pos), int(has_gauss), float(cached))
    if torch.cuda.is_available() and torch.cuda.is_initialized():
        state["cuda"] = torch.cuda.get_rng_state_all()
    return state


def _set_rng_state(state: dict) -> None:
    random.setstate(_as_tuple(state["python"]))
    torch.set_rng_state(state["torch"])
    if "numpy" in state:
        try:
            import numpy as np
        except ImportError:
            pass
        else:
            kind, keys, pos, has_gauss, cached = state["numpy"]
            np.random.set_state((kind, np.asarray(keys, dtype=np.uint32), pos, has_gauss, cached))
    if "cuda" in state and torch.cuda.is_available():
        if len(state["cuda"]) == torch.cuda.device_count():
            torch.cuda.set_rng_state_all(state["cuda"])


def _as_tuple(x):
    return tuple(_as_tuple(v) for v in x) if isinstance(x, (list, tuple)) else x


def _step_dirs(ckpt_root: Path) -> list[tuple[int, Path]]:
    """Complete checkpoint directories, oldest first."""
    if not ckpt_root.is_dir():
        return []
    out = []
    for p in ckpt_root.iterdir():
        m = _STEP_RE.match(p.name)
        if m and p.is_dir() and _is_complete(p):
            out.append((int(m.group(1)), p))
    return sorted(out)


def _is_complete(path: Path) -> bool:
    return (
        (path / "trainer_state.json").is_file()
        and (path / MANIFEST).is_file()
        and (
            (path / "model.safetensors").is_file()
            or (path / "model.safetensors.index.json").is_file()
            or (path / "adapter_model.safetensors").is_file()
        )
    )


def _sha256(path: Path) -> str:
    h = hashlib.sha256()
    with open(path, "rb") as f:
        while chunk := f.read(1 << 22):
            h.update(chunk)
    return h.hexdigest()


def _files(ckpt_dir: Path) -> list[str]:
    return sorted(str(p.relative_to(ckpt_dir)) for p in ckpt_dir.rglob("*") if p.is_file() and p.name != MANIFEST)


def _write_manifest(ckpt_dir: Path) -> None:
    manifest = {
        name: {"size": (ckpt_dir / name).stat().st_size, "sha256": _sha256(ckpt_dir / name)}
        for name in _files(ckpt_dir)
    }
    (ckpt_dir / MANIFEST).write_text(json.dumps(manifest, indent=1, sort_keys=True), encoding="utf-8")


def _present(ckpt_dir: Path) -> tuple[list[str], list[str]]:
    """(files, links): every regular file under `ckpt_dir` but the manifest, and every symbolic link
    (file or directory, not followed), as paths relative to it."""
    files, links = [], []
    for d, dirs, names in os.walk(ckpt_dir, followlinks=False):
        for n in dirs + names:
            p = Path(d) / n
            rel = str(p.relative_to(ckpt_dir))
            if p.is_symlink():
                links.append(rel)
            elif n in names and rel != MANIFEST:
                files.append(rel)
    return sorted(files), sorted(links)


def _inside(ckpt_dir: Path, name: object) -> bool:
    """True for a plain relative path naming something inside `ckpt_dir` (no `..`, not absolute)."""
    if not isinstance(name, str) or not name or name.startswith("/") or "\\" in name or "\x00" in name:
        return False
    return ".." not in Path(name).parts


def verify_checkpoint(ckpt_dir: Path) -> str | None:
    """None if every file of the checkpoint matches its manifest, else what is wrong (naming the file).

    The manifest vouches for what it lists, so nothing else may be there: a file it does not list
    (an added shard index pointing elsewhere, say), a symbolic link, or a listed name outside the
    directory fails verification."""
    ckpt_dir = Path(ckpt_dir)
    try:
        manifest = json.loads((ckpt_dir / MANIFEST).read_text(encoding="utf-8"))
    except (OSError, ValueError, RecursionError) as e:
        return f"{ckpt_dir / MANIFEST}: unreadable manifest ({e})"
    if not isinstance(manifest, dict):
        return f"{ckpt_dir / MANIFEST}: not a manifest (a JSON object of files)"
    files, links = _present(ckpt_dir)
    if links:
        return f"{ckpt_dir / links[0]}: a symbolic link (a checkpoint holds only its own files)"
    unlisted = [f for f in files if f not in manifest]
    if unlisted:
        return f"{ckpt_dir / unlisted[0]}: not in the manifest (added after the checkpoint was written)"
    for name, want in sorted(manifest.items()):
        if (
            not _inside(ckpt_dir, name)
            or not isinstance(want, dict)
            or not isinstance(want.get("size"), int)
            or not isinstance(want.get("sha256"), str)
        ):
            return f"{ckpt_dir / MANIFEST}: malformed entry {str(name)[:100]!r}"
        path = ckpt_dir / name
        if not path.is_file():
            return f"{path}: missing"
        size = path.stat().st_size
        if size != want["size"]:
            return f"{path}: {size} bytes, the manifest says {want['size']} (truncated?)"
        if _sha256(path) != want["sha256"]:
            return f"{path}: sha256 differs from the manifest (corrupted)"
    return None


def _remove_stale_tmp(ckpt_root: Path) -> None:
    for p in ckpt_root.iterdir():
        if p.name.startswith(_TMP_PREFIX):
            if p.is_dir():
                shutil.rmtree(p, ignore_errors=True)
            else:
                p.unlink(missing_ok=True)


# -- API -------------------------------------------------------------------------------------------


def save_checkpoint(
    out_dir: Path,
    step: int,
    model,
    tokenizer,
    optimizer,
    scheduler,
    trainer_state: dict,
    *,
    keep_last: int | None = 2,
    components: dict | None = None,
    model_only: bool = False,
) -> Path:
    """Write `out_dir/checkpoints/step-NNNNNN/` atomically, point `latest` at it, prune old ones.

    model:      a transformers `PreTrainedModel` or a PEFT model (its `save_pretrained` is used, so
                the directory loads with `from_pretrained`).
    tokenizer:  saved with `save_pretrained` when not None.
    optimizer, scheduler: their `state_dict()` is saved (each may be None).
    components: name -> object with state_dict() (a critic, ...), saved as NAME.pt in the same
                directory, so they are written, renamed and pruned atomically with the policy.
    trainer_state: a JSON-serialisable dict (metrics pointer, counters...); "step" and "format" are
                added. Raises TypeError before anything is renamed if it is not serialisable.
    keep_last:  keep this many newest checkpoints (the one just written always stays); None or 0
                keeps all.
    model_only: the model, tokenizer and trainer_state alone (the save_only_model setting, TRL's): no
                optimizer, scheduler, component or RNG state, and "model_only": true in trainer_state, so
                that load_checkpoint refuses to resume from it.
    Returns the final checkpoint directory.
    """
    if keep_last is not None and keep_last < 0:
        raise ValueError(f"keep_last must be >= 0 or None, got {keep_last}")
    root = Path(out_dir) / CHECKPOINTS
    root.mkdir(parents=True, exist_ok=True)
    _remove_stale_tmp(root)  # left by an earlier crash (one writer per run directory)
    state = {**trainer_state, "step": int(step), "format": FORMAT_VERSION, "saved_at": time.time()}
    if model_only:
        state["model_only"] = True
        optimizer = scheduler = components = None
    state_text = json.dumps(state, indent=2, sort_keys=True)  # fail early on unserialisable state

    final = root / checkpoint_name(step)
    tmp = Path(tempfile.mkdtemp(prefix=f"{_TMP_PREFIX}{final.name}-", dir=root))
    try:
        model.save_pretrained(str(tmp))
        if tokenizer is not None:
            tokenizer.save_pretrained(str(tmp))
        if optimizer is not None:
            torch.save(optimizer.state_dict(), tmp / "optimizer.pt")
        if scheduler is not None:
            torch.save(scheduler.state_dict(), tmp / "scheduler.pt")
        for name, component in (components or {}).items():
            torch.save(component.state_dict(), tmp / f"{name}.pt")
        if not model_only:
            torch.save(_rng_state(), tmp / "rng.pt")
        (tmp / "trainer_state.json").write_text(state_text, encoding="utf-8")
        _write_manifest(tmp)  # last: it vouches for everything above
        _fsync_tree(tmp)
        if final.exists():  # re-saving a step (e.g. after a resume): move the old one aside first
            old = root / f"{_TMP_PREFIX}old-{final.name}-{os.getpid()}"
            os.replace(final, old)
            os.replace(tmp, final)
            shutil.rmtree(old, ignore_errors=True)
        else:
            os.replace(tmp, final)
        fsync_dir(root)
    except BaseException:
        shutil.rmtree(tmp, ignore_errors=True)
        raise
    atomic_write(root / LATEST, final.name + "\n")

    for p in checkpoints_to_delete([p for _, p in _step_dirs(root)], keep_last, keep=final):
        remove_checkpoint(p)  # keep_last newest remain, each with its views (grpolab.training.retention)
    return final


def save_model_copy(out_dir: Path, name: str, model, tokenizer, extra_files: dict[str, str]) -> Path:
    """Write `out_dir/checkpoints/NAME/` (e.g. `best`): the model (model.save_pretrained), the tokenizer and
    `extra_files` (file name -> text), with a manifest, replacing an earlier NAME atomically (a hidden
    temporary directory renamed over it). No optimizer state: a copy to load, not to resume. Its name is
    not step-NNNNNN, so `keep_last` never prunes it and resume never picks it."""
    root = Path(out_dir) / CHECKPOINTS
    root.mkdir(parents=True, exist_ok=True)
    final = root / name
    tmp = Path(tempfile.mkdtemp(prefix=f"{_TMP_PREFIX}{name}-", dir=root))
    try:
        model.save_pretrained(str(tmp))
        if tokenizer is not None:
            tokenizer.save_pretrained(str(tmp))
        for file, text in extra_files.items():
            (tmp / file).write_text(text, encoding="utf-8")
        _write_manifest(tmp)
        _fsync_tree(tmp)
        old = root / f"{_TMP_PREFIX}old-{name}-{os.getpid()}"
        if final.exists():
            os.replace(final, old)
        os.replace(tmp, final)
        shutil.rmtree(old, ignore_errors=True)
        fsync_dir(root)
    except BaseException:
        shutil.rmtree(tmp, ignore_errors=True)
        raise
    return final


def latest_checkpoint(out_dir: Path) -> Path | None:
    """The newest complete checkpoint of run directory `out_dir`, or None if it has none.

    Reads `checkpoints/latest`; if that file is missing or names something incomplete, falls back to
    the complete `step-*` directory with the highest step.
    """
    root = Path(out_dir) / CHECKPOINTS
    try:
        name = (root / LATEST).read_text(encoding="utf-8").strip()
    except (FileNotFoundError, NotADirectoryError):
        name = ""
    if name and _STEP_RE.match(name) and (root / name).is_dir() and _is_complete(root / name):
        return root / name
    dirs = _step_dirs(root)
    return dirs[-1][1] if dirs else None


def is_write_failure(e: BaseException) -> bool:
    """True when `e` says the file system refused a write (full disk, file size limit, I/O error):
    OSError itself, safetensors' SafetensorError wrapping an I/O error, torch.save's failed stream."""
    if isinstance(e, OSError):
        return True
    text = str(e)
    return (
        type(e).__name__ == "SafetensorError"
        and "I/O error" in text
        or (
            isinstance(e, RuntimeError)
            and ("failed writing" in text or "No space left" in text or "File too large" in text)
        )
    )


def latest_good_checkpoint(out_dir: Path, log=print) -> Path | None:
    """The newest checkpoint whose files all match its manifest, or None. Each newer checkpoint that
    fails verification is skipped with a message naming the bad file."""
    root = Path(out_dir) / CHECKPOINTS
    candidates = [p for _, p in reversed(_step_dirs(root))]
    newest = latest_checkpoint(out_dir)
    if newest is not None and newest in candidates:  # `latest` first, then by step
        candidates.remove(newest)
        candidates.insert(0, newest)
    for i, ckpt in enumerate(candidates):
        problem = verify_checkpoint(ckpt)
        if problem is None:
            return ckpt
        after = f"falling back to {candidates[i + 1].name}" if i + 1 < len(candidates) else "no older checkpoint left"
        log(f"checkpoint {ckpt.name} is damaged: {problem}; {after}")
    return None


def _load_model_weights(ckpt_dir: Path, model) -> None:
    from safetensors.torch import load_file

    if (ckpt_dir / "adapter_model.safetensors").is_file():  # a PEFT model saved only its adapter
        from peft import set_peft_model_state_dict

        if not hasattr(model, "peft_config"):
            raise RuntimeError(f"{ckpt_dir}: holds a LoRA adapter, and the model to restore has none (lora.r=0)")
        result = set_peft_model_state_dict(model, load_file(str(ckpt_dir / "adapter_model.safetensors")))
        unexpected = list(getattr(result, "unexpected_keys", []) or [])
        missing = [k for k in getattr(result, "missing_keys", []) or [] if "lora_" in k]  # the rest is the base
        if unexpected or missing:
            raise RuntimeError(
                f"{ckpt_dir}: adapter weights do not match the model: unexpected {unexpected[:5]}, "
                f"missing {missing[:5]}"
            )
        return

    index = ckpt_dir / "model.safetensors.index.json"
    if index.is_file():
        shards = sorted(set(json.loads(index.read_text())["weight_map"].values()))
        outside = [
            x for x in shards if not _inside(ckpt_dir, x) or not (ckpt_dir / x).is_file() or (ckpt_dir / x).is_symlink()
        ]
        if outside:
            raise RuntimeError(
                f"{ckpt_dir}: the shard index names {str(outside[0])[:200]!r}, not a file of the "
                f"checkpoint; only the checkpoint's own files are loaded"
            )
        state: dict[str, torch.Tensor] = {}
        for shard in shards:
            state.update(load_file(str(ckpt_dir / shard)))
    else:
        path = ckpt_dir / "model.safetensors"
        if not path.is_file():
            raise FileNotFoundError(f"{ckpt_dir}: no model.safetensors (not a grpolab checkpoint?)")
        state = load_file(str(path))

    result = model.load_state_dict(state, strict=False)
    if result.unexpected_keys:
        raise RuntimeError(
            f"{ckpt_dir}: the checkpoint has weights the model lacks: {sorted(result.unexpected_keys)[:5]}"
        )
    if result.missing_keys:
        # save_pretrained drops tied weights (lm_head.weight == embed_tokens.weight): a missing key is
        # fine only when its tensor is shared with one that was loaded.
        params = model.state_dict(keep_vars=True)
        loaded_ptrs = {params[k].data_ptr() for k in state if k in params}
        untied = [k for k in result.missing_keys if params[k].data_ptr() not in loaded_ptrs]
        if untied:
            raise RuntimeError(f"{ckpt_dir}: the checkpoint lacks weights of the model: {sorted(untied)[:5]}")


def load_checkpoint(ckpt_dir: Path, model, optimizer, scheduler, *, components: dict | None = None) -> dict:
    """Restore a checkpoint written by `save_checkpoint` into existing objects; returns trainer_state.

    Loads the weights (safetensors) into `model` in place (dtype and device of `model` are kept),
    the optimizer and scheduler states (each may be None to skip), and the python / numpy / torch
    (CPU, CUDA) RNG states, and each component's NAME.pt. Raises FileNotFoundError for a directory
    that is not a complete checkpoint (or lacks a component's file), RuntimeError when the weights
    do not match the model, and ConfigError (exit 2) for a model-only checkpoint (save_only_model).
    """
    ckpt_dir = Path(ckpt_dir)
    if not _is_complete(ckpt_dir):
        raise FileNotFoundError(f"{ckpt_dir}: not a complete checkpoint (no trainer_state.json / weights)")
    state = json.loads((ckpt_dir / "trainer_state.json").read_text(encoding="utf-8"))
    if state.get("model_only"):
        raise ConfigError(
            f"{ckpt_dir}: written with save_only_model=true (TRL's save_only_model), it holds the model alone, "
            f"without the optimizer, scheduler and RNG states a run continues from, so no run resumes from it. "
            f"Load it with from_pretrained, or start a new run from its weights: grpolab train model={ckpt_dir} ..."
        )
    _load_model_weights(ckpt_dir, model)
    if optimizer is not None:
        load_state(optimizer, torch.load(ckpt_dir / "optimizer.pt", map_location="cpu", weights_only=True))
    if scheduler is not None:
        scheduler.load_state_dict(torch.load(ckpt_dir / "scheduler.pt", map_location="cpu", weights_only=True))
    for name, component in (components or {}).items():
        path = ckpt_dir / f"{name}.pt"
        if not path.is_file():
            raise FileNotFoundError(
                f"{ckpt_dir}: no {name}.pt, so the {name} cannot be restored (a checkpoint "
                f"written before {name}s were saved inside it?); start the run again"
            )
        component.load_state_dict(torch.load(path, map_location="cpu", weights_only=True))
    rng = ckpt_dir / "rng.pt"
    if rng.is_file():
        _set_rng_state(torch.load(rng, map_location="cpu", weights_only=True))
    return state

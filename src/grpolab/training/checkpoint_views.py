"""OUT/checkpoint-N: a checkpoint as transformers finds it, beside the grpolab checkpoint it shows.

A TRL script finds its newest checkpoint with `transformers.trainer_utils.get_last_checkpoint(OUT)` (the
directory `checkpoint-N` with the largest N, N the optimizer step: TRL's `state.global_step`), loads it with
`AutoModelForCausalLM.from_pretrained(OUT/checkpoint-N)` and continues with
`trainer.train(resume_from_checkpoint=OUT/checkpoint-N)`. A GRPOTrainer run (grpolab.app.trl_compat) writes,
after each grpolab checkpoint OUT/checkpoints/step-NNNNNN/ (grpolab.training.checkpoint, N in generations):

    OUT/checkpoint-N/                      N = generations x updates per generation
        config.json, model.safetensors, generation_config.json, tokenizer files (or a LoRA run's adapter files)
                                           hard links to the step directory's files: no disk of their own
        trainer_state.json                 transformers.TrainerState.save_to_json: global_step, max_steps,
                                           log_history so far, ... (what a resumed trainer's state continues)
        grpolab_checkpoint.json            {"checkpoint": "step-NNNNNN"}: the grpolab checkpoint it shows

Hard links, never symbolic links: resume refuses links in a run directory (docs/security.md). Where the file
system has no hard links, the files are copied.

Never naming an incomplete checkpoint: a view is written only for a complete step directory (its manifest and
every listed model file present at the listed size), into a hidden temporary directory in OUT that is renamed to
checkpoint-N with os.replace once complete; retention (grpolab.training.retention.remove_checkpoint) removes the
views of a step directory before the directory itself. A crash at any point leaves every checkpoint-N whole.
"""

from __future__ import annotations

import json
import os
import re
import shutil
import tempfile
from pathlib import Path

PREFIX = "checkpoint-"
MARKER = "grpolab_checkpoint.json"
STATE = "trainer_state.json"
_VIEW_RE = re.compile(r"^checkpoint-(\d+)$")
_TMP = ".tmp-checkpoint-"
_OWN = ("trainer_state.json", "manifest.json")
"""Files of a step directory that are grpolab's own (its state, its manifest), never linked into a view."""


def view_name(global_step: int) -> str:
    """transformers' name of the checkpoint at optimizer step `global_step` (PREFIX_CHECKPOINT_DIR-N)."""
    return f"{PREFIX}{int(global_step)}"


def model_files(step_dir: Path) -> dict[str, int] | None:
    """The files of step directory `step_dir` a view links (the model, the tokenizer; not the optimizer,
    scheduler, RNG or component states, *.pt, nor grpolab's trainer_state.json and manifest), name -> size as
    the manifest lists it; None when the checkpoint is not complete (no readable manifest, a listed file
    missing, a symbolic link, a size that differs, no weights)."""
    try:
        manifest = json.loads((step_dir / "manifest.json").read_text(encoding="utf-8"))
    except (OSError, ValueError, RecursionError):
        return None
    if not isinstance(manifest, dict):
        return None
    files: dict[str, int] = {}
    for name, entry in manifest.items():
        path = step_dir / str(name)
        if not isinstance(entry, dict) or path.is_symlink() or not path.is_file():
            return None
        if path.stat().st_size != entry.get("size"):
            return None
        if not (name in _OWN or name.endswith(".pt") or "/" in name or "\\" in name):
            files[name] = entry["size"]
    weights = ("model.safetensors", "model.safetensors.index.json", "adapter_model.safetensors")
    return files if any(w in files for w in weights) else None


def _link_or_copy(src: Path, dst: Path) -> None:
    try:
        os.link(src, dst)
    except OSError:  # a file system without hard links: a copy
        shutil.copy2(src, dst)


def write_view(out: Path, step_dir: Path, global_step: int, state, stateful=()) -> Path | None:
    """OUT/checkpoint-{global_step} for the complete grpolab checkpoint `step_dir` (see the module docstring),
    with `state` (a transformers TrainerState) as its trainer_state.json, after `stateful` (transformers
    ExportableState objects: the TrainerControl, stateful callbacks) are recorded in state.stateful_callbacks
    as a Trainer's _save_checkpoint records them. Replaces an earlier view of the same N atomically. Returns the
    view, or None (nothing written) when `step_dir` is not a complete checkpoint."""
    files = model_files(step_dir)
    if files is None:
        return None
    remove_stale(out)  # one writer per run directory: what a crash left is no one's
    for obj in stateful:
        state.stateful_callbacks[type(obj).__name__] = obj.state()
    final = Path(out) / view_name(global_step)
    tmp = Path(tempfile.mkdtemp(prefix=_TMP, dir=out))
    try:
        for name in sorted(files):
            _link_or_copy(step_dir / name, tmp / name)
        state.save_to_json(str(tmp / STATE))
        (tmp / MARKER).write_text(json.dumps({"checkpoint": step_dir.name}) + "\n", encoding="utf-8")
        for name in (STATE, MARKER):
            with open(tmp / name, "rb") as f:
                os.fsync(f.fileno())
        _replace(tmp, final)
    except BaseException:
        shutil.rmtree(tmp, ignore_errors=True)
        raise
    return final


def _replace(new: Path, final: Path) -> None:
    """`new` renamed to `final`; an earlier `final` (a directory, or a link, which is not followed) moved aside
    first and removed after."""
    old = None
    if final.is_symlink() or final.exists():
        old = final.with_name(f"{_TMP}old-{final.name}-{os.getpid()}")
        os.replace(final, old)
    os.replace(new, final)
    if old is not None:
        _remove(old)


def _remove(path: Path) -> None:
    if path.is_symlink() or not path.is_dir():
        path.unlink(missing_ok=True)
    else:
        shutil.rmtree(path, ignore_errors=True)


def views(out: Path) -> list[tuple[int, Path]]:
    """The views checkpoint-N in run directory `out` (real directories, not links), by N."""
    if not Path(out).is_dir():
        return []
    found = []
    for p in Path(out).iterdir():
        m = _VIEW_RE.match(p.name)
        if m and p.is_dir() and not p.is_symlink():
            found.append((int(m.group(1)), p))
    return sorted(found)


def shown(view: Path) -> str | None:
    """The name of the grpolab checkpoint (step-NNNNNN) view `view` shows, None when it names none."""
    try:
        name = json.loads((view / MARKER).read_text(encoding="utf-8")).get("checkpoint")
    except (OSError, ValueError, AttributeError):
        return None
    return name if isinstance(name, str) else None


def views_of(step_dir: Path) -> list[Path]:
    """The views of grpolab checkpoint `step_dir` (OUT/checkpoints/step-NNNNNN) in its run directory."""
    return [p for _, p in views(step_dir.parent.parent) if shown(p) == step_dir.name]


def remove_views_of(step_dir: Path) -> None:
    """Remove each view of `step_dir`: renamed aside (so no checkpoint-N is seen half removed), then deleted."""
    for view in views_of(step_dir):
        aside = view.with_name(f"{_TMP}gone-{view.name}-{os.getpid()}")
        os.replace(view, aside)
        _remove(aside)


def remove_stale(out: Path) -> None:
    """Temporary directories a crash left in `out` while writing or removing a view."""
    if Path(out).is_dir():
        for p in Path(out).iterdir():
            if p.name.startswith(_TMP):
                _remove(p)


def saved_state(step_dir: Path):
    """The TrainerState saved with the newest view of grpolab checkpoint `step_dir`, or None where it has no
    view (a run that wrote none, a crash between the checkpoint and its view)."""
    from transformers import TrainerState

    found = views_of(step_dir)
    path = found[-1] / STATE if found else None
    if path is None or path.is_symlink() or not path.is_file():
        return None
    return TrainerState.load_from_json(str(path))


__all__ = ["remove_stale", "remove_views_of", "saved_state", "view_name", "views", "views_of", "write_view"]

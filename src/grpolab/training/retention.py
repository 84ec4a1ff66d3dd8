"""Which checkpoints a run keeps on disk (keep_checkpoints, TRL's save_total_limit).

A checkpoint of the 135M model with its AdamW state is about 1.6 GB, so by default a run keeps the last
(the one `--resume` continues) and, with save_best, the best model besides (a copy under another name,
grpolab.training.checkpoint.save_model_copy); keep_checkpoints=0 keeps every one. The rule reads the
list of complete step checkpoints that grpolab.training.checkpoint enumerates, so it holds whatever those
directories are called. A checkpoint goes with its views (OUT/checkpoint-N, grpolab.training.checkpoint_views):
remove_checkpoint deletes those first, so that no checkpoint-N outlives the checkpoint it shows.
"""

from __future__ import annotations

import shutil
from collections.abc import Collection, Sequence
from pathlib import Path

from grpolab.training.checkpoint_views import remove_views_of


def checkpoints_to_delete(
    listed: Sequence[Path], keep_last: int | None, *, keep: Path, protect: Collection[Path] = ()
) -> list[Path]:
    """Of the complete step checkpoints `listed` (oldest first), those to delete so that the `keep_last`
    newest remain, `keep` (the one just written, which `latest` names) always among them; None or 0
    deletes none (TRL's save_total_limit None or <= 0, as transformers' rotate_checkpoints). Nothing in
    `protect` is deleted, and a copy under another name (`best`) is never listed.

        deleted = (listed - {keep}) without its newest keep_last - 1, minus protect
    """
    if not keep_last:
        return []
    others = [p for p in listed if p != keep]
    return [p for p in others[: max(0, len(others) - (keep_last - 1))] if p not in set(protect)]


def remove_checkpoint(step_dir: Path) -> None:
    """Delete step checkpoint `step_dir` (OUT/checkpoints/step-NNNNNN): its views OUT/checkpoint-N first, then
    the directory, so that a crash in between leaves a checkpoint without a view, never a view without it."""
    remove_views_of(step_dir)
    shutil.rmtree(step_dir, ignore_errors=True)

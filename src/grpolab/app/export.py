"""`grpolab export RUN --merged OUT`: a run's newest checkpoint as a plain Hugging Face model directory.

    grpolab export runs/lora --merged models/lora-merged
    python -c "from transformers import AutoModelForCausalLM; AutoModelForCausalLM.from_pretrained('models/lora-merged')"

OUT gets config.json, generation_config.json, model.safetensors and the tokenizer, nothing else (no
optimizer, RNG or trainer state). For a LoRA run the adapter is merged into the base weights
(peft's merge_and_unload: W + (alpha / r) B A), so OUT needs neither peft nor the base model; for a
full fine-tuning run it is the checkpoint's model as it is. RUN may also be one checkpoint directory
(RUN/checkpoints/step-N). OUT must not exist or be an empty directory: it is written into a temporary
directory beside it and renamed, so it appears complete or not at all.
"""

from __future__ import annotations

import argparse
import os
import shutil
import sys
import tempfile
from pathlib import Path

from grpolab.util.fields import ConfigError


def checkpoint_of(target: Path, log=print) -> Path:
    """The checkpoint to export: a run's newest one that verifies, or a checkpoint directory itself."""
    from grpolab.training.checkpoint import latest_good_checkpoint, verify_checkpoint

    if (target / "config.yaml").is_file():
        ck = latest_good_checkpoint(target, log=log)
        if ck is None:
            raise ConfigError(f"{target}: the run has no intact checkpoint to export yet")
        return ck
    if (target / "trainer_state.json").is_file():
        problem = verify_checkpoint(target)
        if problem:
            raise ConfigError(f"{target}: damaged checkpoint, not exported: {problem}")
        return target
    raise ConfigError(f"{target}: not a run directory (no config.yaml) nor a checkpoint (no trainer_state.json)")


def check_out(out: Path) -> None:
    """OUT must be new or an empty directory: an export never overwrites anything."""
    if out.exists() and (not out.is_dir() or any(out.iterdir())):
        what = "is not empty" if out.is_dir() else "exists and is not a directory"
        raise ConfigError(f"--merged: {out} {what}; nothing was written. Choose a new directory (or remove it)")


def export_merged(target: Path, out: Path, log=print) -> Path:
    """Write the merged model of `target` (a run or a checkpoint) to `out`; returns `out`."""
    import torch
    from transformers import AutoTokenizer

    from grpolab.model.load import load_policy
    from grpolab.model.lora import is_peft

    target, out = Path(target), Path(out)
    check_out(out)
    ck = checkpoint_of(target, log=log)
    model = load_policy(ck, torch.device("cpu"))
    merged = is_peft(model)
    if merged:
        model = model.merge_and_unload()  # W <- W + (alpha / r) B A, the peft layers replaced by plain ones
    tokenizer = AutoTokenizer.from_pretrained(str(ck))
    out.parent.mkdir(parents=True, exist_ok=True)
    tmp = Path(tempfile.mkdtemp(prefix=f".tmp-export-{out.name}-", dir=out.parent))
    try:
        model.save_pretrained(str(tmp), safe_serialization=True)
        tokenizer.save_pretrained(str(tmp))
        os.replace(tmp, out)  # onto a missing or empty directory: atomic
    except BaseException:
        shutil.rmtree(tmp, ignore_errors=True)
        raise
    log(
        f"wrote {out} from {ck} ({'LoRA adapter merged into the base weights' if merged else 'full model'}); "
        f"it loads with AutoModelForCausalLM.from_pretrained({str(out)!r})"
    )
    return out


def export_main(argv: list[str]) -> int:
    ap = argparse.ArgumentParser(
        prog="grpolab export",
        description="Write a run's newest checkpoint as a plain "
        "Hugging Face model directory (a LoRA adapter merged into the base weights).",
    )
    ap.add_argument(
        "run", metavar="RUN", help="a run directory (its newest intact checkpoint) or a checkpoint directory"
    )
    ap.add_argument(
        "--merged", metavar="OUT", required=True, help="the new model directory (must not exist, or be empty)"
    )
    ns = ap.parse_args(argv)
    from transformers.utils import logging as hf_logging

    hf_logging.disable_progress_bar()
    export_merged(Path(ns.run), Path(ns.merged), log=lambda msg: print(f"grpolab: {msg}", file=sys.stderr))
    return 0


__all__ = ["check_out", "checkpoint_of", "export_main", "export_merged"]

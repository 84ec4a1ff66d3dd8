"""TRL compatibility: `from grpolab import GRPOConfig, GRPOTrainer` runs a TRL 1.16 GRPO script with
that import changed, with TRL's field names, TRL's defaults and TRL's data semantics; TRL itself is
not needed (a real `trl.GRPOConfig` is accepted too).

    fields.py   the one mapping table: every field of TRL's GRPOConfig, with its TRL default, and what
                it becomes in grpolab's Config (a path and a conversion), or why it is refused or ignored
    config.py   GRPOConfig (built from the table), and any config object -> a grpolab recipe dict
    data.py     train_dataset / eval_dataset rows as TRL reads them (map-style datasets by len)
    trainer.py  GRPOTrainer: .train() runs grpolab.train, .save_model(dir) writes a Hugging Face model
    docs.py     docs/migrating-from-trl.md, generated from the table
"""

from __future__ import annotations

from grpolab.app.trl_compat.config import GRPOConfig, trl_overrides, trl_recipe
from grpolab.app.trl_compat.trainer import GRPOTrainer

__all__ = ["GRPOConfig", "GRPOTrainer", "trl_overrides", "trl_recipe"]

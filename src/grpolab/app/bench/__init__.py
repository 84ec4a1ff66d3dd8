"""grpolab bench: the same GRPO configuration through grpolab and through TRL's GRPOTrainer, in
separate processes, alternating, after a warm-up step; or grpolab alone against the FLOP floor.

    spec.py      the command line, the presets a/b/c/agent, the shared reward, prompts and environment
    worker.py    one measurement per process (python -m grpolab.app.bench.worker), the log-prob check
    ours.py      grpolab's side: trainer.setup + step.train_step, timed per phase
    trl_side.py  TRL's side: GRPOTrainer with the same work, timed per optimizer step
    floor.py     FLOPs per phase and the device's matmul rate
    main.py      alternation, medians, the table and the JSON line

docs/performance.md ("grpolab bench") has the commands and what the columns mean.
"""

from grpolab.app.bench.main import main

__all__ = ["main"]

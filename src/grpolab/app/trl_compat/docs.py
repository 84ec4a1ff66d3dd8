"""docs/migrating-from-trl.md, generated from the mapping table (tests/test_trl_compat.py keeps it current):

python -m grpolab.app.trl_compat.docs > docs/migrating-from-trl.md
"""

from __future__ import annotations

from grpolab.app.trl_compat.fields import TABLE

HEADER = """# Migrating from TRL

A TRL 1.16 GRPO script runs on grpolab with one import changed:

```python
from grpolab import GRPOConfig, GRPOTrainer      # was: from trl import GRPOConfig, GRPOTrainer

model = AutoModelForCausalLM.from_pretrained(path)   # or model="smollm2-135m", a directory, a PeftModel
trainer = GRPOTrainer(model=model, processing_class=tokenizer, reward_funcs=reward_len,
                      args=GRPOConfig(output_dir="runs/x"), train_dataset=dataset)
trainer.train()                                  # trains `model` itself, in place
trainer.state.log_history                        # TRL's rows: per optimizer step, TRL's metric names
trainer.evaluate()                               # {"eval_reward": ..., ...}
trainer.save_model("runs/x/final")               # trainer.model's save_pretrained (a peft model: its adapter)
get_last_checkpoint("runs/x")                    # runs/x/checkpoint-N (N in optimizer steps), from_pretrained loads it
trainer.train(resume_from_checkpoint=True)       # or that path: a new trainer trains on to its max_steps
```

The trainer is the object TRL scripts hold, with grpolab's run inside (the same run `grpolab train` drives):
the model object passed (or loaded from a name or directory, as TRL loads it) is the one trained, so
`trainer.model.generate(...)` and `pipeline(model=trainer.model)` use the trained weights; `trainer.state` is
a transformers `TrainerState` counting optimizer steps (`global_step`, `max_steps`, `epoch`, `log_history`
in TRL's names and order, `best_metric` and `best_model_checkpoint` with `metric_for_best_model`); `train()`
returns transformers' `TrainOutput` as TRL's; `evaluate(eval_dataset=None, metric_key_prefix="eval")`,
`log_metrics`, `save_metrics`, `save_state`, `save_model`, `is_world_process_zero`, `accelerator` (one
process's answers), `end()`, `create_model_card`, `train_dataset` / `eval_dataset`, `callback_handler`,
`add_callback` / `pop_callback` / `remove_callback` do what TRL's do on one process; `ref_model` is TRL's
(None when `beta` is 0.0 or with PEFT, else a separate frozen model holding the initial weights: the one the
KL term reads). Checkpoints are where transformers looks for them: beside each grpolab checkpoint
(`OUT/checkpoints/step-NNNNNN`, N in generations) `OUT/checkpoint-N` (N in optimizer steps, TRL's
`global_step`) holds hard links to its model and tokenizer files and transformers' `trainer_state.json`, so
`get_last_checkpoint(OUT)` finds it, `from_pretrained` loads it, and `train(resume_from_checkpoint=...)`
continues `state.log_history` from it as TRL does; `save_total_limit` removes both together. Callbacks get TRL's
metric names in `logs` (`reward`, `reward_std`, `rewards/<fn>/mean`, `completions/mean_length`, `kl`,
`entropy`, `clip_ratio/...`, `eval_reward`, ...); `metrics.jsonl` keeps grpolab's, and one table maps the two
(docs/metrics.md, "TRL's names").

`GRPOConfig` has TRL's field names, order and defaults (learning_rate 1e-06 with linear decay, beta 0.0,
loss_type "dapo", max_completion_length 512, Adam beta2 0.999, seed 42, num_generations 8, ...); a real
`trl.GRPOConfig` is accepted too (`GRPOTrainer(args=trl_config)` or `grpolab.train(args=trl_config)`).
grpolab's own recipes keep their own defaults. The table below is the one mapping: each field becomes
grpolab settings (`config.yaml` of the run shows them), is refused by name with the reason when set to
anything but TRL's default, or is accepted and ignored where it cannot change what is trained.

On the command line the same names work beside grpolab's (`grpolab train max_steps=10 learning_rate=1e-6`),
and `grpolab train --trl ...` starts from TRL's defaults instead of grpolab's. A TRL name brings TRL's
meaning: the fields it reads besides itself take TRL's defaults (loss_type=grpo sets the clip range from
epsilon=0.2), and its value is read as TRL's parser reads it (`save_strategy=no` is the string "no").
`grpolab train --trl` also takes `trl grpo`'s script arguments, with local paths only:
`model_name_or_path=DIR dataset_name=DIR dataset_config=NAME dataset_train_split=train
dataset_test_split=test reward_funcs=[pkg.module.fn] reward_model_name_or_path=DIR model_revision=...
dtype=... use_peft=true lora_r=...`; a dataset folder laid out as on the hub (configs in its README), a
`save_to_disk` folder or a .jsonl / .parquet / .csv file.

Launchers: every field has TRL's type, so transformers' `HfArgumentParser` and TRL's
`TrlParser((ScriptArguments, GRPOConfig, ModelConfig))` read grpolab's `GRPOConfig` as they read TRL's (the
same options, conversions and choices; `--help` says what each becomes in grpolab), `--config recipe.yaml`
included. TRL's own `trl/scripts/grpo.py` runs with its two imports changed (tests/test_trl_scripts.py).
`model_init_kwargs` is read as the script fills it (`dtype` float32 or auto: fp32 weights; bfloat16:
precision=bf16, weights kept fp32; `revision` and `attn_implementation` accepted with a note;
`trust_remote_code=True` refused); `lr_scheduler_kwargs` gives transformers' schedules their options
(cosine_with_min_lr's min_lr or min_lr_rate, ...; the same learning rate at every update as
`transformers.get_scheduler`). A reward function failing on every completion of a step stops a run
configured through GRPOConfig after that step (TRL raises at its first failure).

Data, as TRL reads it: every row of `train_dataset` is trained on, in seeded, shuffled epochs
(`num_train_epochs`; `max_steps=-1` lets the epochs decide the number of steps); evaluation reads
`eval_dataset` only (`num_generations_eval` completions per prompt, by default `num_generations`,
sampled at the training temperature; before and after training, and every `eval_steps` with
`eval_strategy="steps"`); the prompt is the `prompt` column: a string is the model's input as it is (TRL's standard
format, no chat template), a list of messages gets the chat template (conversational format); no answer
column is needed, and every other column reaches the reward functions as keyword arguments. A
map-style dataset (`__len__` and `__getitem__`, e.g. a torch `Dataset`) is read by index. A stream (a
streaming `IterableDataset`, no length) needs `max_steps`, as in TRL, and is read in its own order only
as far as the run goes (max_steps x prompts per step rows, the stream restarted where it ends): the rows
read are kept in `OUT/dataset.jsonl`, so the run resumes. `grpolab.train(train_dataset=...)` reads rows the
same way (`dataset=` is grpolab's own reading: an answer column, string prompts templated).

How close this is, measured with TRL's own GRPOTrainer tests run with the import changed
(`benchmarks/trl_suite.py`): [results.md](results.md).

Steps: TRL counts optimizer steps, grpolab counts generations (one rollout batch, then its updates).
With TRL's defaults they are the same; with `num_iterations` or `steps_per_generation` above
`gradient_accumulation_steps`, one generation makes `num_iterations x steps_per_generation /
gradient_accumulation_steps` optimizer steps, and `max_steps`, `warmup_steps`, `eval_steps` and
`save_steps` are divided by that (a value that is not a multiple is refused by name). The learning-rate
schedule runs over the optimizer steps, as TRL's. `callbacks` (transformers `TrainerCallback`s or
`grpolab.Callback`s) are passed to the run.

Reward models, as TRL takes them: a `reward_funcs` entry may be a local model directory (TRL loads it with
`AutoModelForSequenceClassification.from_pretrained(DIR, num_labels=1)`) or a loaded sequence-classification
model, with its tokenizer in `reward_processing_classes`; grpolab scores it as TRL does, weighs it by
`reward_weights` and logs `reward/<name>/mean` and `reward/<name>/std` (docs/rewards.md, "A learned reward
model"). A hub id is refused: grpolab never downloads.

Differences that remain:
- an `output_dir` that already holds a run is refused (TRL overwrites it); continue it with
  `trainer.train(resume_from_checkpoint=True)`, which trains on to this trainer's `max_steps`;
- `OUT/checkpoint-N` holds the model, the tokenizer and `trainer_state.json`, not the optimizer, scheduler and
  RNG states (those are in the grpolab checkpoint it stands beside), and `resume_from_checkpoint` continues
  the run's newest checkpoint whichever `checkpoint-N` of the run it names;
- TRL logs `clip_ratio/low_min`, `clip_ratio/high_max`, `eval_entropy` and `eval_clip_ratio/...`, which
  grpolab has no number for (its evaluation generates and scores); they are left out of the rows, and
  `eval_loss` is there only where it ranks the best model (`metric_for_best_model="loss"`, with `beta=0.0`). `entropy`, `kl` and the clip ratios are measured once per generation and repeated on each of
  its optimizer steps; the evaluations during training carry no `eval_runtime`;
- a model object is trained in fp32 (moved there in place) and sampled by grpolab's decode loop (vLLM needs
  a directory); `optimizers`, `quantization_config`, `rollout_func` and hyperparameter search are refused;
- with `eval_dataset`, grpolab also scores it before and after training (its summary, `trainer.summary`).
- `--help` of a parser holding `GRPOConfig` describes each field by what it becomes in grpolab, not in TRL's
  words (the options, types, defaults and choices are TRL's); a model directory with its own code
  (`auto_map`) is refused, with `trust_remote_code=True` too;
- a reward function that raises is counted (`reward/<name>/error_frac`) and the run stops after the first
  step on which it failed for every completion, where TRL stops at the raise itself;
- a mixture of experts' router load-balancing loss (`router_aux_loss_coef`) is TRL's term, c x aux per micro-batch;
  grpolab's micro-batches are whole groups where TRL shuffles the completions before cutting its accumulation
  steps, so with several micro-batches per optimizer step each `aux_loss` is over other tokens (with one, the same);
- `neftune_noise_alpha` noises the update's passes (the loss, whose first epoch gives log pi_old), as TRL's hook
  does in training mode; TRL's model is in training mode while transformers' `generate` samples too, so its
  rollouts are noised where grpolab's (and TRL's vLLM ones) are not, and TRL's separate old-log-prob pass
  (`num_iterations` > 1) is noised where grpolab takes log pi_old from its first update pass or the rollout; a
  group's G completions share their prompt's noise (TRL draws it per sequence);
- the best model (`load_best_model_at_end`, `save_strategy="best"`) can be the model before training: grpolab
  evaluates `eval_dataset` before the first step and that evaluation competes; `metric_for_best_model="loss"`
  (the default with `load_best_model_at_end`) needs `beta=0.0` (grpolab measures `eval_loss` only there);
- the rows a stream gives are written to `OUT/dataset.jsonl` (max_steps x prompts per step of them);
- a checkpoint written with `save_only_model=True` is refused by `resume_from_checkpoint` (exit 2 on the
  command line), where transformers' Trainer goes on silently with a fresh optimizer, schedule and RNG;
- `use_transformers_continuous_batching=True` samples with grpolab's rollout engine under the same settings;
  TRL's path also casts the model's weights to bf16 (or fp16) in place before generating and trains them so,
  where grpolab keeps fp32 weights;
- `grpolab train --trl resume_from_checkpoint=...` is refused (`trl grpo` passes the field to `train()`):
  continue a run with `grpolab train --resume OUTPUT_DIR`.

Kinds: **map** (the value becomes the grpolab settings shown), **refused** (any value but TRL's default
is an error naming the field and the reason), **ignored** (accepted, no effect, for the reason given).
"""


def _cell(text: str) -> str:
    return str(text).replace("|", "\\|").replace("\n", " ")


def _target(path: str) -> str:
    return ", ".join(f"`{p.strip()}`" for p in path.split(",") if p.strip())


def render() -> str:
    """The whole page."""
    lines = [HEADER, "| TRL field | TRL default | kind | grpolab | notes |", "|---|---|---|---|---|"]
    for e in TABLE.values():
        kind = {"map": "map", "refuse": "refused", "ignore": "ignored"}[e.kind]
        target = _target(e.target) if e.kind == "map" else ""
        lines.append(f"| `{e.name}` | `{e.default!r}` | {kind} | {target} | {_cell(e.reason)} |")
    return "\n".join(lines) + "\n"


if __name__ == "__main__":
    print(render(), end="")

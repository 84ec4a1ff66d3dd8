"""grpolab's GRPOConfig read by transformers' HfArgumentParser and TRL's TrlParser as they read TRL's own:
every option with the same flags, type, choices, default and nargs as the parser of the real
trl.GRPOConfig; `--output_dir OUT` and friends parse to the same values; `--help` prints; a `--config`
recipe.yaml launcher (TrlParser((ScriptArguments, GRPOConfig, ModelConfig))) gives the same values."""

from __future__ import annotations

import contextlib
import dataclasses
import io

import pytest
from transformers import HfArgumentParser

from grpolab import GRPOConfig
from grpolab.app.trl_compat.entries import value_of

ARGV = [
    "--output_dir",
    "OUT",
    "--per_device_train_batch_size",
    "4",
    "--num_generations",
    "4",
    "--learning_rate",
    "3e-6",
    "--lr_scheduler_type",
    "cosine_with_min_lr",
    "--lr_scheduler_kwargs",
    '{"min_lr_rate": 0.1}',
    "--bf16",
    "false",
    "--no_shuffle_dataset",
    "--reward_weights",
    "1",
    "0.5",
    "--save_strategy",
    "no",
    "--max_completion_length",
    "64",
    "--report_to",
    "none",
    "--use_cpu",
    "true",
]


def _option(a) -> tuple:
    """What a parser does with one option (its help text aside: grpolab's says what the field becomes)."""
    choices = list(a.choices) if a.choices is not None else None
    return (tuple(a.option_strings), a.dest, getattr(a.type, "__name__", a.type), choices, repr(a.default), a.nargs)


def test_every_option_parses_as_trls():
    trl = pytest.importorskip("trl", reason="TRL (the test extra) is not installed")
    ours = [_option(a) for a in HfArgumentParser(GRPOConfig)._actions]
    theirs = [_option(a) for a in HfArgumentParser(trl.GRPOConfig)._actions]
    assert len(ours) == len(theirs) > 190
    assert [o for o in ours if o not in theirs] == []
    assert ours == theirs


def test_command_line_values_are_trls():
    trl = pytest.importorskip("trl", reason="TRL (the test extra) is not installed")
    # the values the two parsers hand to the dataclass (TRL's __post_init__ then settles some of them)
    ours = vars(HfArgumentParser(GRPOConfig).parse_args(ARGV))
    theirs = vars(HfArgumentParser(trl.GRPOConfig).parse_args(ARGV))
    assert ours == theirs
    (args,) = HfArgumentParser(GRPOConfig).parse_args_into_dataclasses(ARGV)
    assert args.output_dir == "OUT"  # was "invalid Any value" when every field was typed Any
    assert args.save_strategy == "no" and args.shuffle_dataset is False and args.bf16 is False
    assert args.reward_weights == [1.0, 0.5] and args.max_completion_length == 64
    assert args.to_grpolab()["out"] == "OUT"


def test_help_prints_every_option():
    out = io.StringIO()
    with contextlib.redirect_stdout(out), pytest.raises(SystemExit) as e:
        HfArgumentParser(GRPOConfig).parse_args(["--help"])
    assert e.value.code == 0
    text = out.getvalue()
    for f in dataclasses.fields(GRPOConfig):
        assert f"--{f.name}" in text
    assert "grpolab: lr" in text  # the help says what each field becomes


def test_trlparser_reads_a_recipe_yaml(tmp_path):
    trl = pytest.importorskip("trl", reason="TRL (the test extra) is not installed")
    recipe = tmp_path / "recipe.yaml"
    recipe.write_text(
        "model_name_or_path: /models/tiny\ndataset_name: /data/zen\noutput_dir: runs/x\n"
        "learning_rate: 3.0e-06\nlr_scheduler_type: cosine_with_min_lr\n"
        "lr_scheduler_kwargs:\n  min_lr_rate: 0.1\nnum_generations: 4\nbeta: 0.04\n"
        "model_init_kwargs:\n  dtype: float32\n"
    )
    values = {}
    for cls in (trl.GRPOConfig, GRPOConfig):
        parser = trl.TrlParser((trl.ScriptArguments, cls, trl.ModelConfig))
        script, args, model = parser.parse_args_and_config(["--config", str(recipe), "--use_cpu", "true"])
        values[cls] = (
            args.output_dir,
            args.learning_rate,
            value_of(args.lr_scheduler_type),
            dict(args.lr_scheduler_kwargs),
            args.num_generations,
            args.beta,
            script.dataset_name,
            model.model_name_or_path,
        )
    assert values[GRPOConfig] == values[trl.GRPOConfig]
    assert values[GRPOConfig][0] == "runs/x"

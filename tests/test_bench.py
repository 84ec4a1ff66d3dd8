"""`grpolab bench` on the tiny model: the real CLI end to end, alone (--against none) and against real
TRL; the log-prob check passes on the same model and fails (exit 1) on another; without TRL it exits
2 with the install command; usage errors exit 2; presets fill what the flags leave out."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest
import torch
from child_limits import limit_s

from grpolab.app.bench import agent as bench_agent
from grpolab.app.bench import spec as bench_spec
from grpolab.app.bench import worker
from grpolab.app.cli import main as cli_main

SRC = Path(__file__).resolve().parents[1] / "src"
TINY = [
    "--prompts",
    "2",
    "--G",
    "2",
    "--new-tokens",
    "4",
    "--steps",
    "1",
    "--rounds",
    "1",
    "--device",
    "cpu",
    "--threads",
    "1",
]  # one thread: on a shared machine two spinning OpenMP threads per process are far slower
CONFIG_KEYS = {"precision", "s_per_step", "gen_tok_s", "train_tok_s", "peak_mb", "phases_s", "step_s_all"}


def _env(extra_path: Path | None = None) -> dict:
    env = dict(os.environ)
    paths = (
        ([str(extra_path)] if extra_path else []) + [str(SRC)] + ([env["PYTHONPATH"]] if env.get("PYTHONPATH") else [])
    )
    env["PYTHONPATH"] = os.pathsep.join(paths)
    env["HF_HUB_OFFLINE"] = "1"
    env["TRANSFORMERS_OFFLINE"] = "1"
    return env


def bench_cli(args: list[str], cwd: Path, extra_path: Path | None = None, processes: int = 3):
    """`grpolab bench ARGS`, killed past the limit of its `processes` Python processes (the bench and its
    workers; tests/child_limits.py): 3 for --against none (a grpolab worker, the matmul rate)."""
    return subprocess.run(
        [sys.executable, "-m", "grpolab.app.cli", "bench", *args],
        cwd=cwd,
        env=_env(extra_path),
        capture_output=True,
        text=True,
        timeout=limit_s(processes),
    )


def json_line(stdout: str) -> dict:
    lines = [ln for ln in stdout.splitlines() if ln.startswith("{")]
    assert len(lines) == 1, stdout
    return json.loads(lines[0])


@pytest.fixture()
def no_trl(tmp_path) -> Path:
    """A directory whose `trl` package fails to import, as on a machine without TRL."""
    (tmp_path / "fake" / "trl").mkdir(parents=True)
    (tmp_path / "fake" / "trl" / "__init__.py").write_text("raise ImportError(\"No module named 'trl'\")\n")
    return tmp_path / "fake"


def test_against_none_prints_the_floor_table_and_a_json_line(tiny_model_dir, tmp_path):
    out = tmp_path / "bench.json"
    p = bench_cli(
        ["--model", str(tiny_model_dir), "--against", "none", "--beta", "0.04", *TINY, "--json-out", str(out)], tmp_path
    )
    assert p.returncode == 0, p.stderr[-3000:]
    res = json_line(p.stdout)
    assert json.loads(out.read_text()) == res
    assert set(res["configs"]) == {"grpolab"} and CONFIG_KEYS <= set(res["configs"]["grpolab"])
    g = res["configs"]["grpolab"]
    assert g["precision"] == "fp32" and g["s_per_step"] > 0 and g["peak_mb"] > 0
    assert g["generated_tokens"] == 2 * 2 * 4  # every completion forced to the full length
    rows = {r["phase"]: r for r in res["floor"]["rows"]}
    assert set(rows) == {"generation", "reference", "update", "step"}
    assert rows["reference"]["flops"] > 0 and rows["update"]["flops"] == 3 * rows["generation"]["flops"]
    assert all(r["ratio"] > 0 for r in rows.values())  # measured time over the floor
    rates = res["matmul_flops"]
    assert rates["fp32"] > 0 and rates["bandwidth"] > 0 and res["threads"] == 1
    assert rates.get("bf16", 0) > 0 or rates["bf16_not_timed"]  # timed where bf16 can pay, else why not
    assert rows["generation"]["bytes"] > 0 and rows["generation"]["floor_s"] == max(
        rows["generation"]["flop_floor_s"], rows["generation"]["memory_floor_s"]
    )
    for text in (
        "s/step",
        "gen tok/s",
        "train tok/s",
        "peak MB",
        "x floor",
        "generation",
        "reference",
        "update",
        "2N(P+C)",
        "TFLOP/s",
        "GB/s",
        "mem fl s",
    ):
        assert text in p.stdout, text


def test_against_trl_runs_real_trl_and_reports_ratios(tiny_model_dir, tmp_path):
    """Setting (c) in miniature: LoRA and a reference pass on both sides, real TRL."""
    p = bench_cli(
        ["--model", str(tiny_model_dir), "--trl-precision", "fp32", "--lora-r", "2", "--beta", "0.04", *TINY],
        tmp_path,
        processes=5,  # the bench, the log-prob check, a grpolab and two TRL workers
    )
    assert p.returncode == 0, p.stderr[-3000:]
    res = json_line(p.stdout)
    check = res["logp_check"]
    assert check["max_abs_diff"] <= 1e-3 and check["same_prompt_tokens"] and check["tokens"] > 0
    assert set(res["configs"]) == {"grpolab", "trl_fp32", "trl_fp32_nockpt"}  # TRL with and without checkpointing
    trl = res["configs"]["trl_fp32"]
    assert CONFIG_KEYS <= set(trl) and trl["gradient_checkpointing"] is True  # TRL's own default
    assert res["configs"]["trl_fp32_nockpt"]["gradient_checkpointing"] is False
    assert trl["trained_params"] == res["configs"]["grpolab"]["trained_params"] < 100_000  # the same adapter
    assert trl["generated_tokens"] == res["configs"]["grpolab"]["generated_tokens"] == 16  # the same work
    r = res["ratios"]["trl_fp32"]
    assert r["s_per_step"] == pytest.approx(res["configs"]["grpolab"]["s_per_step"] / trl["s_per_step"])
    assert all(r[k] > 0 for k in ("s_per_step", "gen_tok_s", "train_tok_s", "peak_mb"))
    fastest = min(("trl_fp32", "trl_fp32_nockpt"), key=lambda n: res["configs"][n]["s_per_step"])
    assert res["fastest_trl"] == fastest and res["grpolab_vs_fastest_trl"] == res["ratios"][fastest]["s_per_step"]
    assert "grpolab / TRL fp32" in p.stdout and "grpolab / TRL fp32 no-ckpt" in p.stdout
    assert "gradient_checkpointing=False" in p.stdout and "log-prob check" in p.stdout


def test_logp_check_fails_on_a_different_model(tiny_model_dir, real_model_dir, tmp_path):
    from grpolab.model.load import make_tiny_model

    other = make_tiny_model(tmp_path / "other", tokenizer_src=real_model_dir, seed=1)
    spec = bench_spec.Spec(model=str(tiny_model_dir), prompts=1, G=2, new_tokens=4, device="cpu")
    spec_path = tmp_path / "spec.json"
    spec_path.write_text(json.dumps(spec.to_dict()))
    assert worker.main(["check", str(spec_path), str(tmp_path / "out.json"), "--trl-model", str(other)]) == 1
    assert not (tmp_path / "out.json").exists()


def test_the_comparison_itself():
    a = torch.tensor([[-1.0, -2.0, -3.0]])
    mask = torch.tensor([[1.0, 1.0, 0.0]])
    assert worker.logp_difference(a, a + torch.tensor([[1e-5, -2e-5, 5.0]]), mask) == pytest.approx(2e-5, abs=1e-6)
    assert "2.00e-05" in worker.judge(2e-5)
    with pytest.raises(worker.CheckFailed, match="log-prob check failed"):
        worker.judge(worker.logp_difference(a, a + 0.01, mask))
    with pytest.raises(worker.CheckFailed):
        worker.judge(float("nan"))


def test_missing_trl_exits_2_with_the_install_command(tiny_model_dir, tmp_path, no_trl):
    p = bench_cli(["--model", str(tiny_model_dir), *TINY], tmp_path, extra_path=no_trl, processes=1)
    assert p.returncode == 2, (p.stdout, p.stderr)
    assert "pip install 'grpolab[bench]'" in p.stderr and "--against none" in p.stderr
    assert not [ln for ln in p.stdout.splitlines() if ln.startswith("{")]


def test_missing_trl_in_a_worker_exits_2(tiny_model_dir, tmp_path, monkeypatch, capsys):
    monkeypatch.setitem(sys.modules, "trl", None)  # `import trl` raises ImportError
    spec_path = tmp_path / "spec.json"
    spec_path.write_text(json.dumps(bench_spec.Spec(model=str(tiny_model_dir)).to_dict()))
    for mode in ("trl", "check"):
        assert worker.main([mode, str(spec_path), str(tmp_path / "out.json")]) == 2
        assert "pip install 'grpolab[bench]'" in capsys.readouterr().err


@pytest.mark.parametrize(
    "args, text",
    [
        (["--G", "1"], "--G"),
        (["--steps", "0"], "--steps"),
        (["--new-tokens", "0"], "--new-tokens"),
        (["--beta", "-1"], "--beta"),
        (["--model", "HuggingFaceTB/SmolLM2-135M"], "model"),
    ],
)
def test_usage_errors_exit_2(args, text, capsys):
    assert cli_main(["bench", *args]) == 2
    assert text in capsys.readouterr().err


def test_bad_flag_values_exit_2_through_argparse(capsys):
    with pytest.raises(SystemExit) as e:
        cli_main(["bench", "--setting", "z"])
    assert e.value.code == 2 and "--setting" in capsys.readouterr().err


def test_presets_fill_what_the_flags_leave():
    a, b, c = (bench_spec.parse_spec(["--setting", s]) for s in "abc")
    assert (a.new_tokens, a.beta, a.lora_r) == (64, 0.0, 0)
    assert (b.new_tokens, b.beta, b.lora_r) == (128, 0.04, 0)
    assert (c.new_tokens, c.beta, c.lora_r) == (128, 0.04, 16)
    assert bench_spec.parse_spec(["--setting", "b", "--new-tokens", "32"]).new_tokens == 32
    plain = bench_spec.parse_spec([])
    assert (plain.prompts, plain.G, plain.new_tokens, plain.steps, plain.rounds) == (2, 8, 64, 3, 2)
    assert plain.trl_precisions() == ["fp32", "bf16"] and plain.trl_checkpointings() == ["on", "off"]
    assert bench_spec.parse_spec(["--trl-checkpointing", "off"]).trl_checkpointings() == ["off"]


def test_trl_without_checkpointing_runs_only_where_the_memory_allows(monkeypatch):
    """Worked: TRL with checkpointing peaked at 1000 MB; without it runs with 1500 MB available
    (NOCKPT_MEMORY = 1.5 x), not with 1400."""
    import importlib

    bench_main = importlib.import_module("grpolab.app.bench.main")  # the module (the package exports main())
    runs = {"trl_fp32": [{"peak_mb": 1000.0, "device": "cpu"}], "trl_fp32_nockpt": []}
    monkeypatch.setattr(bench_main, "available_mb", lambda: 1500.0)
    assert bench_main._no_memory_for("trl_fp32_nockpt", runs) is None
    monkeypatch.setattr(bench_main, "available_mb", lambda: 1400.0)
    assert "1400 MB available, under 1.5 x the 1000 MB" in bench_main._no_memory_for("trl_fp32_nockpt", runs)
    assert bench_main._no_memory_for("trl_fp32", runs) is None  # TRL's default always runs


def test_the_reward_is_the_same_text_function_on_both_sides():
    text = "The answer is 42."
    assert bench_spec.bench_reward([text]) == bench_spec.bench_reward([[{"role": "assistant", "content": text}]])
    scores = bench_spec.bench_reward([f"completion {i}" for i in range(20)])
    assert all(0 <= s <= 1 for s in scores) and len(set(scores)) > 10  # varied: no group left without signal


def test_the_agent_setting_gives_both_sides_the_same_shapes_template_prompts_and_environment(tiny_model_dir, tmp_path):
    """--setting agent, without running a bench: grpolab's Config and TRL's GRPOTrainer are built from one Spec with
    the same G, batch, temperature, turn limit, turn count, chat template and environment, and both render the
    same prompt and tool-reply tokens (worker.agent_token_check, the check a real run does first)."""
    from grpolab.app.bench.trl_side import make_trainer
    from grpolab.model.load import load_tokenizer
    from grpolab.model.template import render

    spec = bench_spec.parse_spec(
        [
            "--model",
            str(tiny_model_dir),
            "--setting",
            "agent",
            "--G",
            "2",
            "--prompts",
            "2",
            "--new-tokens",
            "8",
            "--max-turns",
            "3",
            "--device",
            "cpu",
        ]
    )
    assert spec.agent and (spec.new_tokens, spec.max_turns, spec.beta, spec.lora_r) == (8, 3, 0.0, 0)
    lim = bench_agent.agent_limits(spec)
    model = bench_agent.bench_model_dir(spec, str(tmp_path))
    cfg = bench_spec.grpolab_config(spec, str(tmp_path / "run"), model=model)
    assert (cfg.env.name, cfg.env.max_turns, cfg.env.max_turn_tokens) == (bench_agent.ENV_NAME, 3, 8)
    assert cfg.env.max_model_tokens == 3 * 8 and cfg.env.max_env_tokens == lim["env_tokens"] == 2 * 64
    assert (cfg.G, cfg.batch_size, cfg.temperature, cfg.top_p, cfg.model) == (2, 4, 1.0, 1.0, model)

    tok = load_tokenizer(model)
    assert tok.chat_template == bench_agent.BENCH_CHAT_TEMPLATE  # both sides load this directory
    prompts = bench_spec.step_prompts(spec, bench_spec.bench_task(spec), 1)
    trainer = make_trainer(spec, model, "fp32", prompts, str(tmp_path / "trl"), 1)
    assert (trainer.num_generations, trainer.args.per_device_train_batch_size) == (2, 4)
    assert (trainer.temperature, trainer.top_p) == (1.0, 1.0)
    assert trainer.generation_config.max_new_tokens == lim["trl_max_new_tokens"] == 8  # one generate call = one turn
    assert trainer.max_tool_calling_iterations == 3 - 1
    assert trainer.max_completion_length == 3 * 8 + 2 * 64  # TRL's budget also counts the tool replies
    assert [t.__name__ for t in trainer.tools] == ["add"] and trainer.chat_template is None  # prefix-preserving
    assert trainer.processing_class.chat_template == bench_agent.BENCH_CHAT_TEMPLATE
    assert bench_agent.BenchCalculator().add(a=2, b=3) == "5"

    # the few-shot prompt is, token for token, the template's rendering of a real two-shot tool conversation
    def shot(a, b):
        call = {"type": "function", "function": {"name": "add", "arguments": {"a": a, "b": b}}}
        return [
            {"role": "user", "content": f"What is {a} + {b}?"},
            {"role": "assistant", "content": "", "tool_calls": [call]},
            {"role": "tool", "name": "add", "content": str(a + b)},
            {"role": "assistant", "content": f"The answer is {a + b}."},
        ]

    system = [{"role": "system", "content": bench_agent.AGENT_TASK_ARGS["system_prompt"]}]
    real = system + shot(12, 30) + shot(57, 16) + [{"role": "user", "content": "What is 1 + 2?"}]
    ours = system + [{"role": "user", "content": bench_agent.AGENT_TASK_ARGS["template"].format(question="1 + 2")}]
    tools = [bench_agent.BenchCalculator().add]
    assert render(tok, ours, add_generation_prompt=True, tools=tools) == render(
        tok, real, add_generation_prompt=True, tools=tools
    )

    check = worker.agent_token_check(spec)
    assert check["agent_same_prompt_tokens"] and check["agent_same_tool_reply_tokens"]
    with pytest.raises(Exception, match="--max-turns"):
        bench_spec.parse_spec(["--max-turns", "2"])  # only the agent setting has turns


def floor_summary(kv_slot_bytes=8) -> dict:
    """A grpolab summary for the floor table: 2 sequences of P = 10 prompt and C = 4 completion tokens, N =
    100 non-embedding parameters, V x H = 10 x 5, fp32 in every phase."""
    step = {
        "prompt_tokens_mean": 10.0,
        "completion_tokens_mean": 4.0,
        "seqs": 2.0,
        "generation_s": 2.0,
        "reference_s": 0.0,
        "update_s": 3.0,
        "step_s": 5.0,
    }
    prec = {"generation": "fp32", "reference": "fp32", "update": "fp32"}
    return {"steps": [step], "params_non_embedding": 100, "vocab": 10, "hidden": 5, "kv_slot_bytes": kv_slot_bytes,
            "phase_precision": prec}  # fmt: skip


def test_the_floor_table_takes_the_larger_of_the_flop_and_the_memory_floor():
    """Worked: generation FLOPs 2 x (2 x 100 x 14 + 2 x 10 x 5 x 4) = 6400, at 1000 FLOP/s 6.4 s; bytes
    C b (N + VH) + n s ((C-1) P + C(C-1)/2) = 4 x 4 x 150 + 2 x 8 x (30 + 6) = 2976, at 100 B/s 29.76 s:
    memory-bound, 2 s / 29.76 s. Update 3 x 6400 = 19200 FLOPs, 19.2 s. Step floor 29.76 + 19.2."""
    from grpolab.app.bench.floor import floor_table, generation_bytes

    assert generation_bytes(2, 10, 4, 100, 10, 5, weight_bytes=4, kv_slot=8) == 2976
    rows = {
        r["phase"]: r for r in floor_table(floor_summary(), {"fp32": 1000.0, "bandwidth": 100.0}, beta=0.0, lora=False)
    }
    g = rows["generation"]
    assert g["flops"] == 6400 and g["flop_floor_s"] == pytest.approx(6.4) and g["bytes"] == 2976
    assert g["memory_floor_s"] == pytest.approx(29.76) and g["floor_s"] == pytest.approx(29.76)
    assert g["bound"] == "memory" and g["ratio"] == pytest.approx(2 / 29.76)
    u = rows["update"]
    assert u["flops"] == 19200 and u["floor_s"] == pytest.approx(19.2) and u["bound"] == "FLOPs"
    assert rows["reference"]["floor_s"] == 0 and rows["reference"]["ratio"] is None
    assert rows["step"]["floor_s"] == pytest.approx(48.96) and rows["step"]["ratio"] == pytest.approx(5 / 48.96)
    fast = floor_table(floor_summary(), {"fp32": 1000.0, "bandwidth": 1000.0}, beta=0.0, lora=False)[0]
    assert fast["memory_floor_s"] == pytest.approx(2.976) and fast["floor_s"] == pytest.approx(6.4)
    assert fast["bound"] == "FLOPs" and fast["ratio"] == pytest.approx(2 / 6.4)


def test_the_matmul_rate_shrinks_its_product_to_its_time_budget():
    """A dtype the device computes slowly is timed on a small product: with no time to spare, 256^3."""
    import torch

    from grpolab.app.bench.floor import matmul_rate, memory_bandwidth

    rate, size = matmul_rate(torch.device("cpu"), torch.float32, budget_s=0.0)
    assert size == 256 and rate > 0
    assert matmul_rate(torch.device("cpu"), torch.float32, n=512, budget_s=60.0)[1] == 512
    bw, nbytes = memory_bandwidth(torch.device("cpu"), 8 << 20)
    assert nbytes == 8 << 20 and bw > 0

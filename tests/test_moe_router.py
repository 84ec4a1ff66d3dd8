"""A mixture of experts' router load-balancing loss (algo.router_aux_loss_coef; TRL 1.16's router_aux_loss_coef).

grpolab.algo.router.load_balancing_loss worked out by hand and against transformers' load_balancing_loss_func;
the grouped policy pass (each prompt once, weighted G) gives the aux_loss of the model's own forward over the
expanded batch; which models get the term (grpolab.model.moe.router_aux_of); and one step side by side with
TRL's GRPOTrainer on a tiny random Qwen3-MoE with the same forced completions (tests/trl_parity.py): the loss,
the gradient norm and the logged aux_loss agree within 1e-4 relative, with one micro-batch and with two (TRL's
gradient accumulation, its micro-batches cut at whole groups as grpolab cuts them).
"""

from __future__ import annotations

import math
import shutil

import pytest
import torch

from grpolab.algo.router import load_balancing_loss
from grpolab.util.fields import ConfigError

REL = 1e-4
E, K = 4, 2  # the test model's experts, experts per token


def test_the_loss_worked_out_by_hand():
    # E = 2 experts, top-1. Layer 1: z = [0, ln 3] -> p = [1/4, 3/4] -> expert 1;
    #                               z = [0, ln 4] -> p = [1/5, 4/5] -> expert 1;
    #                               z = [ln 9, 0] -> p = [9/10, 1/10], padding (w = 0): left out.
    # f = [0, 2] / 2 = [0, 1]; P = [(1/4 + 1/5) / 2, (3/4 + 4/5) / 2] = [0.225, 0.775]
    # aux = E sum_e f_e P_e = 2 (0 x 0.225 + 1 x 0.775) = 1.55
    z1 = torch.log(torch.tensor([[1.0, 3.0], [1.0, 4.0], [9.0, 1.0]]))
    w = torch.tensor([1.0, 1.0, 0.0])
    assert float(load_balancing_loss([z1], w, 2, 1)) == pytest.approx(1.55, rel=1e-6)
    # the first token weighted 2 (a prompt token standing for two sequences):
    # f = [0, 1]; P = [(2/4 + 1/5) / 3, (6/4 + 4/5) / 3] = [0.7/3, 2.3/3] -> aux = 2 x 2.3/3
    assert float(load_balancing_loss([z1], torch.tensor([2.0, 1.0, 0.0]), 2, 1)) == pytest.approx(4.6 / 3, rel=1e-6)
    # a second layer, z = [ln 3, 0] for every token -> p = [3/4, 1/4] -> expert 0. The layers are pooled:
    # f = [2, 2] / 4 = [1/2, 1/2]; P = [(1/4 + 1/5 + 3/4 + 3/4) / 4, (3/4 + 4/5 + 1/4 + 1/4) / 4] = [0.4875, 0.5125]
    # aux = 2 (0.5 x 0.4875 + 0.5 x 0.5125) = 1.0 (layer by layer it would be (1.55 + 1.5) / 2 = 1.525)
    z2 = torch.log(torch.tensor([[3.0, 1.0]] * 3))
    assert float(load_balancing_loss([z1, z2], w, 2, 1)) == pytest.approx(1.0, rel=1e-6)
    # balanced routing: every P_e = 1/E and sum_e f_e = k, so aux = k whichever experts the ties pick
    assert float(load_balancing_loss([torch.zeros(5, E)], torch.ones(5), E, K)) == pytest.approx(K)


def test_the_loss_is_transformers_and_a_weight_g_stands_for_g_copies():
    from transformers.models.mixtral.modeling_mixtral import load_balancing_loss_func

    g = torch.Generator().manual_seed(0)
    layers = [torch.randn(3 * 5, E, generator=g) * 2 for _ in range(2)]  # 3 rows x 5 positions, 2 layers
    mask = torch.tensor([[0, 1, 1, 1, 1], [1, 1, 1, 0, 0], [0, 0, 1, 1, 1]])
    ours = load_balancing_loss(layers, mask, E, K)
    assert float(ours) == pytest.approx(float(load_balancing_loss_func(tuple(layers), E, K, mask)), rel=1e-6)
    # row 0 weighted 3 = row 0 three times over
    rep = [torch.cat([z[:5], z[:5], z]) for z in layers]
    rep_mask = torch.cat([mask[:1], mask[:1], mask])
    weighted = mask * torch.tensor([[3], [1], [1]])
    assert float(load_balancing_loss(layers, weighted, E, K)) == pytest.approx(
        float(load_balancing_loss_func(tuple(rep), E, K, rep_mask)), rel=1e-6
    )


def tiny_moe(vocab: int = 128, coef: float = 0.5, **kw):
    """A tiny random Qwen3-MoE: 2 layers, E = 4 experts, top-2, routers scaled up so that routing is uneven."""
    from transformers import Qwen3MoeConfig, Qwen3MoeForCausalLM

    torch.manual_seed(0)
    cfg = Qwen3MoeConfig(
        vocab_size=vocab,
        hidden_size=32,
        intermediate_size=64,
        moe_intermediate_size=32,
        num_hidden_layers=2,
        num_attention_heads=4,
        num_key_value_heads=2,
        head_dim=8,
        num_experts=E,
        num_experts_per_tok=K,
        router_aux_loss_coef=coef,
        tie_word_embeddings=True,
        max_position_embeddings=256,
        **kw,
    )
    model = Qwen3MoeForCausalLM(cfg).float()
    g = torch.Generator().manual_seed(1)
    with torch.no_grad():
        for layer in model.model.layers:
            layer.mlp.gate.weight.copy_(torch.randn(layer.mlp.gate.weight.shape, generator=g))
        for name, p in model.model.layers.named_parameters():
            if p.dim() >= 2 and "gate.weight" not in name:
                p.copy_(torch.randn(p.shape, generator=g) * 0.3)
        model.model.norm.weight.mul_(5.0)
    return model


def test_which_models_get_the_term():
    from transformers import LlamaConfig, LlamaForCausalLM

    from grpolab.model.moe import router_aux_of

    dense = LlamaForCausalLM(
        LlamaConfig(vocab_size=64, hidden_size=16, intermediate_size=32, num_hidden_layers=1, num_attention_heads=2)
    )
    assert router_aux_of(dense, None) is None and router_aux_of(dense, 0.0) is None  # nothing asked, no cost
    with pytest.raises(ConfigError, match="algo.router_aux_loss_coef=0.3: LlamaForCausalLM is not a mixture"):
        router_aux_of(dense, 0.3)  # TRL raises too
    moe = tiny_moe(coef=0.001)
    aux = router_aux_of(moe, None)  # unset: the model config's coefficient, as TRL reads it
    assert (aux.coef, aux.num_experts, aux.top_k) == (0.001, E, K)
    assert router_aux_of(moe, 0.2).coef == 0.2 and router_aux_of(moe, 0.0) is None


def test_the_grouped_pass_gives_the_models_own_aux_loss():
    from grpolab.model.cache import positions
    from grpolab.model.logprobs import grouped_completion_logp
    from grpolab.model.moe import RouterLogits, router_aux_of

    model = tiny_moe()
    G = 2
    p_ids = torch.tensor([[0, 5, 6, 7], [8, 9, 10, 11]])
    p_mask = torch.tensor([[0, 1, 1, 1], [1, 1, 1, 1]])  # left padding
    c_ids = torch.tensor([[12, 13, 14], [15, 16, 0], [17, 18, 19], [20, 0, 0]])
    c_mask = torch.tensor([[1.0, 1, 1], [1, 1, 0], [1, 1, 1], [1, 0, 0]])  # right padding
    router = RouterLogits()
    with torch.no_grad():
        logp, _ = grouped_completion_logp(model, p_ids, p_mask, c_ids, c_mask, G, router=router)
        plain, _ = grouped_completion_logp(model, p_ids, p_mask, c_ids, c_mask, G)
        ids = torch.cat([p_ids.repeat_interleave(G, 0), c_ids], 1)  # the G * (P + C) positions, last token too
        mask = torch.cat([p_mask.repeat_interleave(G, 0), c_mask.long()], 1)
        own = model(ids, attention_mask=mask, position_ids=positions(mask), output_router_logits=True).aux_loss
    assert float(router_aux_of(model, None).loss(router)) == pytest.approx(float(own), rel=1e-5)
    torch.testing.assert_close(logp, plain)  # asking for the router logits leaves the log-probs as they are


@pytest.fixture(scope="module")
def moe_model_dir(tmp_path_factory, tiny_model_dir):
    """tiny_moe with the tiny model's tokenizer (SmolLM2's), saved as a directory both trainers load."""
    from grpolab.model.load import load_tokenizer

    out = tmp_path_factory.mktemp("tiny-moe")
    tiny_moe(vocab=len(load_tokenizer(tiny_model_dir))).save_pretrained(str(out))
    for f in tiny_model_dir.iterdir():
        if f.name.startswith(("tokenizer", "special_tokens", "chat_template")):
            shutil.copy(f, out / f.name)
    return out


def trl_moe_step(model_dir, args, micro_batches: int) -> tuple[float, float, list[float], bool]:
    """TRL: the forced completions scored, compute_loss over `micro_batches` micro-batches of whole groups (TRL
    cuts its accumulation steps after a shuffle; here in order, as grpolab cuts them) with
    current_gradient_accumulation_steps = micro_batches, each backpropagated. Returns (the summed loss, the
    gradient norm, the logged aux_loss of each micro-batch, aux_loss_enabled)."""
    from datasets import Dataset
    from trl import GRPOTrainer
    from trl.trainer.utils import split_tensor_dict
    from trl_parity import PROMPTS, G, forced_completions, grad_norm, reward

    trainer = GRPOTrainer(
        model=str(model_dir), reward_funcs=[reward], args=args, train_dataset=Dataset.from_dict({"prompt": PROMPTS})
    )
    forced = forced_completions(trainer.processing_class)
    trainer._generate_single_turn = lambda prompt_ids, *a, **k: (
        [list(forced[tuple(p)][i % G]) for i, p in enumerate(prompt_ids)],
        None,
    )
    trainer.model.train()
    trainer.current_gradient_accumulation_steps = micro_batches
    inputs = trainer._generate_and_score_completions([{"prompt": p} for p in PROMPTS for _ in range(G)])
    total = 0.0
    for part in split_tensor_dict(inputs, micro_batches):
        loss = trainer.compute_loss(trainer.model, part)
        loss.backward()
        total += float(loss.detach())
    aux = list(trainer._metrics["train"]["aux_loss"])
    return total, grad_norm(trainer.model.parameters()), aux, trainer.aux_loss_enabled


def grpolab_moe_step(model_dir, args, out, monkeypatch) -> tuple[float, float, float]:
    """grpolab: tests/trl_parity.py's grpolab_step on the same forced completions; (the update's loss, the
    gradient norm, the step's loss/aux)."""
    from trl_parity import grpolab_step

    from grpolab.training import step as step_mod

    seen = {}
    real = step_mod.train_step

    def spy(run, step):
        metrics, rest = real(run, step)
        seen.update(metrics=metrics, updates=list(run.updates))
        return metrics, rest

    monkeypatch.setattr(step_mod, "train_step", spy)
    _, norm, _ = grpolab_step(model_dir, args, out, monkeypatch)
    (update,) = seen["updates"]
    assert update["grad_norm"] == pytest.approx(norm)
    return update["loss"], norm, seen["metrics"]["loss/aux"]


CASES = {
    # TRL's defaults (dapo); router_aux_loss_coef unset: the model config's 0.5
    "config_coef": ({}, 1),
    # an explicit coefficient, two accumulation steps of one group each: c * aux / 2 per micro-batch
    "coef_two_micro_batches": (
        {"router_aux_loss_coef": 0.3, "loss_type": "grpo", "per_device_train_batch_size": 4,
         "gradient_accumulation_steps": 2},
        2,
    ),
}  # fmt: skip


@pytest.mark.parametrize("case", list(CASES))
def test_one_step_matches_trl(case, moe_model_dir, tmp_path, monkeypatch):
    pytest.importorskip("trl", reason="TRL (the test extra) is not installed")
    from trl_parity import grpolab_step, trl_config

    fields, micro = CASES[case]
    args = trl_config(tmp_path / "trl", **fields)
    trl_loss, trl_norm, trl_aux, enabled = trl_moe_step(moe_model_dir, args, micro)
    assert enabled and len(trl_aux) == micro
    ours_loss, ours_norm, ours_aux = grpolab_moe_step(moe_model_dir, args, tmp_path / "grpolab", monkeypatch)
    assert math.isclose(ours_aux, sum(trl_aux) / micro, rel_tol=REL), (ours_aux, trl_aux)
    assert math.isclose(ours_loss, trl_loss, rel_tol=REL), (ours_loss, trl_loss)
    assert math.isclose(ours_norm, trl_norm, rel_tol=REL), (ours_norm, trl_norm)
    # the term matters: without it the norm is another (grpolab with c = 0)
    args0 = trl_config(tmp_path / "trl0", **{**fields, "router_aux_loss_coef": 0.0})
    _, norm0, _ = grpolab_step(moe_model_dir, args0, tmp_path / "grpolab0", monkeypatch)
    assert abs(norm0 - trl_norm) > 100 * REL * trl_norm, (norm0, trl_norm)


def test_a_trl_script_trains_a_mixture_of_experts_with_the_term(moe_model_dir, tiny_model_dir, tmp_path):
    """TRL's script with the import changed: a tiny MoE trains a step (grpolab's decode loop samples from it
    through the model's own forward), with TRL's aux_loss in its log; a coefficient on a dense model is
    refused when the trainer is built, as TRL refuses it."""
    pytest.importorskip("trl", reason="TRL (the test extra) is not installed")
    from datasets import Dataset
    from trl_parity import PROMPTS, reward

    from grpolab import GRPOConfig, GRPOTrainer

    def args(out, **kw):
        return GRPOConfig(
            output_dir=str(out), max_steps=1, per_device_train_batch_size=4, num_generations=4,
            max_completion_length=4, logging_steps=1, save_strategy="no", report_to="none", bf16=False,
            use_cpu=True, disable_tqdm=True, **kw,
        )  # fmt: skip

    data = Dataset.from_dict({"prompt": PROMPTS})
    trainer = GRPOTrainer(model=str(moe_model_dir), reward_funcs=reward, args=args(tmp_path / "a"), train_dataset=data)
    assert trainer.aux_loss_enabled and trainer.router_aux_loss_coef == 0.5  # unset: the model config's
    gate = trainer.model.model.layers[0].mlp.gate.weight
    before = gate.detach().clone()
    trainer.train()
    (row,) = [r for r in trainer.state.log_history if "loss" in r and "train_runtime" not in r]
    assert 0 < row["aux_loss"] <= E  # k when balanced, E at worst
    assert not torch.equal(gate.detach(), before)  # the router trained
    with pytest.raises(ValueError, match="router_aux_loss_coef=0.3: LlamaForCausalLM is not a mixture"):
        GRPOTrainer(
            model=str(tiny_model_dir), reward_funcs=reward, args=args(tmp_path / "b", router_aux_loss_coef=0.3),
            train_dataset=data,
        )  # fmt: skip

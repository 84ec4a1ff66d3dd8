"""PPO's critic: GAE arithmetic, terminal rewards, the (clipped) value loss, and a real value model built
from a tiny randomly initialised HF causal LM (no download)."""

import pytest
import torch

from grpolab.algo.gae import completion_values, gae, ppo_advantages, value_loss
from grpolab.algo.presets import resolve_algo
from grpolab.algo.shaping import terminal_rewards
from grpolab.model.critic import ValueModel

V3 = torch.tensor([[0.2, 0.5, 0.9]])
R3 = torch.tensor([[0.0, 0.0, 1.0]])  # terminal verifiable reward 1 on the last token
M3 = torch.ones(1, 3)


def close(a, b, tol=1e-6):
    return torch.allclose(a, torch.as_tensor(b, dtype=a.dtype), atol=tol)


def test_gae_lambda_one_is_return_minus_value():
    # gamma = lam = 1: A_t = sum of future rewards - V_t = 1 - V_t = [0.8, 0.5, 0.1]; returns all 1.
    adv, ret = gae(R3, V3, M3, 1.0, 1.0)
    assert close(adv, [[0.8, 0.5, 0.1]]) and close(ret, [[1.0, 1.0, 1.0]])


def test_gae_lambda_zero_is_one_step_td():
    # lam = 0: A_t = delta_t = r_t + V_{t+1} - V_t: [0 + 0.5 - 0.2, 0 + 0.9 - 0.5, 1 + 0 - 0.9] = [0.3, 0.4, 0.1]
    adv, ret = gae(R3, V3, M3, 1.0, 0.0)
    assert close(adv, [[0.3, 0.4, 0.1]]) and close(ret, [[0.5, 0.9, 1.0]])


def test_gae_worked_discounted():
    # gamma = lam = 0.5 (gamma * lam = 0.25):
    # delta_2 = 1 - 0.9 = 0.1                     A_2 = 0.1
    # delta_1 = 0.5 * 0.9 - 0.5 = -0.05           A_1 = -0.05 + 0.25 * 0.1 = -0.025
    # delta_0 = 0.5 * 0.5 - 0.2 = 0.05            A_0 = 0.05 + 0.25 * -0.025 = 0.04375
    adv, ret = gae(R3, V3, M3, 0.5, 0.5)
    assert close(adv, [[0.04375, -0.025, 0.1]])
    assert close(ret, [[0.24375, 0.475, 1.0]])


def test_gae_padding_and_terminal_rewards():
    # Row 0: 3 tokens, reward 1; row 1: 2 tokens, reward 0.5, padding values are garbage (NaN).
    mask = torch.tensor([[1.0, 1, 1], [1, 1, 0]])
    rew = terminal_rewards(torch.tensor([1.0, 0.5]), mask)
    assert close(rew, [[0, 0, 1.0], [0, 0.5, 0]])
    values = torch.tensor([[0.2, 0.5, 0.9], [0.1, 0.3, float("nan")]])
    adv, ret = gae(rew, values, mask, 1.0, 1.0)
    # row 1 ends at t = 1: A = 0.5 - V = [0.4, 0.2], nothing after it
    assert close(adv, [[0.8, 0.5, 0.1], [0.4, 0.2, 0.0]]) and torch.isfinite(ret).all()
    assert ret[1, 2] == 0.0
    # an empty completion has no token to credit
    assert terminal_rewards(torch.tensor([1.0]), torch.zeros(1, 3)).abs().sum() == 0


def test_ppo_advantages_whitens_but_keeps_returns():
    mask = torch.tensor([[1.0, 1, 1], [1, 1, 0]])
    values = torch.tensor([[0.2, 0.5, 0.9], [0.1, 0.3, 0.0]])
    r = torch.tensor([1.0, 0.5])
    algo = resolve_algo("ppo", {"lam": 1.0})
    adv, ret = ppo_advantages(terminal_rewards(r, mask), values, mask, algo)
    raw, ret_raw = gae(terminal_rewards(r, mask), values, mask, 1.0, 1.0)
    valid = mask > 0
    assert torch.allclose(ret, ret_raw)
    assert adv[valid].mean().abs() < 1e-6 and (adv[valid].var(correction=0) - 1).abs() < 1e-4
    assert adv[~valid].abs().sum() == 0
    # the KL penalty in the reward enters every token: with penalty p_t, A_t (lam = gamma = 1) drops by sum_{k>=t} p_k
    pen = torch.tensor([[0.1, 0.1, 0.1], [0.2, 0.2, 0.0]])
    raw_algo = resolve_algo("ppo", {"lam": 1.0, "adv_scale": "none"})
    adv_p, _ = ppo_advantages(terminal_rewards(r, mask) - pen, values, mask, raw_algo)
    assert close(adv_p, raw - torch.tensor([[0.3, 0.2, 0.1], [0.4, 0.2, 0.0]]))


def test_value_loss_worked_arithmetic():
    old, ret, m = torch.tensor([[0.5]]), torch.tensor([[2.0]]), torch.ones(1, 1)
    # V = 1.0 moved 0.5 from V_old = 0.5, clip 0.2 -> V_clip = 0.7:
    # max((1 - 2)^2, (0.7 - 2)^2) = max(1, 1.69) = 1.69 -> loss 0.845, constant in V (no gradient).
    v = torch.tensor([[1.0]], requires_grad=True)
    loss, info = value_loss(v, old, ret, m, 0.2)
    loss.backward()
    assert loss.item() == pytest.approx(0.845) and v.grad.item() == 0.0 and info["value/clip_frac"] == 1.0
    # V_old = 0.9: the move (0.1) is inside the clip -> 1/2 (1 - 2)^2 = 0.5, gradient V - R = -1.
    v = torch.tensor([[1.0]], requires_grad=True)
    loss, info = value_loss(v, torch.tensor([[0.9]]), ret, m, 0.2)
    loss.backward()
    assert loss.item() == pytest.approx(0.5) and v.grad.item() == pytest.approx(-1.0)
    # no clip: 1/2 (V - R)^2 whatever V_old
    loss, info = value_loss(torch.tensor([[1.0]]), old, ret, m, None)
    assert loss.item() == pytest.approx(0.5) and info["value/clip_frac"] == 0.0
    assert info["value/error"] == pytest.approx(1.0) and info["value/mean"] == pytest.approx(1.0)


def test_value_loss_micro_batches_add_up_and_ignore_padding():
    torch.manual_seed(0)
    v, old, ret = torch.randn(4, 5), torch.randn(4, 5), torch.randn(4, 5)
    mask = (torch.arange(5)[None] < torch.tensor([5, 2, 4, 1])[:, None]).float()
    v = torch.where(mask > 0, v, torch.tensor(float("nan")))
    n = int(mask.sum())
    whole, _ = value_loss(v, old, ret, mask, 0.2, n_tok=n)
    a, _ = value_loss(v[:2], old[:2], ret[:2], mask[:2], 0.2, n_tok=n)
    b, _ = value_loss(v[2:], old[2:], ret[2:], mask[2:], 0.2, n_tok=n)
    assert torch.isfinite(whole) and (a + b).item() == pytest.approx(whole.item(), abs=1e-6)


def test_completion_values_alignment():
    # Prompt width P = 3, completion T = 2: the state before completion token 0 is the prompt, whose
    # last position is 2; before token 1 it is position 3.
    values = torch.arange(6.0)[None]  # (1, P + T + 1)
    assert completion_values(values, 3, 2).tolist() == [[2.0, 3.0]]


def tiny_llama(dtype=torch.float32):
    from transformers import LlamaConfig, LlamaForCausalLM

    torch.manual_seed(0)
    cfg = LlamaConfig(
        vocab_size=32,
        hidden_size=16,
        intermediate_size=32,
        num_hidden_layers=2,
        num_attention_heads=2,
        num_key_value_heads=2,
        max_position_embeddings=64,
    )
    return LlamaForCausalLM(cfg).to(dtype)


def tiny_gpt2():
    from transformers import GPT2Config, GPT2LMHeadModel

    torch.manual_seed(0)
    return GPT2LMHeadModel(GPT2Config(vocab_size=32, n_embd=16, n_layer=1, n_head=2, n_positions=64))


@pytest.mark.parametrize("make", [tiny_llama, tiny_gpt2])
def test_value_model_is_a_trainable_copy(make):
    policy = make()
    policy_state = {k: t.clone() for k, t in policy.state_dict().items()}
    critic = ValueModel(policy)
    ids = torch.randint(0, 32, (3, 7))
    am = torch.ones(3, 7, dtype=torch.long)
    values = critic(ids, am)
    assert values.shape == (3, 7) and values.dtype == torch.float32
    assert torch.equal(values, torch.zeros(3, 7))  # zero-initialised head: V starts at 0
    # a copy: no storage shared with the policy
    pol_ptrs = {p.data_ptr() for p in policy.parameters()}
    assert not pol_ptrs & {p.data_ptr() for p in critic.parameters()}
    assert all(p.requires_grad for p in critic.parameters())
    # train it towards returns of 1: the head moves first, then the backbone; the policy never moves
    opt = torch.optim.Adam(critic.parameters(), lr=1e-2)
    backbone0 = [p.detach().clone() for p in critic.backbone.parameters()]
    mask = torch.ones(3, 7)
    losses = []
    for _ in range(30):
        v = critic(ids, am)
        loss, _ = value_loss(v, v.detach(), torch.ones(3, 7), mask, None)
        opt.zero_grad()
        loss.backward()
        opt.step()
        losses.append(loss.item())
    assert losses[-1] < 0.1 * losses[0]
    assert any(not torch.equal(p0, p) for p0, p in zip(backbone0, critic.backbone.parameters()))
    for k, t in policy.state_dict().items():
        assert torch.equal(t, policy_state[k]), k


def test_value_model_from_bf16_policy_returns_fp32():
    critic = ValueModel(tiny_llama(torch.bfloat16))
    v = critic(torch.randint(0, 32, (2, 5)), torch.ones(2, 5, dtype=torch.long))
    assert v.dtype == torch.float32 and v.shape == (2, 5)


@pytest.mark.parametrize("make", [tiny_llama, tiny_gpt2])
def test_value_model_sees_left_padded_rows_at_their_own_positions(make):
    """A left-padded prompt must get the values it gets alone, as in the policy's passes (positions
    skip the padding). GPT-2's learned absolute position embeddings make a shift visible; Llama's
    rotary ones are relative, so for it this holds up to float rounding either way."""
    critic = ValueModel(make()).eval()  # no dropout
    torch.manual_seed(1)
    torch.nn.init.normal_(critic.value_head.weight)
    ids = torch.randint(1, 32, (1, 6))
    alone = critic(ids, torch.ones(1, 6, dtype=torch.long))  # (1, 6)
    padded_ids = torch.cat([torch.zeros(1, 3, dtype=torch.long), ids], 1)  # 3 pad tokens on the left
    padded_mask = torch.cat([torch.zeros(1, 3, dtype=torch.long), torch.ones(1, 6, dtype=torch.long)], 1)
    padded = critic(padded_ids, padded_mask)[:, 3:]  # (1, 6)
    assert torch.allclose(padded, alone, atol=1e-5), (padded - alone).abs().max()


# -- the advantage component's contract ----------------------------------------------------------------


def test_group_baseline_and_critic_are_advantage_components():
    """Both classes satisfy grpolab.training.components.AdvantageComponent: every member, and each method with
    the protocol's parameters (the step calls them positionally, so the names must mean the same)."""
    import inspect

    from grpolab.model.critic import Critic
    from grpolab.training.components import AdvantageComponent, GroupBaseline

    algo = resolve_algo("ppo")
    critic = Critic(tiny_llama(), algo, lr=1e-3, betas=(0.9, 0.999), weight_decay=0.0, device=torch.device("cpu"))
    for component in (GroupBaseline(resolve_algo("grpo")), critic):
        assert isinstance(component, AdvantageComponent), type(component).__name__
        assert isinstance(component.computes_every_group, bool)
        for name, fn in vars(AdvantageComponent).items():
            if inspect.isfunction(fn) and not name.startswith("_"):
                want = list(inspect.signature(fn).parameters)
                assert list(inspect.signature(getattr(type(component), name)).parameters) == want, name
    assert not isinstance(object(), AdvantageComponent)


def test_the_critic_pass_goes_through_model_passes():
    """Critic.targets: the old values of every group (passes.values_without_grad), then GAE; add_loss
    computes the same values with gradients on a slice (passes.slice_values)."""
    from types import SimpleNamespace

    from grpolab.algo.shaping import terminal_rewards
    from grpolab.batch import Rollout
    from grpolab.model.critic import Critic
    from grpolab.model.passes import PassSpec, all_groups, micro_batches, slice_groups

    algo = resolve_algo("ppo")
    critic = Critic(tiny_llama(), algo, lr=1e-3, betas=(0.9, 0.999), weight_decay=0.0, device=torch.device("cpu"))
    torch.nn.init.normal_(critic.model.value_head.weight)
    mask = torch.tensor([[1.0, 1, 1], [1, 1, 0], [1, 0, 0], [1, 1, 1]])
    rollout = Rollout(
        prompt_ids=torch.randint(1, 32, (4, 4)),
        prompt_mask=torch.ones(4, 4, dtype=torch.long),
        completion_ids=torch.randint(1, 32, (4, 3)),
        completion_mask=mask,
        sample_logp=-mask,
        truncated=torch.zeros(4, dtype=torch.bool),
        texts=list("abcd"),
        G=2,
    )
    batch = SimpleNamespace(
        rollout=rollout, token_reward=terminal_rewards(torch.tensor([1.0, 0, 1, 0]), mask), n_tokens=int(mask.sum())
    )
    spec = PassSpec(torch.device("cpu"), None, micro_batch=2)
    adv = critic.targets(spec, batch)
    assert adv.shape == (4, 3) and batch.old_values.shape == (4, 3) and batch.returns.shape == (4, 3)
    part = slice_groups(rollout, micro_batches(rollout, all_groups(rollout), 2)[0], spec.device)
    v = critic.values(spec, part)
    assert torch.allclose(
        v.detach() * part.completion_mask, batch.old_values[part.rows, : part.width] * part.completion_mask, atol=1e-6
    )
    loss, info = critic.add_loss(torch.zeros(()), spec, part, batch)
    loss.backward()
    assert "value/error" in info and critic.model.value_head.weight.grad is not None


def test_a_model_without_a_backbone_gets_a_clear_error():
    class NoBody(torch.nn.Module):
        base_model_prefix = "model"

    with pytest.raises(ValueError, match="cannot find the transformer backbone of NoBody"):
        ValueModel(NoBody())

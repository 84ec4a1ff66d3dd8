"""What one training step holds in memory, phase by phase: a model of grpolab's own passes, in bytes.

Every term is a tensor the code allocates, read off the code and checked against what autograd saves
and the allocator reports (tests/test_memory_model.py; benchmarks/memory_plan.py compares the peak
of whole steps):

  resident    policy weights 4 P (fp32); AdamW's two moments 8 P_t (P_t: trained parameters); a frozen
              reference copy (full fine-tuning with beta > 0; its linear weights in the update's
              autocast dtype, grpolab.model.reference); a PPO critic (a copy of the backbone) and its AdamW
  generation  the KV cache (the lean decoder's is fp32 and sized for the longest sequence, and is
              copied when finished rows leave the batch: grpolab.engine.native.decoder.KVCache; the model's own
              cache grows in the compute dtype), the weights in the compute dtype (the lean decoder's
              copies, decode_weights: in fp32 on a CPU a blocked copy of every weight; or autocast's
              cached casts of trained weights), the logits and sampling buffers;
              or, with an inference engine, its reserved share of the device instead
  reference   one no-grad micro-batch: its KV cache of every layer, the hidden states, one chunk of logits
  update      per micro-batch: every layer's saved activations (`layer_saved`; with checkpointing only
              each layer's input, `layer_kept`), the weights cast for autocast, the LM head's kept
              logits and chunk buffers (grpolab.model.lmhead), and the gradients -- 4 P_t held from the
              second micro-batch of an update on, plus a second set pending during the backward:
              every weight serves the prompt pass and the completion pass of a group
              (grpolab.model.logprobs.grouped_completion_logp), and autograd sums a weight's two
              contributions before accumulating them, the prompt pass's arriving last (in the
              autocast dtype for the weights autocast casts: their cast is shared by both passes)
  optimizer   the gradients and AdamW's step
  reward      a reward model's weights (resident) and one no-grad forward of a call's sequences
              (grpolab.training.plan.reward_nets), per reward model of the run

The peak is the largest phase. Sizes: B prompts and N = B G sequences per step, P prompt and C
completion positions, n sequences per micro-batch, c bytes per value of the compute dtype.
"""

from __future__ import annotations

from dataclasses import dataclass, field

from grpolab.training.plan import reward_nets as rm
from grpolab.training.plan.shapes import LORA_TARGETS, Shape

F32 = 4
LOGIT_BUDGET = 1 << 24  # grpolab.model.lmhead: fp32 logits entries held at once (one chunk)
SAVED_LOGITS_BYTES = 1 << 28  # grpolab.model.lmhead: logits kept for the backward up to this size
SAMPLING_BUFFERS = 5  # (rows, V) fp32 tensors alive while a token is drawn (grpolab.engine.native.sampling)


@dataclass(frozen=True)
class Workload:
    """What one step processes (per data-parallel rank)."""

    prompts: int
    G: int
    prompt_tokens: int
    completion_tokens: int
    """The widest completion of the step (max_new_tokens when rows run to the limit)."""
    max_new_tokens: int
    seqs_per_pass: int
    """Sequences per micro-batch: whole groups, max(1, micro_batch // G) * G."""
    mu: int = 1

    @property
    def rows(self) -> int:
        return self.prompts * self.G

    @property
    def micro_batches(self) -> int:
        return -(-self.rows // self.seqs_per_pass)


@dataclass(frozen=True)
class Regime:
    """How the run computes: device, precision, adapter, reference, critic, rollout path."""

    device: str = "cpu"
    """cpu (grpolab's grouped-query attention in the passes) or cuda (sdpa)."""
    update_bytes: int = 4
    """Bytes per value of the scoring passes' compute dtype: 2 under bf16 autocast, 4 in fp32."""
    rollout_bytes: int = 4
    lean: bool = False
    """The rollout runs grpolab.engine.native.decoder's lean step (else the model's own forward and cache)."""
    lean_fp32_layout: str = "panels"
    """How the lean step holds fp32 weights on a CPU (grpolab.engine.native.decoder.FP32_LAYOUT): "panels" or
    "onednn", a packed copy of every weight; "nk", the model's own, copying only the stacked q|k|v and gate|up."""
    lora_r: int = 0
    lora_targets: tuple[str, ...] = LORA_TARGETS
    lora_dropout: float = 0.0
    reference: str = "none"
    """none (beta = 0), copy (a frozen copy, full fine-tuning) or adapter_off (LoRA: no second copy)."""
    critic: bool = False
    checkpointing: bool = False
    rows_leave: bool = True
    """Finished rows leave the rollout batch (the lean cache is then copied once); False when every row
    runs to max_new_tokens."""
    engine_share: int = 0
    """Bytes an inference engine reserves for generation (0: grpolab's own rollout)."""
    entropy: bool = True
    """The first epoch's update pass computes entropies (grpolab.training.update.update does)."""
    reward_nets: tuple[rm.RewardNet, ...] = ()
    """The run's reward models (grpolab.training.plan.reward_nets): resident weights and a forward per call."""


@dataclass
class Phase:
    """One phase of the step: the bytes it holds, by part (the resident parts included)."""

    name: str
    parts: dict[str, int] = field(default_factory=dict)
    note: str = ""

    @property
    def total(self) -> int:
        return sum(self.parts.values())


# --- parameters -------------------------------------------------------------------------------------


def trained_params(s: Shape, r: Regime) -> int:
    return s.lora_params(r.lora_r, r.lora_targets) if r.lora_r else s.params


def resident(s: Shape, r: Regime) -> dict[str, int]:
    """Bytes held across the whole step (after the first optimizer step has made AdamW's state)."""
    lora = s.lora_params(r.lora_r, r.lora_targets) if r.lora_r else 0
    out = {"weights": F32 * (s.params + lora), "AdamW state": 2 * F32 * trained_params(s, r)}
    if r.reference == "copy":  # nn.Linear weights not shared with another module go to the autocast dtype
        linear = s.layers * s.layer_linear + s.head
        out["reference copy"] = F32 * s.params - (F32 - r.update_bytes) * linear
    if r.critic:  # a copy of the backbone, all trained, and its own AdamW
        out["critic + its AdamW"] = 3 * F32 * (s.backbone_params + s.hidden + 1)
    if r.engine_share:
        out["inference engine"] = r.engine_share
    if r.reward_nets:
        out["reward model weights"] = sum(rm.weights(net) for net in r.reward_nets)
    return out


# --- activations ------------------------------------------------------------------------------------


def layer_saved(s: Shape, n: int, L: int, S: int, c: int, r: Regime) -> int:
    """Bytes autograd keeps for the backward of one decoder layer run with gradients over n rows of L
    positions attending to S keys, compute dtype of c bytes.

    fp32 residual stream: the layer input and the mid-layer residual (each norm's input), and with
    trained norm weights both norms' normalised outputs, 4 T H * 4 (T = n L; LoRA: 2 T H * 4).
    Projection inputs (kept for the weight gradients): in fp32 one per norm plus o_proj's,
    T (2 H + n_h d) * 4; under autocast each projection casts its own input, T (5 H + n_h d) * c;
    under LoRA only the adapted projections keep theirs (their adapter's A reads it). MLP: gate,
    silu(gate), up and their product (down_proj's input), 4 T I * c. Attention: q (T n_h d), the keys
    and values after the cache (2 n S n_kv d), then on a CPU the soft-maxed scores (n n_h L S) and the
    boolean mask (n L S bytes, grpolab.model.attention); on CUDA sdpa's output and log-sum-exp, with
    keys and values repeated to n_h heads and a float mask when a padding mask is passed
    (transformers' sdpa path). LoRA adds each adapter's B input (T r * c). The first layer of a LoRA
    model keeps one (T, H) fp32 tensor less (its input needs no gradient: pass_activations subtracts it).
    """
    T, H, I = n * L, s.hidden, s.intermediate
    lora = r.lora_r > 0
    t = set(r.lora_targets) if lora else set(LORA_TARGETS)
    resid = (2 if lora else 4) * T * H * F32
    if c == F32:  # distinct tensors: norm 1's output, o_proj's input, norm 2's output
        proj_in = (
            T
            * F32
            * (
                H * bool(t & {"q_proj", "k_proj", "v_proj"})
                + s.q_dim * ("o_proj" in t)
                + H * bool(t & {"gate_proj", "up_proj"})
            )
        )
    else:  # one cast per projection (o_proj's input is already in c)
        proj_in = (
            T * c * (H * len(t & {"q_proj", "k_proj", "v_proj", "gate_proj", "up_proj"}) + s.q_dim * ("o_proj" in t))
        )
    mlp = (3 + ("down_proj" in t)) * T * I * c
    q = T * s.q_dim * c
    if r.device == "cuda":
        rep_kv = 2 * n * S * (s.q_dim if s.heads != s.kv_heads else s.kv_dim) * c
        attention = q + rep_kv + T * s.q_dim * c + n * s.heads * L * F32 + n * L * S * c
    else:
        attention = q + 2 * n * S * s.kv_dim * c + n * s.heads * L * S * c + n * L * S
    adapters = T * r.lora_r * c * len(t & set(LORA_TARGETS)) if lora else 0
    if lora and r.lora_dropout > 0:  # dropout's output (the adapter's A input) and its mask
        adapters += sum(T * i * (c + 1) for name, (i, _) in s.linear_dims().items() if name in t)
    return resid + proj_in + mlp + attention + adapters


def layer_kept(s: Shape, n: int, L: int, prompt: int, c: int) -> int:
    """Bytes one checkpointed decoder layer keeps: its fp32 input, and in the completion pass the
    prompt's keys and values it started from (grpolab.model.checkpointing restores them for the replay)."""
    return n * L * s.hidden * F32 + 2 * n * prompt * s.kv_dim * c


def layer_transient(s: Shape, n: int, L: int, S: int, c: int, r: Regime, grad: bool) -> int:
    """The largest short-lived tensors inside one layer: without gradients its MLP intermediates and
    attention scores; in a backward the gradients of the MLP intermediates and of its largest weight."""
    T = n * L
    scores = n * s.heads * L * S * (F32 if r.device == "cpu" else 0)
    if not grad:
        return 3 * T * s.intermediate * c + scores + 2 * T * s.hidden * F32
    weight = 0 if r.lora_r else F32 * s.hidden * s.intermediate
    return 3 * T * s.intermediate * F32 + scores + weight


def head_buffers(s: Shape, M: int, c: int, *, entropy: bool) -> int:
    """grpolab.model.lmhead's chunk buffers: fp32 logits, their copy in the compute dtype, the exponentials
    when entropies are asked."""
    chunk = min(max(1, LOGIT_BUDGET // s.vocab), M)
    per = chunk * s.vocab
    return per * F32 + (per * c if c != F32 else 0) + (per * F32 if entropy else 0)


def kept_logits(s: Shape, M: int, c: int) -> int:
    """The (M, V) logits the chunked head keeps for its backward, when they fit SAVED_LOGITS_BYTES."""
    b = M * s.vocab * c
    return b if b <= SAVED_LOGITS_BYTES else 0


def pass_activations(s: Shape, w: Workload, r: Regime, n: int) -> dict[str, int]:
    """What the update's forward of one micro-batch of n sequences keeps for the backward: the prompt
    pass (n / G rows of P positions), the completion pass (n rows of C - 1 positions after the prompt),
    the final norms and the LM head's inputs (grpolab.model.logprobs.grouped_completion_logp)."""
    c, P, C = r.update_bytes, w.prompt_tokens, w.completion_tokens
    b, Lc, S = max(1, n // w.G), max(C - 1, 0), P + max(C - 1, 0)
    if r.checkpointing:
        layers = s.layers * (layer_kept(s, b, P, 0, c) + layer_kept(s, n, Lc, P, c))
    else:
        layers = s.layers * (layer_saved(s, b, P, P, c, r) + layer_saved(s, n, Lc, S, c, r))
        if r.lora_r:  # the first layer's input needs no gradient: its first norm keeps nothing
            layers -= (b * P + n * Lc) * s.hidden * F32
    M = n * C
    final = 2 * (b * P + n * Lc) * s.hidden * F32 + M * s.hidden * F32  # both final norms, the head's input
    return {"activations": layers + final, "kept logits": kept_logits(s, M, c)}


def prompt_activations(s: Shape, w: Workload, r: Regime, n: int) -> int:
    """The prompt pass's share of pass_activations (what is left when the completion pass's backward ends)."""
    b, c = max(1, n // w.G), r.update_bytes
    per = (
        layer_kept(s, b, w.prompt_tokens, 0, c)
        if r.checkpointing
        else layer_saved(s, b, w.prompt_tokens, w.prompt_tokens, c, r)
    )
    return s.layers * per


# --- phases ------------------------------------------------------------------------------------------


def decode_weights(s: Shape, r: Regime) -> int:
    """Bytes of the weights the lean step gathers for a rollout (grpolab.engine.native.decoder.weights_of).

    In bf16: c (L W_layer + 2 V H), every linear weight cast, and the head's cast beside its blocked copy
    while oneDNN's layout is made (on a CPU). In fp32 on a CPU with the "panels" or "onednn" layout: 4 (L W_layer +
    V H), every weight packed into a copy of its own size (o, down and the head too; the
    stacked q|k|v and gate|up copies are freed as each is reordered). Otherwise fp32 keeps o, down and
    the head as they are: 4 L (W_qkv + W_gate + W_up), the stacked copies. L layers, W_layer a layer's
    linear weights, V H the head's."""
    if r.rollout_bytes != F32:
        return r.rollout_bytes * (s.layers * s.layer_linear + 2 * s.embedding)
    if r.device == "cpu" and r.lean_fp32_layout in ("panels", "onednn"):
        return F32 * (s.layers * s.layer_linear + s.embedding)
    d = s.linear_dims()
    stacked = sum(d[k][0] * d[k][1] for k in ("q_proj", "k_proj", "v_proj", "gate_proj", "up_proj"))
    return F32 * s.layers * stacked


def generation(s: Shape, w: Workload, r: Regime) -> dict[str, int]:
    """The rollout's own bytes (on top of the resident ones)."""
    if r.engine_share:
        return {}
    N, B, S = w.rows, w.prompts, w.prompt_tokens + w.max_new_tokens
    c = r.rollout_bytes
    out: dict[str, int] = {}
    if r.lean:  # weights gathered once per rollout (decode_weights)
        out["decode weights"] = decode_weights(s, r)
        cache = 2 * s.layers * N * s.kv_dim * S * F32
        out["KV cache"] = cache * (2 if r.rows_leave else 1) + 2 * s.layers * B * s.kv_dim * S * F32
    else:
        if c != F32:  # autocast caches the cast of every trained weight for the whole decode
            trained = 0 if r.lora_r else s.layers * s.layer_linear + s.vocab * s.hidden
            out["autocast weight casts"] = c * trained
        out["KV cache"] = 2 * s.layers * N * s.kv_dim * (w.prompt_tokens + w.completion_tokens) * c
    prefill = layer_transient(s, B, w.prompt_tokens, w.prompt_tokens, c, r, grad=False)
    out["logits, sampling, prefill"] = SAMPLING_BUFFERS * N * s.vocab * F32 + prefill
    return out


def nograd_pass(s: Shape, w: Workload, r: Regime, *, full_sequences: bool = False) -> dict[str, int]:
    """One micro-batch of a no-grad pass (reference, old policy; the critic's values with full_sequences):
    the KV cache of every layer, the hidden states, one chunk of logits and one layer's intermediates."""
    n, c, P, C = w.seqs_per_pass, r.update_bytes, w.prompt_tokens, w.completion_tokens
    S = P + C
    cache = 2 * s.layers * n * s.kv_dim * S * c
    hidden = 2 * n * (S if full_sequences else C) * s.hidden * F32
    out = {
        "KV cache": cache,
        "hidden states": hidden,
        "layer intermediates": layer_transient(s, n, C, S, c, r, grad=False),
    }
    if full_sequences:  # the critic's weights are trained: autocast caches their casts for the pass
        out["weight casts"] = c * s.layers * s.layer_linear if c != F32 else 0
        return out
    # the LM head's weight is cast for the pass unless the frozen copy already stores it in c
    head_cast = s.vocab * s.hidden * c if c != F32 and not (r.reference == "copy" and not s.tied) else 0
    out["logits chunk"] = head_buffers(s, n * C, c, entropy=False) + n * C * s.hidden * c + head_cast
    return out


def update_moments(s: Shape, w: Workload, r: Regime) -> dict[str, dict[str, int]]:
    """The update's candidate peaks (on top of the resident bytes), for its fullest micro-batch:

    forward end      held gradients + every saved activation + the head's buffers and weight cast
    head backward    the same, with the head's weight and input gradients instead of the entropy buffer
    backward turn    held gradients + the pending second set (in c bytes for the weights autocast casts)
                     + the prompt pass's activations + the
                     embedding's dense gradient (full fine-tuning) + one layer's backward
    (PPO adds the critic's activations to the first two and its gradients to the last.)
    Between the head's backward and the turn, activations are freed as pending gradients grow: the
    bytes move linearly from one end to the other, so the peak is at one of them.
    """
    n, c = min(w.seqs_per_pass, w.rows), r.update_bytes
    acts = pass_activations(s, w, r, n)
    P_t = trained_params(s, r)
    later = w.micro_batches > 1
    held = F32 * P_t if later else 0
    M = n * w.completion_tokens
    linear = s.layers * s.layer_linear
    # frozen weights (LoRA) are cast anew in each of the two passes (autocast caches only trained ones),
    # except the first layer's q, k, v, whose input needs no gradient
    qkv = s.hidden * (s.q_dim + 2 * s.kv_dim)
    casts = 0 if c == F32 else (c * (2 * linear - 2 * qkv) if r.lora_r else c * linear)
    bwd_casts = casts // 2 if r.lora_r else casts  # the prompt pass's, until its own backward
    if r.checkpointing:  # no layer keeps a cast; autocast's cache holds the trained weights' until the forward ends
        casts = 0 if (r.lora_r or c == F32) else c * linear
        bwd_casts = 0
    head_cast = s.vocab * s.hidden * c if c != F32 else 0
    head_in = M * s.hidden * c if c != F32 else 0
    Lc, S = max(w.completion_tokens - 1, 0), w.prompt_tokens + max(w.completion_tokens - 1, 0)
    fwd = {
        "gradients (held)": held,
        **acts,
        "weight casts": casts,
        "LM head buffers": head_buffers(s, M, c, entropy=r.entropy) + head_cast + head_in,
    }
    if r.device == "cuda" or r.checkpointing:  # the pass's own KV cache, alive until it returns: not the
        fwd["KV cache (pass)"] = 2 * s.layers * n * s.kv_dim * S * c  # saved tensors there (sdpa repeats them)
    head_grad = 0 if r.lora_r else F32 * s.vocab * s.hidden + (c * s.vocab * s.hidden if c != F32 else 0)
    head_bwd = {
        **fwd,
        "LM head buffers": head_buffers(s, M, c, entropy=False) + head_cast + head_in,
        "LM head gradients": head_grad + F32 * M * s.hidden,
        "KV cache (pass)": 0,
        "weight casts": bwd_casts,
    }
    embed = 0 if r.lora_r else F32 * s.embedding * (2 if s.tied else 1)
    # a weight autocast casts once per pass (a trained one: cached) sums its two gradients in c bytes,
    # before the cast's backward turns them to fp32
    layer_pending = P_t if r.lora_r else s.layers * s.layer_params
    pending = F32 * layer_pending - ((F32 - c) * (P_t if r.lora_r else linear) if c != F32 else 0)
    untied_head = F32 * s.head if not (r.lora_r or later) else 0  # accumulated at once, the first time
    bwd_layer = layer_transient(s, n, Lc, S, c, r, grad=True)
    if r.checkpointing:  # the layer being replayed holds its saved tensors (and its weights' casts) again
        bwd_layer += layer_saved(s, n, Lc, S, c, r) + (c * s.layer_linear if c != F32 else 0)
    bwd = {
        "gradients (held)": held + untied_head,
        "gradients (pending)": pending + embed,
        "activations": prompt_activations(s, w, r, n),
        "weight casts": bwd_casts,
        "layer backward": bwd_layer,
    }
    moments = {"update (forward end)": fwd, "update (head backward)": head_bwd, "update (backward)": bwd}
    if r.critic:  # the critic's full-sequence pass runs beside the policy's; its gradients accumulate at once
        crit = F32 * (s.backbone_params + s.hidden + 1)
        full = w.prompt_tokens + w.completion_tokens
        crit_acts = s.layers * layer_saved(s, n, full, full, c, Regime(device=r.device))
        for m in (fwd, head_bwd):
            m["critic activations"], m["critic gradients"] = crit_acts, crit if later else 0
        bwd["critic gradients"] = crit
        moments["update (critic backward)"] = {
            **fwd,
            "critic activations": 0,
            "critic gradients": crit,
            "critic embedding gradient": F32 * s.embedding,
        }
    return moments


def phases(s: Shape, w: Workload, r: Regime) -> list[Phase]:
    """Every phase of one step, each with its resident parts and its own."""
    base = resident(s, r)
    out = [
        Phase("resident", dict(base)),
        Phase("generation", {**base, **generation(s, w, r)}, "inference engine" if r.engine_share else ""),
    ]
    for net in r.reward_nets:  # after the rollout, before the reference pass (grpolab.training.step)
        n, S = net.seqs_per_pass(w.G), w.prompt_tokens + w.completion_tokens
        parts = rm.forward_bytes(net, n, S, r.update_bytes)
        out.append(Phase(net.phase, {**base, **parts}, f"{n} sequences per pass"))
    if r.reference != "none":
        out.append(Phase("reference", {**base, **nograd_pass(s, w, r)}))
    if r.critic:
        out.append(Phase("critic values", {**base, **nograd_pass(s, w, r, full_sequences=True)}))
    for name, parts in update_moments(s, w, r).items():
        out.append(Phase(name, {**base, **parts}, f"micro-batch of {min(w.seqs_per_pass, w.rows)} sequences"))
    grads = F32 * trained_params(s, r) + (F32 * (s.backbone_params + s.hidden + 1) if r.critic else 0)
    out.append(Phase("optimizer", {**base, "gradients": grads}))
    return out


def peak(s: Shape, w: Workload, r: Regime) -> Phase:
    """The phase with the most bytes."""
    return max(phases(s, w, r), key=lambda p: p.total)


__all__ = [
    "Phase",
    "Regime",
    "Workload",
    "decode_weights",
    "layer_saved",
    "pass_activations",
    "peak",
    "phases",
    "resident",
]

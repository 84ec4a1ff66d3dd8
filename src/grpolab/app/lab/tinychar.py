"""A tiny character-level Llama, built and pre-trained inside grpolab (for `grpolab lab aha`).

    tok = char_tokenizer()                       a PreTrainedTokenizerFast: one token per character
    model = tiny_llama(tok, hidden=96, layers=3) transformers' LlamaForCausalLM, randomly initialised
    pretrain(model, tok, pairs, steps=...)       supervised next-token training on (prompt, completion)
    save(model, tok, out)                        a normal Hugging Face directory: `model=out` loads it

The tokenizer has no chat template, so grpolab's rollout feeds the task prompt as plain text; every
completion ends with the EOS token, which the rollout stops on. The loss of pre-training covers the
completion and its EOS only (the prompt is given, not predicted).
"""

from __future__ import annotations

import math
import random
import time
from pathlib import Path

import torch

CHARS = "0123456789+-=,.;:?! abcdefghijklmnopqrstuvwxyzáéíóúñ"
SPECIALS = ("<pad>", "<bos>", "<eos>", "<unk>")


def char_tokenizer(chars: str = CHARS):
    """One token per character of `chars` (others map to <unk>), with pad/bos/eos/unk specials."""
    from tokenizers import Regex, Tokenizer, decoders, models, pre_tokenizers
    from transformers import PreTrainedTokenizerFast

    vocab = {s: i for i, s in enumerate(SPECIALS)}
    for c in chars:
        vocab.setdefault(c, len(vocab))
    t = Tokenizer(models.WordLevel(vocab, unk_token="<unk>"))
    t.pre_tokenizer = pre_tokenizers.Split(Regex("."), behavior="isolated")
    t.decoder = decoders.Fuse()
    tok = PreTrainedTokenizerFast(
        tokenizer_object=t, pad_token="<pad>", bos_token="<bos>", eos_token="<eos>", unk_token="<unk>"
    )
    tok.padding_side = "left"
    return tok


def tiny_llama(tok, *, hidden: int = 96, layers: int = 3, heads: int = 4, seed: int = 0):
    """A randomly initialised LlamaForCausalLM sized for the tokenizer (tied embeddings)."""
    from transformers import LlamaConfig, LlamaForCausalLM

    torch.manual_seed(seed)
    cfg = LlamaConfig(
        vocab_size=len(tok),
        hidden_size=hidden,
        intermediate_size=int(8 * hidden / 3) // 8 * 8,
        num_hidden_layers=layers,
        num_attention_heads=heads,
        num_key_value_heads=heads,
        max_position_embeddings=256,
        tie_word_embeddings=True,
        bos_token_id=tok.bos_token_id,
        eos_token_id=tok.eos_token_id,
        pad_token_id=tok.pad_token_id,
    )
    return LlamaForCausalLM(cfg)


def n_params(model) -> int:
    return sum(p.numel() for p in model.parameters())


def encode_pairs(tok, pairs: list[tuple[str, str]]) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    """(ids, attention mask, loss mask), right-padded: prompt + completion + EOS; the loss mask marks
    the positions whose next token is part of the completion (or its EOS)."""
    rows = []
    for prompt, completion in pairs:
        p = tok(prompt, add_special_tokens=False)["input_ids"]
        c = tok(completion, add_special_tokens=False)["input_ids"] + [tok.eos_token_id]
        rows.append((p, c))
    L = max(len(p) + len(c) for p, c in rows)
    ids = torch.full((len(rows), L), tok.pad_token_id, dtype=torch.long)
    attn = torch.zeros((len(rows), L), dtype=torch.long)
    loss = torch.zeros((len(rows), L), dtype=torch.float32)
    for i, (p, c) in enumerate(rows):
        seq = p + c
        ids[i, : len(seq)] = torch.tensor(seq)
        attn[i, : len(seq)] = 1
        loss[i, len(p) - 1 : len(seq) - 1] = 1.0  # position t predicts token t+1
    return ids, attn, loss


def pretrain(
    model,
    tok,
    pairs: list[tuple[str, str]],
    *,
    steps: int,
    batch: int = 64,
    lr: float = 3e-3,
    seed: int = 0,
    log=print,
    log_every: int = 200,
    buckets: int = 4,
) -> dict:
    """Supervised next-token training on (prompt, completion) pairs drawn with replacement.
    AdamW, linear warm-up over 5% of the steps then cosine decay. Each batch is sorted by length and
    run as `buckets` chunks, each padded only to its own longest row (short direct answers are most of
    the texts: padding them to the longest step-by-step text would triple the work). Returns the
    loss curve summary."""
    rng = random.Random(seed)
    torch.manual_seed(seed)
    model.train()
    opt = torch.optim.AdamW(model.parameters(), lr=lr, weight_decay=0.01, betas=(0.9, 0.98))
    warm = max(1, steps // 20)
    sched = torch.optim.lr_scheduler.LambdaLR(
        opt, lambda i: min(1.0, (i + 1) / warm) * 0.5 * (1 + math.cos(math.pi * min(i, steps) / steps))
    )
    t0 = time.perf_counter()
    losses = []
    for step in range(1, steps + 1):
        drawn = sorted((pairs[rng.randrange(len(pairs))] for _ in range(batch)), key=lambda p: len(p[0]) + len(p[1]))
        chunks = [drawn[i * batch // buckets : (i + 1) * batch // buckets] for i in range(buckets)]
        encoded = [encode_pairs(tok, c) for c in chunks if c]  # each chunk padded to its own length
        n_tok = sum(float(lm[:, :-1].sum()) for _, _, lm in encoded)
        total = 0.0
        for ids, attn, lmask in encoded:
            logits = model(input_ids=ids, attention_mask=attn).logits[:, :-1]  # (b, L-1, V)
            nll = torch.nn.functional.cross_entropy(
                logits.reshape(-1, logits.shape[-1]), ids[:, 1:].reshape(-1), reduction="none"
            ).view(ids.shape[0], -1)
            loss = (nll * lmask[:, :-1]).sum() / n_tok
            loss.backward()
            total += float(loss.detach())
        torch.nn.utils.clip_grad_norm_(model.parameters(), 1.0)
        opt.step()
        sched.step()
        opt.zero_grad(set_to_none=True)
        losses.append(total)
        if log_every and step % log_every == 0:
            log(f"  pre-training step {step}/{steps}: loss {sum(losses[-log_every:]) / log_every:.3f}")
    model.eval()
    k = max(1, steps // 10)
    return {
        "steps": steps,
        "loss_first": sum(losses[:k]) / k,
        "loss_last": sum(losses[-k:]) / k,
        "time_s": time.perf_counter() - t0,
    }


def save(model, tok, out: Path) -> Path:
    """A Hugging Face directory (config, safetensors weights, tokenizer) that `model=out` loads."""
    out = Path(out)
    out.mkdir(parents=True, exist_ok=True)
    model.generation_config.eos_token_id = tok.eos_token_id
    model.generation_config.pad_token_id = tok.pad_token_id
    model.save_pretrained(out, safe_serialization=True)
    tok.save_pretrained(out)
    return out

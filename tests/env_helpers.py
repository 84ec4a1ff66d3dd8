"""Helpers for tests of environments written for other trainers: a tiny model that writes scripted turns."""

from __future__ import annotations

import json
import shutil
from pathlib import Path

COUNTER_CALLS = (
    '<tool_call>{"name": "increment", "arguments": {"step": 1}}</tool_call>'
    '<tool_call>{"name": "peek", "arguments": {}}</tool_call>'
)
"""Two calls in one turn: a sync tool given an int for its float argument, then an async tool."""
MOVE_CALL = '<tool_call>{"name": "MoveAction", "arguments": {"direction": "up"}}</tool_call>'
"""A call of an OpenEnv structured action (tests/envs/openenv_style.py's MoveAction)."""
ANSWER = "done"
"""A turn without a call: the final answer of a tool trajectory; a guess for the text environments."""
TURNS = (COUNTER_CALLS, MOVE_CALL, ANSWER)


def scripted_model(
    base: Path,
    out: Path,
    turns: tuple[str, ...] = TURNS,
    *,
    chat_template: str | None = None,
    specials: tuple[str, ...] = (),
    eos_token: str | None = None,
) -> Path:
    """A copy of the tiny model (tests/conftest.py) that writes, at each turn, one of `turns`, uniformly.
    chat_template, specials, eos_token: another model family's template, the special tokens it spells
    (added to the vocabulary) and its end-of-turn token (the tokenizer's eos_token).

    Each turn is one added token whose text is the whole turn, counted as an end of turn: every block's
    output projection is zeroed, so the last hidden state is the input token's embedding, and every
    embedding gets a common component (dimension 0) that the turns' embeddings hold alone, 10 times
    larger: the turns' logits are equal and about 50 above any other token's, so each is sampled with
    probability 1/len(turns) and no other token ever is."""
    import torch
    from transformers import AutoTokenizer, LlamaForCausalLM

    shutil.copytree(base, out)
    tok = AutoTokenizer.from_pretrained(out)
    if specials:
        tok.add_special_tokens({"additional_special_tokens": list(specials)})
    if chat_template is not None:
        tok.chat_template = chat_template
    if eos_token is not None:
        tok.eos_token = eos_token
    tok.add_tokens(list(turns))
    ids = tok.convert_tokens_to_ids(list(turns))
    model = LlamaForCausalLM.from_pretrained(out)
    model.resize_token_embeddings(len(tok), mean_resizing=False)
    with torch.no_grad():
        for layer in model.model.layers:
            layer.self_attn.o_proj.weight.zero_()
            layer.mlp.down_proj.weight.zero_()
        emb = model.get_input_embeddings().weight
        emb[:, 0] = 1.0
        emb[ids] = 0.0
        emb[ids, 0] = 10.0
        model.model.norm.weight.fill_(1.0)
    model.save_pretrained(out, safe_serialization=True)
    tok.save_pretrained(out)
    gen_path = out / "generation_config.json"
    gen = json.loads(gen_path.read_text())
    first = gen["eos_token_id"] if isinstance(gen["eos_token_id"], list) else [gen["eos_token_id"]]
    gen["eos_token_id"] = first + ids
    gen_path.write_text(json.dumps(gen))
    return out

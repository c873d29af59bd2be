"""lm-evaluation-harness adapter: score looped models on lm-eval tasks.

Importing this module registers the model name `looplab` with lm-eval, so

    import looplab.evaluation.harness
    lm_eval.simple_evaluate(model="looplab",
                            model_args="checkpoint=PATH,policy=skip:0.4,batch_size=8,device=cpu",
                            tasks=["piqa"])

works, as does passing an instance (`LoopLabLM(checkpoint=PATH, policy="skip:0.4")`)
as `model=`. lm-eval has no plugin discovery for models, so the import is needed;
`evaluate_tasks` below and the `looplab lm-eval` command do it for you. `import
looplab` alone never imports lm-eval.

Model args: checkpoint (a checkpoint directory, or a LoopedLM object), policy (an
ExitPolicy or its spec: full (default: every token runs the model's R steps) |
forced:D | dense:Q | skip:Q, or a zero-shot rule of the exit-policy zoo, which needs
no trained gate: dense-entropy:T | skip-entropy:T | dense-kl:T | skip-kl:T |
dense-stable:K | skip-stable:K, e.g. `LoopLabLM(policy="skip-entropy:2.0")`; see
looplab/policy.py), batch_size,
device, max_length (default: the context the checkpoint trained with, else 2048),
tokenizer (default: the checkpoint's metadata["tokenizer"]), add_bos_token (default
true: every context starts with <bos>, as Mistral-style documents do), max_gen_toks,
precision (auto: bf16 autocast on CUDA, fp32 on CPU).

Besides log-likelihoods the adapter counts the backbone steps each real token ran:
`executed_loops` (all requests) and `executed_loops_by_task` are token-weighted
means over the non-padding tokens of every forward pass, and `evaluate_tasks` writes
each task's value beside its accuracies in the results dict, with the backbone FLOPs
per token those steps cost (`backbone_flops_per_token`: steps × one step's FLOPs at
the row's length) and the model's time on the task (`model_seconds`: each forward's
time split over its rows by their tokens, since one batch mixes tasks).
"""

from __future__ import annotations

import os
import time
from collections import defaultdict
from dataclasses import dataclass
from typing import Any

# lm-eval fills its table of built-in model names only when the table is empty at the
# first lookup; import that table first so registering `looplab` never hides them.
import lm_eval.models  # noqa: F401
import torch
from lm_eval.api.model import TemplateLM
from lm_eval.api.registry import model_registry
from lm_eval.models.utils import Collator
from lm_eval.utils import get_rolling_token_windows, make_disjoint_window
from tqdm import tqdm

from looplab.config import ConfigError
from looplab.devices import resolve_device
from looplab.policy import ExitPolicy
from looplab.tracking import BACKBONE_FLOPS, EXECUTED_LOOPS

MODEL_NAME = "looplab"
DEFAULT_MAX_LENGTH = 2048
DEFAULT_MAX_GEN_TOKS = 256


@dataclass
class LoopTally:
    """Token-weighted sums of executed backbone steps, their FLOPs, and model time."""

    step_tokens: float = 0.0  # Σ over real tokens of the steps each one ran
    tokens: int = 0
    flops: float = 0.0  # Σ over real tokens of the backbone FLOPs their steps cost
    seconds: float = 0.0  # model time, each forward's split over its rows by their tokens

    def add(self, step_tokens: float, tokens: int, flops: float = 0.0, seconds: float = 0.0) -> None:
        self.step_tokens += float(step_tokens)
        self.tokens += int(tokens)
        self.flops += float(flops)
        self.seconds += float(seconds)

    @property
    def mean(self) -> float | None:
        return self.step_tokens / self.tokens if self.tokens else None

    @property
    def flops_per_token(self) -> float | None:
        return self.flops / self.tokens if self.tokens else None


def _as_int(name: str, value: Any, minimum: int = 1) -> int:
    text = str(value).strip()
    if isinstance(value, bool) or not text.lstrip("-").isdigit() or int(text) < minimum:
        raise ConfigError(f"{name}={value!r} is invalid; allowed: an integer >= {minimum}")
    return int(text)


class LoopLabLM(TemplateLM):
    """A LoopedLM behind lm-eval's TemplateLM interface (see the module docstring)."""

    def __init__(
        self,
        checkpoint=None,
        policy: ExitPolicy | str = "full",
        batch_size: int | str = 8,
        device: str | None = "auto",
        max_length: int | None = None,
        tokenizer=None,
        add_bos_token: bool = True,
        max_gen_toks: int = DEFAULT_MAX_GEN_TOKS,
        precision: str = "auto",
        max_batch_size: int | None = None,
    ):
        # max_batch_size: lm-eval passes it to every model; there is no auto batch size here.
        super().__init__()
        from looplab.models.looped import LoopedLM

        if checkpoint is None:
            raise ConfigError("checkpoint=None is invalid; allowed: a looplab checkpoint directory or a LoopedLM")
        if isinstance(checkpoint, LoopedLM):
            self.model, self.checkpoint = checkpoint, None
        else:
            from looplab.checkpoint import is_checkpoint, load_model

            if not is_checkpoint(checkpoint):
                raise ConfigError(
                    f"checkpoint={str(checkpoint)!r} is not a looplab checkpoint directory "
                    "(needs config.json and model.safetensors)"
                )
            self.model, self.checkpoint = load_model(checkpoint), str(checkpoint)
        self.n_loops = self.model.cfg.n_loops
        self.policy = policy if isinstance(policy, ExitPolicy) else ExitPolicy.parse(policy)
        self.policy.check(self.n_loops)
        if precision not in ("auto", "fp32", "bf16"):
            raise ConfigError(f"precision={precision!r} is invalid; allowed: auto | fp32 | bf16")
        self.precision = precision
        self.batch_size = _as_int("batch_size", batch_size)
        self.max_gen_toks = _as_int("max_gen_toks", max_gen_toks)
        self._max_length = _as_int("max_length", max_length) if max_length is not None else self._trained_context()
        self.add_bos_token = bool(add_bos_token)
        self._device = resolve_device(device)
        self.model.to(self._device).eval()
        self.tokenizer = self._load_tokenizer(tokenizer)
        self._pad_id = self.tokenizer.pad_id if self.tokenizer.pad_id is not None else self.tokenizer.eos_id
        self.reset_loop_tally()
        self._flops_cache: dict[int, int] = {}
        self._request_tasks: list[str | None] | None = None

    # ---- configuration ---------------------------------------------------------
    def _trained_context(self) -> int:
        train = (self.model.metadata.get("experiment") or {}).get("train") or {}
        return int(train.get("seq_len") or DEFAULT_MAX_LENGTH)

    def _load_tokenizer(self, spec):
        spec = spec if spec is not None else self.model.metadata.get("tokenizer")
        if spec is None:
            raise ConfigError(
                f"checkpoint={self.checkpoint!r} carries no metadata['tokenizer']; allowed: name "
                "the tokenizer it was trained with (looplab lm-eval --tokenizer NAME; model arg "
                "tokenizer=NAME): mistral | bytes | an HF tokenizer name"
            )
        if isinstance(spec, str):
            from looplab.tasks.tokenizer import load_tokenizer

            spec = load_tokenizer(spec)
        if spec.vocab_size > self.model.cfg.vocab_size:
            raise ConfigError(
                f"tokenizer vocab_size={spec.vocab_size} exceeds the model's vocab_size="
                f"{self.model.cfg.vocab_size}; allowed: the tokenizer the model was trained with"
            )
        return spec

    def get_model_info(self) -> dict[str, Any]:
        """Merged by lm-eval into results["config"] after the run, so a plain
        simple_evaluate(model="looplab", ...) also carries the executed loops."""
        return {
            "checkpoint": self.checkpoint,
            "policy": self.policy.spec,
            "n_loops": self.n_loops,
            "max_length": self.max_length,
            "tokenizer": self.tokenizer_name,
            "add_bos_token": self.add_bos_token,
            EXECUTED_LOOPS: self.executed_loops,
            "executed_loops_by_task": self.executed_loops_by_task,
        }

    # ---- TemplateLM interface -----------------------------------------------------
    @property
    def eot_token_id(self) -> int:
        return self.tokenizer.eos_id

    @property
    def prefix_token_id(self) -> int:
        # What an empty context is conditioned on: the token every context starts with.
        bos = self.tokenizer.bos_id
        return bos if self.add_bos_token and bos is not None else self.eot_token_id

    @property
    def max_length(self) -> int:
        return self._max_length

    @property
    def tokenizer_name(self) -> str:
        return str(getattr(self.tokenizer, "spec", type(self.tokenizer).__name__))

    def tok_encode(
        self, string: str, add_special_tokens: bool | None = None, left_truncate_len: int | None = None, **kwargs
    ) -> list[int]:
        ids = list(self.tokenizer.encode(string))
        add_bos = self.add_bos_token if add_special_tokens is None else add_special_tokens
        if add_bos and self.tokenizer.bos_id is not None:
            ids = [self.tokenizer.bos_id] + ids
        if left_truncate_len:
            ids = ids[-left_truncate_len:]
        return ids

    def tok_decode(self, ids: list[int]) -> str:
        return self.tokenizer.decode(list(ids))

    def loglikelihood(self, requests, disable_tqdm: bool = False):
        # Remember which task each request belongs to: lm-eval sends every task's
        # requests in one call, and the loop counts are reported per task.
        self._request_tasks = [getattr(r, "task_name", None) for r in requests]
        try:
            return super().loglikelihood(requests, disable_tqdm=disable_tqdm)
        finally:
            self._request_tasks = None

    def _loglikelihood_tokens(self, requests, disable_tqdm: bool = False, **kwargs) -> list[tuple[float, bool]]:
        tasks = self._request_tasks
        if tasks is None or len(tasks) != len(requests):
            tasks = [None] * len(requests)
        results = self._score([(ctx, cont) for _, ctx, cont in requests], tasks, disable_tqdm)
        for (strings, _, _), result in zip(requests, results):
            if strings is not None and strings[0] is not None:
                self.cache_hook.add_partial("loglikelihood", strings, result)
        return results

    def loglikelihood_rolling(self, requests, disable_tqdm: bool = False) -> list[float]:
        """Log-likelihood of whole texts, scored in disjoint windows of max_length
        tokens (each window conditions on the previous tokens that still fit)."""
        pairs, owners, tasks = [], [], []
        for i, request in enumerate(requests):
            (text,) = request.args
            tokens = self.tok_encode(text, add_special_tokens=False)
            windows = get_rolling_token_windows(
                tokens, prefix_token=self.prefix_token_id, max_seq_len=self.max_length, context_len=1
            )
            for context, continuation in map(make_disjoint_window, windows):
                pairs.append((context, continuation))
                owners.append(i)
                tasks.append(getattr(request, "task_name", None))
        totals = [0.0] * len(requests)
        for i, (logprob, _) in zip(owners, self._score(pairs, tasks, disable_tqdm)):
            totals[i] += logprob
        for request, total in zip(requests, totals):
            self.cache_hook.add_partial("loglikelihood_rolling", request.args, total)
        return totals

    def generate_until(self, requests, disable_tqdm: bool = False) -> list[str]:
        """Greedy decoding until a stop string, <eos> or max_gen_toks, a batch of
        contexts at a time: prefilled once into the per-(loop, layer) cache, then
        continued token by token under the adapter's policy (looplab/inference/generate.py)."""
        items = []
        for request in requests:
            context, gen_kwargs = request.args
            until, max_new = self._generation_limits(gen_kwargs)
            keep = max(1, self.max_length - max_new)  # room for the continuation
            ids = self.tok_encode(context)[-keep:] or [self.prefix_token_id]  # an empty context conditions on it
            items.append((ids, until, max_new, getattr(request, "task_name", None)))
        collator = Collator(items, sort_fn=lambda item: (-len(item[0]), tuple(item[0])))
        outputs = []
        progress = tqdm(total=len(items), disable=disable_tqdm, desc="looplab generate_until")
        for batch in collator.get_batched(n=self.batch_size):
            outputs.extend(self._generate_batch(batch))
            progress.update(len(batch))
        progress.close()
        texts = collator.get_original(outputs)
        for request, text in zip(requests, texts):
            self.cache_hook.add_partial("generate_until", request.args, text)
        return texts

    # ---- executed loops --------------------------------------------------------------
    def reset_loop_tally(self) -> None:
        self._tally = LoopTally()
        self._tally_by_task: dict[str | None, LoopTally] = defaultdict(LoopTally)

    @property
    def executed_loops(self) -> float | None:
        """Mean backbone steps per real token over every request since the last reset."""
        return self._tally.mean

    @property
    def executed_loops_by_task(self) -> dict[str, float]:
        return {
            task: mean
            for task, tally in self._tally_by_task.items()
            if task is not None and (mean := tally.mean) is not None
        }  # mean: None before any token

    def loop_tallies(self) -> dict[str | None, LoopTally]:
        """Per-task step-token sums (None: requests that came without a task),
        for aggregating groups of tasks."""
        return dict(self._tally_by_task)

    # ---- model passes -------------------------------------------------------------
    @torch.no_grad()
    def _forward(self, rows: list[list[int]], tasks: list[str | None]) -> torch.Tensor:
        """Logits (B, L, V) of a right-padded batch. Right padding leaves the real
        positions untouched (the models are causal) and `mask` keeps the padding
        out of the executed-loops means."""
        from looplab.devices import autocast_context

        width = max(len(r) for r in rows)
        ids = torch.full((len(rows), width), self._pad_id, dtype=torch.long)
        mask = torch.zeros(len(rows), width, dtype=torch.bool)
        for i, row in enumerate(rows):
            ids[i, : len(row)] = torch.tensor(row, dtype=torch.long)
            mask[i, : len(row)] = True
        ids, mask = ids.to(self._device), mask.to(self._device)
        start = time.perf_counter()
        with autocast_context(self._device, self.precision):
            out = self.model(ids, self.policy, mask=mask)
        if self._device.type == "cuda":  # kernels run asynchronously: time them, not their launch
            torch.cuda.synchronize(self._device)
        seconds = time.perf_counter() - start
        real = int(mask.sum())
        self._tally.add(out.executed_loops * real, real)
        # Dense runs every token through all R steps (its gate or zoo rule only picks
        # the readout), so its exit steps are not what ran.
        fixed = self.policy.loops_run(self.n_loops)
        steps = out.exit_step if fixed is None else torch.full_like(out.exit_step, fixed)
        per_row = (steps * mask).sum(dim=1).tolist()
        total_flops = 0.0
        for row, task, step_tokens in zip(rows, tasks, per_row):
            flops = step_tokens * self._step_flops(len(row))
            total_flops += flops
            self._tally_by_task[task].add(step_tokens, len(row), flops, seconds * len(row) / real)
        self._tally.add(out.executed_loops * real, real, total_flops, seconds)
        return out.logits

    def _step_flops(self, length: int) -> int:
        """FLOPs per token of one backbone step at this context length (cached: rows repeat lengths)."""
        if length not in self._flops_cache:
            self._flops_cache[length] = self.model.step_flops(length)
        return self._flops_cache[length]

    def _score(
        self, pairs: list[tuple[list[int], list[int]]], tasks: list[str | None], disable_tqdm: bool = True
    ) -> list[tuple[float, bool]]:
        """(sum of the continuation's log-probs, whether greedy decoding yields it)
        for each (context ids, continuation ids); contexts are left-truncated so
        context + continuation fit in max_length + 1 tokens."""
        items = []
        for index, ((context, continuation), task) in enumerate(zip(pairs, tasks)):
            if len(continuation) > self.max_length:
                raise ConfigError(
                    f"continuation of {len(continuation)} tokens is too long; allowed: at most "
                    f"max_length={self.max_length}"
                )
            if not continuation:
                continue
            # The last token is only predicted, never read.
            inputs = (list(context) + list(continuation))[-(self.max_length + 1) :][:-1]
            items.append((index, inputs, list(continuation), task))
        # Longest first: the largest batch runs first and padding stays small.
        collator = Collator(items, sort_fn=lambda item: (-len(item[1]), tuple(item[1])))
        scored: list[tuple[float, bool]] = []
        batches = collator.get_batched(n=self.batch_size)
        for batch in tqdm(batches, disable=disable_tqdm, desc="looplab loglikelihood"):
            logits = self._forward([item[1] for item in batch], [item[3] for item in batch])
            for row, (_, inputs, continuation, _) in enumerate(batch):
                n, end = len(continuation), len(inputs)
                logprobs = torch.log_softmax(logits[row, end - n : end].float(), dim=-1)
                target = torch.tensor(continuation, device=logprobs.device)
                total = logprobs.gather(-1, target[:, None]).sum()
                scored.append((float(total), bool((logprobs.argmax(dim=-1) == target).all())))
        results: list[tuple[float, bool]] = [(0.0, True)] * len(pairs)  # an empty continuation is certain
        for (index, *_), result in zip(items, collator.get_original(scored)):
            results[index] = result
        return results

    def _generation_limits(self, gen_kwargs: dict) -> tuple[list[str], int]:
        gen_kwargs = dict(gen_kwargs or {})
        if gen_kwargs.get("do_sample"):
            raise ConfigError("do_sample=True is not supported; allowed: greedy decoding (do_sample false)")
        until = gen_kwargs.get("until") or []
        until = [until] if isinstance(until, str) else list(until)
        max_new = _as_int("max_gen_toks", gen_kwargs.get("max_gen_toks", self.max_gen_toks))
        return until, max_new

    def _generate_batch(self, batch) -> list[str]:
        """Continuations of (context ids, stop strings, max new tokens, task) items;
        every position the model ran counts towards the executed loops."""
        from looplab.devices import autocast_context
        from looplab.inference.generate import generate

        with torch.no_grad(), autocast_context(self._device, self.precision):
            out = generate(
                self.model,
                [item[0] for item in batch],
                [item[2] for item in batch],
                self.policy,
                eos_id=self.eot_token_id,
                stop=[item[1] for item in batch],
                decode=self.tok_decode,
            )
        for item, tokens, loops in zip(batch, out.ran_tokens, out.ran_loops):
            self._tally.add(loops, tokens)
            self._tally_by_task[item[3]].add(loops, tokens)
        assert out.texts is not None  # generate decodes when given decode=
        return out.texts


if MODEL_NAME not in model_registry:  # a re-import (importlib.reload) keeps the first class
    model_registry.register(MODEL_NAME)(LoopLabLM)


# ---- running tasks -----------------------------------------------------------------
def make_lm(checkpoint_or_model, **model_args) -> LoopLabLM:
    """A LoopLabLM from a checkpoint path, a LoopedLM, or an existing LoopLabLM
    (returned as is; then model_args must be empty)."""
    if isinstance(checkpoint_or_model, LoopLabLM):
        if any(v is not None for v in model_args.values()):
            raise ConfigError(
                f"model args {sorted(model_args)} cannot change an existing LoopLabLM; "
                "allowed: pass a checkpoint path or a LoopedLM instead"
            )
        return checkpoint_or_model
    return LoopLabLM(checkpoint=checkpoint_or_model, **{k: v for k, v in model_args.items() if v is not None})


def make_task_manager(include_path: str | os.PathLike | None = None, needed=()):
    """A TaskManager that indexes only include_path when it holds every needed task
    name (instant; config dicts and Task objects need no index), else lm-eval's
    built-in tasks as well (~7 s)."""
    from lm_eval.tasks import TaskManager

    paths = str(include_path) if include_path is not None else None
    manager = TaskManager(include_path=paths, include_defaults=False)
    if all(name in manager.all_tasks for name in needed):
        return manager
    return TaskManager(include_path=paths)


def evaluate_tasks(
    checkpoint_or_model,
    tasks: list,
    *,
    include_path: str | os.PathLike | None = None,
    limit: int | float | None = None,
    num_fewshot: int | None = None,
    manager=None,
    log_samples: bool = False,
    bootstrap_iters: int = 100_000,
    **model_args,
) -> dict[str, Any]:
    """Run lm-eval's simple_evaluate on `tasks` (names, config dicts or Task
    objects) and put each task's (and group's) executed loops beside its metrics,
    as results["results"][name]["executed_loops"]. model_args go to LoopLabLM
    (policy, batch_size, device, ...). bootstrap_iters is lm-eval's default;
    accuracies' standard errors are closed-form and cost nothing."""
    import lm_eval

    lm = make_lm(checkpoint_or_model, **model_args)
    if manager is None:
        manager = make_task_manager(include_path, [t for t in tasks if isinstance(t, str)])
    lm.reset_loop_tally()
    results = lm_eval.simple_evaluate(
        model=lm,
        tasks=list(tasks),
        limit=limit,
        num_fewshot=num_fewshot,
        task_manager=manager,
        log_samples=log_samples,
        bootstrap_iters=bootstrap_iters,
    )
    if results is None:  # non-zero ranks of a distributed run
        return {}
    attach_executed_loops(results, lm)
    return results


def attach_executed_loops(results: dict[str, Any], lm: LoopLabLM) -> None:
    """results["results"][task]["executed_loops"], ["backbone_flops_per_token"] and
    ["model_seconds"] for every task and group, and results["executed_loops"] over all
    requests."""
    tallies = lm.loop_tallies()
    for name, row in results.get("results", {}).items():
        members = results.get("group_subtasks", {}).get(name) or [name]
        total = LoopTally()
        for member in _leaves(members, results):
            if member in tallies:
                t = tallies[member]
                total.add(t.step_tokens, t.tokens, t.flops, t.seconds)
        row[EXECUTED_LOOPS] = total.mean
        row[BACKBONE_FLOPS] = total.flops_per_token
        row["model_seconds"] = total.seconds if total.tokens else None
    results[EXECUTED_LOOPS] = lm.executed_loops


def _leaves(names: list[str], results: dict[str, Any]) -> list[str]:
    groups = results.get("group_subtasks", {})
    out = []
    for name in names:
        out.extend(_leaves(groups[name], results) if groups.get(name) and name not in groups[name] else [name])
    return out

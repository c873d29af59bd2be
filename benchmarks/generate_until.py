"""lm-eval's generate_until: cached decoding (the adapter, looplab/inference/generate.py) against
the uncached implementation it replaced, which re-ran the whole right-padded batch
for every new token. Same requests, same greedy outputs (checked), side by side in
one process, alternating, after a warm-up; median of repeats.

    python benchmarks/generate_until.py                      # trains `debug` for 100 steps first (~30 s)
    python benchmarks/generate_until.py --checkpoint runs/debug/checkpoint --prompt-len 512 --new-tokens 64

The requests are `--requests` contexts of `--prompt-len` tokens cut from the
checkpoint task's held-out text, with no stop strings, so each row generates up to
`--new-tokens` tokens (fewer if it emits <eos>, identically in both paths).
"""

from __future__ import annotations

import json
import statistics
import tempfile
import time
from dataclasses import dataclass

import torch

from looplab.arguments import Parser, add_flags, at_least, flag, flags_of
from looplab.cli.shared_flags import policy_type


def uncached_generate_batch(lm, batch) -> list[str]:
    """The reference: generate_until's former body. For every new token, the whole
    right-padded batch of (context + generated so far) runs through the model again."""
    sequences = [list(context) for context, *_ in batch]
    generated: list[list[int]] = [[] for _ in batch]
    done = [False] * len(batch)
    texts = [""] * len(batch)
    for _ in range(max(item[2] for item in batch)):
        live = [i for i in range(len(batch)) if not done[i]]
        if not live:
            break
        rows = [(sequences[i] + generated[i])[-lm.max_length :] for i in live]
        logits = lm._forward(rows, [batch[i][3] for i in live])
        for slot, i in enumerate(live):
            token = int(logits[slot, len(rows[slot]) - 1].argmax())
            until, max_new = batch[i][1], batch[i][2]
            if token == lm.eot_token_id:
                done[i] = True
                continue
            generated[i].append(token)
            texts[i] = lm.tok_decode(generated[i])
            if any(stop in texts[i] for stop in until) or len(generated[i]) >= max_new:
                done[i] = True
    cut = []
    for text, item in zip(texts, batch):
        stops = [text.index(s) for s in item[1] if s and s in text]
        cut.append(text[: min(stops)] if stops else text)
    return cut


def uncached_generate_until(lm, requests) -> list[str]:
    """generate_until's request handling (batches of the same order) around the reference."""
    from lm_eval.models.utils import Collator

    items = []
    for request in requests:
        context, gen_kwargs = request.args
        until, max_new = lm._generation_limits(gen_kwargs)
        keep = max(1, lm.max_length - max_new)
        items.append((lm.tok_encode(context)[-keep:], until, max_new, None))
    collator = Collator(items, sort_fn=lambda item: (-len(item[0]), tuple(item[0])))
    outputs = []
    for batch in collator.get_batched(n=lm.batch_size):
        outputs.extend(uncached_generate_batch(lm, batch))
    return collator.get_original(outputs)


def trained_checkpoint(steps: int, out: str) -> str:
    from looplab.presets import get_preset, stage_config
    from looplab.training.train import train

    cfg = stage_config(get_preset("debug"), "pretrain", overrides={"train.steps": steps, "train.eval_every": 0})
    return str(train(cfg, out, quiet=True).out_dir / "checkpoint")


def policy_spec(text: str) -> str:
    """An argparse type: an exit policy's text, checked (looplab/cli/shared_flags.py policy_type)."""
    return policy_type(text).spec


@dataclass(frozen=True)
class Options:
    """The benchmark's flags (looplab/arguments.py flag)."""

    checkpoint: str = flag("", "a trained checkpoint (default: train `debug` briefly)")
    train_steps: int = flag(100, "steps of that brief training", type=at_least(1))
    prompt_len: int = flag(512, "tokens of each request's context", type=at_least(1))
    new_tokens: int = flag(64, "tokens each request generates at most", type=at_least(1))
    requests: int = flag(8, "requests", type=at_least(1))
    batch_size: int = flag(8, "the adapter's batch size", type=at_least(1))
    policy: str = flag("full", "exit policy, e.g. skip:0.4", type=policy_spec)
    repeats: int = flag(3, "timed runs of each path, after one warm-up", type=at_least(1))
    threads: int = flag(0, "torch threads (0: torch's default)", type=at_least(0))
    json: str = flag("", "also write the record here")


def main(argv=None) -> int:
    parser = Parser(description=__doc__.splitlines()[0])
    add_flags(parser, Options)
    opts = flags_of(Options, parser.parse_args(argv))
    if opts.threads:
        torch.set_num_threads(opts.threads)

    import os

    os.environ.setdefault("HF_HUB_OFFLINE", "1")
    os.environ.setdefault("HF_DATASETS_OFFLINE", "1")
    from lm_eval.api.instance import Instance

    from looplab.config import ExperimentConfig
    from looplab.evaluation.harness import LoopLabLM
    from looplab.tasks import make_task
    from looplab.tasks.base import heldout_ids

    with tempfile.TemporaryDirectory() as tmp:
        checkpoint = opts.checkpoint or trained_checkpoint(opts.train_steps, tmp)
        lm = LoopLabLM(
            checkpoint=checkpoint,
            policy=opts.policy,
            batch_size=opts.batch_size,
            device="cpu",
            max_length=opts.prompt_len + opts.new_tokens + 1,
        )
    experiment = lm.model.metadata.get("experiment")
    task = make_task(ExperimentConfig.from_dict(experiment).task, opts.prompt_len) if experiment else None
    ids = heldout_ids(lm.model, task, opts.requests, 4 * opts.prompt_len)
    contexts = []
    for row in ids.tolist():  # text that encodes to at least prompt_len tokens, cut to exactly that
        tokens = lm.tok_encode(lm.tok_decode(row), add_special_tokens=False)[: opts.prompt_len - 1]
        contexts.append(lm.tok_decode(tokens))
    requests = [
        Instance("generate_until", doc={}, arguments=(c, {"until": [], "max_gen_toks": opts.new_tokens}), idx=i)
        for i, c in enumerate(contexts)
    ]

    runs = {
        "cached": lambda: lm.generate_until(requests, disable_tqdm=True),
        "uncached": lambda: uncached_generate_until(lm, requests),
    }
    outputs = {name: fn() for name, fn in runs.items()}  # warm-up, and the outputs to compare
    same = outputs["cached"] == outputs["uncached"]
    times: dict[str, list[float]] = {name: [] for name in runs}
    for _ in range(opts.repeats):
        for name, fn in runs.items():  # alternate: background load hits both alike
            start = time.perf_counter()
            fn()
            times[name].append(time.perf_counter() - start)
    median = {name: statistics.median(t) for name, t in times.items()}
    prompt_tokens = [len(lm.tok_encode(c)) for c in contexts]
    record = {
        "checkpoint": checkpoint if opts.checkpoint else f"debug, {opts.train_steps} steps",
        "policy": opts.policy,
        "requests": opts.requests,
        "batch_size": opts.batch_size,
        "prompt_tokens": statistics.mean(prompt_tokens),
        "new_tokens": opts.new_tokens,
        "generated_tokens": sum(len(lm.tok_encode(t, add_special_tokens=False)) for t in outputs["cached"]),
        "same_outputs": same,
        "time_cached_s": median["cached"],
        "time_uncached_s": median["uncached"],
        "speedup": median["uncached"] / median["cached"],
        "threads": torch.get_num_threads(),
    }
    print(
        f"generate_until, {opts.requests} requests of {record['prompt_tokens']:.0f} prompt tokens, "
        f"{opts.new_tokens} new tokens, batch {opts.batch_size}, policy {opts.policy}:"
    )
    print(
        f"  uncached {median['uncached']:.2f} s   cached {median['cached']:.2f} s   speedup {record['speedup']:.1f}x"
        f"   same greedy outputs: {same}"
    )
    print(json.dumps(record))
    if opts.json:
        with open(opts.json, "w") as f:
            json.dump(record, f, indent=2)
    return 0 if same else 1


if __name__ == "__main__":
    raise SystemExit(main())

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

import argparse
import json
import statistics
import tempfile
import time

import torch


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


def main(argv=None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--checkpoint", default="", help="a trained checkpoint (default: train `debug` briefly)")
    parser.add_argument("--train-steps", type=int, default=100)
    parser.add_argument("--prompt-len", type=int, default=512)
    parser.add_argument("--new-tokens", type=int, default=64)
    parser.add_argument("--requests", type=int, default=8)
    parser.add_argument("--batch-size", type=int, default=8)
    parser.add_argument("--policy", default="full")
    parser.add_argument("--repeats", type=int, default=3)
    parser.add_argument("--threads", type=int, default=0, help="torch threads (0: torch's default)")
    parser.add_argument("--json", default="")
    args = parser.parse_args(argv)
    if args.threads:
        torch.set_num_threads(args.threads)

    import os

    os.environ.setdefault("HF_HUB_OFFLINE", "1")
    os.environ.setdefault("HF_DATASETS_OFFLINE", "1")
    from lm_eval.api.instance import Instance

    from looplab.config import ExperimentConfig
    from looplab.evaluation.harness import LoopLabLM
    from looplab.tasks import make_task
    from looplab.tasks.base import heldout_ids

    with tempfile.TemporaryDirectory() as tmp:
        checkpoint = args.checkpoint or trained_checkpoint(args.train_steps, tmp)
        lm = LoopLabLM(
            checkpoint=checkpoint,
            policy=args.policy,
            batch_size=args.batch_size,
            device="cpu",
            max_length=args.prompt_len + args.new_tokens + 1,
        )
    experiment = lm.model.metadata.get("experiment")
    task = make_task(ExperimentConfig.from_dict(experiment).task, args.prompt_len) if experiment else None
    ids = heldout_ids(lm.model, task, args.requests, 4 * args.prompt_len)
    contexts = []
    for row in ids.tolist():  # text that encodes to at least prompt_len tokens, cut to exactly that
        tokens = lm.tok_encode(lm.tok_decode(row), add_special_tokens=False)[: args.prompt_len - 1]
        contexts.append(lm.tok_decode(tokens))
    requests = [
        Instance("generate_until", doc={}, arguments=(c, {"until": [], "max_gen_toks": args.new_tokens}), idx=i)
        for i, c in enumerate(contexts)
    ]

    runs = {
        "cached": lambda: lm.generate_until(requests, disable_tqdm=True),
        "uncached": lambda: uncached_generate_until(lm, requests),
    }
    outputs = {name: fn() for name, fn in runs.items()}  # warm-up, and the outputs to compare
    same = outputs["cached"] == outputs["uncached"]
    times: dict[str, list[float]] = {name: [] for name in runs}
    for _ in range(args.repeats):
        for name, fn in runs.items():  # alternate: background load hits both alike
            start = time.perf_counter()
            fn()
            times[name].append(time.perf_counter() - start)
    median = {name: statistics.median(t) for name, t in times.items()}
    prompt_tokens = [len(lm.tok_encode(c)) for c in contexts]
    record = {
        "checkpoint": checkpoint if args.checkpoint else f"debug, {args.train_steps} steps",
        "policy": args.policy,
        "requests": args.requests,
        "batch_size": args.batch_size,
        "prompt_tokens": statistics.mean(prompt_tokens),
        "new_tokens": args.new_tokens,
        "generated_tokens": sum(len(lm.tok_encode(t, add_special_tokens=False)) for t in outputs["cached"]),
        "same_outputs": same,
        "time_cached_s": median["cached"],
        "time_uncached_s": median["uncached"],
        "speedup": median["uncached"] / median["cached"],
        "threads": torch.get_num_threads(),
    }
    print(
        f"generate_until, {args.requests} requests of {record['prompt_tokens']:.0f} prompt tokens, "
        f"{args.new_tokens} new tokens, batch {args.batch_size}, policy {args.policy}:"
    )
    print(
        f"  uncached {median['uncached']:.2f} s   cached {median['cached']:.2f} s   speedup {record['speedup']:.1f}x"
        f"   same greedy outputs: {same}"
    )
    print(json.dumps(record))
    if args.json:
        with open(args.json, "w") as f:
            json.dump(record, f, indent=2)
    return 0 if same else 1


if __name__ == "__main__":
    raise SystemExit(main())

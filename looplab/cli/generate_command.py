"""`looplab generate`: a prompt continued from a checkpoint, with the loops behind
each new token."""

from __future__ import annotations

import json
import sys
from dataclasses import dataclass
from typing import Literal

from looplab.arguments import at_least, flag, number_in
from looplab.cli.inputs import check_checkpoint, compile_decoding
from looplab.cli.shared_flags import COMPILE_HELP, Compile, CompileSetting, Device, Threads, command, policy_type
from looplab.config import ConfigError
from looplab.policy import ExitPolicy

SUPERSCRIPT = str.maketrans("0123456789", "⁰¹²³⁴⁵⁶⁷⁸⁹")


def depth_display(pieces: list[str], loops: list[int], width: int = 96) -> str:
    """Each token's text followed by the loops that produced it as a superscript
    (`␣the² ␣cat⁴`), wrapped at `width` characters; spaces show as ␣ and control
    characters escaped, so token boundaries stay visible."""
    lines, line = [], ""
    for piece, n in zip(pieces, loops):
        text = "".join("␣" if c == " " else c if c.isprintable() else repr(c)[1:-1] for c in piece)
        cell = text + str(n).translate(SUPERSCRIPT)
        if line and len(line) + 1 + len(cell) > width:
            lines.append(line)
            line = ""
        line += (" " if line else "") + cell
    return "\n".join(lines + [line])


def untrained_gate_note(model, policy) -> str | None:
    """Why a gate-driven policy's exits may mean nothing: no stage of the checkpoint's
    lineage trained its exit gate (a pre-trained model's gate is its initialisation).
    None when the policy does not read the gate or a gated stage trained it."""
    from looplab.policy import EXIT_RULES, GATE_LOGITS
    from looplab.stages import DEFAULT_STAGE, STAGES

    if policy.rule not in EXIT_RULES or EXIT_RULES[policy.rule].reads != GATE_LOGITS:
        return None
    lineage = model.metadata.get("lineage") or [model.metadata.get("stage", DEFAULT_STAGE)]
    if any(stage in STAGES and STAGES[stage].gated for stage in lineage):
        return None
    return (
        f"note: --policy {policy.spec} exits where the exit gate says, and no stage of this checkpoint trained "
        f"the gate (lineage: {' -> '.join(lineage)}): its exits follow the gate's initial weights, not the "
        "tokens; train Stage-1 on it (looplab train --stage stage1 --init CHECKPOINT), or choose forced:D or a "
        "rule that reads the logits (skip-entropy:T)"
    )


@dataclass(frozen=True)
class Generate:
    """continue a prompt from a checkpoint; print the loops behind each token

    `looplab generate`'s flags (with Threads' and EagerCompile's)."""

    checkpoint: str = flag()
    prompt: str = flag()
    policy: ExitPolicy = flag(
        ExitPolicy.parse("full"),
        "exit policy: full | forced:D | dense:Q | skip:Q | the zoo's skip-entropy:T, ... (default full)",
        type=policy_type,
    )
    max_new_tokens: int = flag(64, type=at_least(1))
    temperature: float = flag(0.0, "0: greedy (default)", type=number_in(0.0))
    top_k: int = flag(0, "0: no limit", type=at_least(0))
    top_p: float = flag(1.0, type=number_in(0.0, 1.0, low_open=True))
    seed: int | None = flag(None, type=at_least(0))
    stop: list[str] = flag(help="stop string (repeatable)", repeat=True)
    attention_fill: Literal["hole", "exit_state"] = flag(
        "hole", "what exited tokens leave in deeper attention layers (hybrid/transformer)"
    )
    tokenizer: str = flag("", "default: the checkpoint's")
    no_bos: bool = flag(False, "do not start the prompt with <bos>")
    json: bool = flag(False, "print one JSON record instead")


@dataclass(frozen=True)
class EagerCompile(Compile):
    """Compile with --compile off by default: generate decodes with the eager step unless asked."""

    compile: CompileSetting = flag("off", COMPILE_HELP)


def add_generate(sub) -> None:
    command(sub, "generate", cmd_generate, Generate, Device, Threads, EagerCompile)


def cmd_generate(args) -> int:
    """Continue a prompt from a checkpoint under an exit policy; print the text and the
    loops behind every new token."""
    import torch

    from looplab.checkpoint import load_model
    from looplab.costs.machine import check_decoding, check_new_tokens
    from looplab.devices import resolve_device
    from looplab.inference.generate import generate

    check_new_tokens("--max-new-tokens", args.max_new_tokens)  # a count no model makes sensible: before loading one
    check_checkpoint(args.checkpoint)
    model = load_model(args.checkpoint)
    policy = args.policy
    try:
        policy.check(model.cfg.n_loops)
    except ConfigError as e:
        raise e.renamed("--policy", policy.spec) from None
    tok, prompt = _tokenized_prompt(args, model)
    device = resolve_device(args.device)
    check_decoding(model.cfg, 1, len(prompt), args.max_new_tokens, "--max-new-tokens", args.max_new_tokens, device)
    note = untrained_gate_note(model, policy)
    if note:
        print(note, file=sys.stderr)
    model = compile_decoding(model.to(device).eval(), args.compile)
    with torch.no_grad():
        out = generate(
            model,
            [prompt],
            args.max_new_tokens,
            policy,
            temperature=args.temperature,
            top_k=args.top_k,
            top_p=args.top_p,
            seed=args.seed,
            eos_id=tok.eos_id,
            stop=args.stop or None,
            decode=tok.decode,
            attention_fill=args.attention_fill,
        )
    _show_generation(args, model.cfg.n_loops, out, tok, note)
    return 0


def _tokenized_prompt(args, model):
    """The tokenizer (--tokenizer, else the checkpoint's) and --prompt's ids, <bos>
    first unless --no-bos: a prompt that is not empty and fits the model's vocabulary."""
    from looplab.tasks.tokenizer import load_tokenizer

    spec = args.tokenizer or model.metadata.get("tokenizer")
    if not spec:
        raise ConfigError(
            f"--checkpoint={args.checkpoint!r} carries no metadata['tokenizer']; allowed: "
            "--tokenizer mistral | bytes | an HF tokenizer name"
        )
    tok = load_tokenizer(spec)
    prompt = ([tok.bos_id] if tok.bos_id is not None and not args.no_bos else []) + tok.encode(args.prompt)
    if not prompt:
        raise ConfigError("--prompt is empty; allowed: some text (or drop --no-bos)")
    top = max(prompt)
    if top >= model.cfg.vocab_size:  # an id past the model's embedding: another tokenizer's
        raise ConfigError(
            f"--tokenizer={spec!r} is invalid for --checkpoint={args.checkpoint!r}: the prompt's ids reach "
            f"{top}, the model's vocabulary has {model.cfg.vocab_size}; allowed: the tokenizer it trained with"
        )
    return tok, prompt


def _show_generation(args, n_loops: int, out, tok, note: str | None) -> None:
    """The generation as one JSON record (--json), or as the text with the loops behind
    each new token under it (stderr)."""
    policy = args.policy
    assert out.texts is not None  # generate returns the texts when given decode=
    tokens, loops, text = out.tokens[0], out.loops[0], out.texts[0]
    pieces = [tok.decode([t]) for t in tokens]
    record = {
        "checkpoint": str(args.checkpoint),
        "prompt": args.prompt,
        "policy": policy.spec,
        "attention_fill": args.attention_fill,
        "n_loops": n_loops,
        "text": text,
        "tokens": tokens,
        "pieces": pieces,
        "loops": loops,
        "exit_step": out.exit_step[0],
        "finish": out.finish[0],
        "mean_loops": out.executed_loops,
        "prompt_executed_loops": out.prompt_executed_loops,
        "note": note,
    }
    if args.json:
        print(json.dumps(record))
        return
    print(args.prompt + text)
    mean = f"{out.executed_loops:.2f}" if out.executed_loops is not None else "-"
    counts = " ".join(f"{r}:{loops.count(r)}" for r in range(1, n_loops + 1))
    print(
        f"\nloops per new token ({policy.label}, R={n_loops}; mean {mean}, tokens per depth {counts}; "
        f"prompt {out.prompt_executed_loops:.2f}; stopped: {out.finish[0]}):",
        file=sys.stderr,
    )
    print(depth_display(pieces, loops), file=sys.stderr)

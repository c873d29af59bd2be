"""`looplab export`: a checkpoint written as a Hugging Face folder."""

from __future__ import annotations

import argparse
from dataclasses import dataclass

from looplab.arguments import flag, flags_of
from looplab.cli.inputs import check_checkpoint
from looplab.cli.shared_flags import command, policy_type
from looplab.config import ConfigError
from looplab.policy import ExitPolicy


@dataclass(frozen=True)
class Export:
    """write a checkpoint as a Hugging Face folder (transformers, lm-eval's hf)

    `looplab export`'s arguments: OUT_DIR and its flags."""

    out_dir: str = flag(help="the folder the Hugging Face files go to", argument=True)
    checkpoint: str = flag()
    format: str = flag("hf", "hf: AutoModelForCausalLM.from_pretrained(OUT_DIR, trust_remote_code=True) (default hf)")
    policy: ExitPolicy = flag(
        ExitPolicy.parse("full"),
        "the exit policy the export runs by default (config exit_policy; overridable at load time; default full)",
        type=policy_type,
    )
    force: bool = flag(False, "replace a previous export in OUT_DIR (nothing else)")


def add_export(sub) -> None:
    command(sub, "export", cmd_export, Export)


def cmd_export(parsed: argparse.Namespace) -> int:
    """Write a checkpoint as a folder another ecosystem loads (--format hf: transformers,
    with trust_remote_code; looplab/export.py)."""
    from looplab import destinations
    from looplab.checkpoint import read_model_config
    from looplab.export import FORMATS, check_out_dir, export_hf

    args = flags_of(Export, parsed)
    if args.format not in FORMATS:
        raise ConfigError(f"--format={args.format!r} is invalid; allowed: {' | '.join(FORMATS)}")
    check_checkpoint(args.checkpoint)
    try:
        args.policy.check(read_model_config(args.checkpoint).n_loops)
    except ConfigError as e:
        raise e.renamed("--policy", args.policy.spec) from None
    destinations.output_dir("OUT_DIR", args.out_dir)
    check_out_dir(args.out_dir, args.force, name="OUT_DIR")
    out = export_hf(args.checkpoint, args.out_dir, args.policy.spec, force=args.force)
    print(
        f"exported {args.checkpoint} to {out} (format {args.format}, exit policy {args.policy.spec}); load it "
        f"with AutoModelForCausalLM.from_pretrained({str(out)!r}, trust_remote_code=True)"
    )
    return 0

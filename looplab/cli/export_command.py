"""`looplab export`: a checkpoint written as a Hugging Face folder."""

from __future__ import annotations

from looplab.cli.inputs import check_checkpoint
from looplab.cli.shared_flags import policy_type
from looplab.config import ConfigError


def add_export(sub) -> None:
    x = sub.add_parser("export", help="write a checkpoint as a Hugging Face folder (transformers, lm-eval's hf)")
    x.add_argument("--checkpoint", required=True)
    x.add_argument(
        "--format",
        default="hf",
        help="hf: AutoModelForCausalLM.from_pretrained(OUT_DIR, trust_remote_code=True) (default hf)",
    )
    x.add_argument(
        "--policy",
        type=policy_type,
        default="full",
        help="the exit policy the export runs by default (config exit_policy; overridable at load time)",
    )
    x.add_argument("--force", action="store_true", help="replace a previous export in OUT_DIR (nothing else)")
    x.add_argument("out_dir", metavar="OUT_DIR")
    x.set_defaults(fn=cmd_export)


def cmd_export(args) -> int:
    """Write a checkpoint as a folder another ecosystem loads (--format hf: transformers,
    with trust_remote_code; looplab/export.py)."""
    from looplab import destinations
    from looplab.checkpoint import read_model_config
    from looplab.export import FORMATS, check_out_dir, export_hf

    if args.format not in FORMATS:
        raise ConfigError(f"--format={args.format!r} is invalid; allowed: {' | '.join(FORMATS)}")
    check_checkpoint(args.checkpoint)
    try:
        args.policy.check(read_model_config(args.checkpoint).n_loops)
    except ConfigError as e:
        raise e.renamed("--policy", args.policy.spec) from None
    destinations.output_dir("OUT_DIR", args.out_dir)
    check_out_dir(args.out_dir, args.force, name="OUT_DIR")
    out = export_hf(args.checkpoint, args.out_dir, args.policy, force=args.force)
    print(
        f"exported {args.checkpoint} to {out} (format {args.format}, exit policy {args.policy.spec}); load it "
        f"with AutoModelForCausalLM.from_pretrained({str(out)!r}, trust_remote_code=True)"
    )
    return 0

"""`looplab doctor`: does this node work (looplab/doctor/)."""

from __future__ import annotations

from looplab.arguments import at_least
from looplab.cli.shared_flags import threads_flag
from looplab.config import ConfigError


def add_doctor(sub) -> None:
    d = sub.add_parser(
        "doctor",
        help="check this node: environment, peaks, kernel correctness, a training probe, Ray (looplab/doctor.py)",
    )
    d.add_argument(
        "--quick",
        action="store_true",
        help="environment, peaks and correctness only (seconds): what cluster.yaml runs on every node",
    )
    d.add_argument("--json", help="also write every check (name, status, figure, value, reason) here")
    d.add_argument("--markdown", help="also write the checks as a markdown table here")
    d.add_argument(
        "--preset", default=None, help="the training probe's preset (default paper-140m on a GPU, local on a CPU)"
    )
    d.add_argument("--steps", type=at_least(1), default=3, help="the training probe's timed steps (default 3)")
    d.add_argument("--device", default="auto")
    d.add_argument("--no-ray", action="store_true", help="skip the Ray check")
    threads_flag(d)
    d.set_defaults(fn=cmd_doctor)


def cmd_doctor(args) -> int:
    from looplab.doctor import main as doctor

    if args.preset is not None:
        from looplab.presets import get_preset

        try:
            get_preset(args.preset)
        except ConfigError as e:
            raise e.renamed("--preset", args.preset) from None
    return doctor(args)

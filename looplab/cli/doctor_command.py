"""`looplab doctor`: does this node work (looplab/doctor/)."""

from __future__ import annotations

from dataclasses import dataclass

from looplab.arguments import at_least, flag
from looplab.cli.shared_flags import Device, Threads, command
from looplab.config import ConfigError


@dataclass(frozen=True)
class Doctor:
    """check this node: environment, peaks, kernel correctness, a training probe, Ray
    (looplab/doctor.py)

    `looplab doctor`'s flags (with Threads'); looplab/doctor/ reads them."""

    quick: bool = flag(False, "environment, peaks and correctness only (seconds): what cluster.yaml runs on every node")
    json: str | None = flag(None, "also write every check (name, status, figure, value, reason) here")
    markdown: str | None = flag(None, "also write the checks as a markdown table here")
    preset: str | None = flag(None, "the training probe's preset (default paper-140m on a GPU, local on a CPU)")
    steps: int = flag(3, "the training probe's timed steps (default 3)", type=at_least(1))
    no_ray: bool = flag(False, "skip the Ray check")


def add_doctor(sub) -> None:
    command(sub, "doctor", cmd_doctor, Doctor, Device, Threads)


def cmd_doctor(args) -> int:
    from looplab.doctor import main as doctor

    if args.preset is not None:
        from looplab.presets import get_preset

        try:
            get_preset(args.preset)
        except ConfigError as e:
            raise e.renamed("--preset", args.preset) from None
    return doctor(args)

"""`looplab data`: task samples as JSON lines."""

from __future__ import annotations

import json
import sys
from dataclasses import dataclass

from looplab.arguments import add_flags, at_least, flag


@dataclass(frozen=True)
class Samples:
    """How many samples `looplab data` prints, and from which seed (each task's)."""

    count: int = flag(10, type=at_least(1))
    seed: int = flag(0, type=at_least(0))


@dataclass(frozen=True)
class Mano:
    """`looplab data mano`'s task flags."""

    L: int = flag(10, "maximum number of operations", type=at_least(1))
    eval: bool = flag(False, "draw from the evaluation distribution (length = L)")
    modulus: int = flag(23, "the field Z_modulus, a prime (default the paper's 23)")


@dataclass(frozen=True)
class Phop:
    """`looplab data phop`'s task flags."""

    n: int = flag(256, type=at_least(3))
    p: int = flag(16, type=at_least(1))
    alphabet: int = flag(4, type=at_least(2))


def add_data(sub) -> None:
    d = sub.add_parser("data", help="print task samples as JSON lines")
    dsub = d.add_subparsers(dest="task", required=True)
    add_flags(dsub.add_parser("mano"), Mano, Samples)
    add_flags(dsub.add_parser("phop"), Phop, Samples)
    d.set_defaults(fn=cmd_data)


def cmd_data(args) -> int:
    if args.task == "mano":
        from looplab.config import ManoConfig
        from looplab.tasks.mano import ManoTask

        records = ManoTask(ManoConfig(L=args.L, modulus=args.modulus)).records(args.count, args.seed, eval=args.eval)
    else:
        from looplab.config import PhopConfig
        from looplab.tasks.phop import PhopTask

        records = PhopTask(PhopConfig(n=args.n, p=args.p, alphabet=args.alphabet)).records(args.count, args.seed)
    for r in records:
        sys.stdout.write(json.dumps(r) + "\n")
    return 0

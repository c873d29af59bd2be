"""`looplab data`: task samples as JSON lines."""

from __future__ import annotations

import json
import sys

from looplab.arguments import at_least


def add_data(sub) -> None:
    d = sub.add_parser("data", help="print task samples as JSON lines")
    dsub = d.add_subparsers(dest="task", required=True)
    m = dsub.add_parser("mano")
    m.add_argument("--L", type=at_least(1), default=10, help="maximum number of operations")
    m.add_argument("--eval", action="store_true", help="draw from the evaluation distribution (length = L)")
    m.add_argument("--modulus", type=int, default=23, help="the field Z_modulus, a prime (default the paper's 23)")
    p = dsub.add_parser("phop")
    p.add_argument("--n", type=at_least(3), default=256)
    p.add_argument("--p", type=at_least(1), default=16)
    p.add_argument("--alphabet", type=at_least(2), default=4)
    for sp in (m, p):
        sp.add_argument("--count", type=at_least(1), default=10)
        sp.add_argument("--seed", type=at_least(0), default=0)
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

"""The bench sweep's console summary: one row per timed prefill point (full and skip
seconds, the speedup, the loop and FLOP bounds) and per arrivals point (tokens/s, d̄,
the speedup), in the plan's order."""

from __future__ import annotations

import sys

from looplab import tracking
from trainables.bench import ARRIVALS

# ---- the summary ------------------------------------------------------------------------------
SUMMARY = (
    "checkpoint",
    "method",
    "batch",
    "L",
    "policy",
    "loops",
    "speedup",
    "loop bound R/d̄",
    "FLOP ratio",
    "speedup / FLOP ratio",
    "reused",
)


ARRIVALS_SUMMARY = (
    "checkpoint",
    "method",
    "slots",
    "schedule",
    "policy",
    "d̄",
    "tok/s",
    "decode tok/s",
    "speedup",
    "FLOP ratio",
    "speedup / FLOP ratio",
    "reused",
)


def is_arrivals(record: dict) -> bool:
    return record.get("kind") == ARRIVALS


def summary_rows(records: list[dict]) -> list[list[str]]:
    rows = []
    for r in records:
        rows.append(
            [
                r["checkpoint"],
                r["method"],
                str(r["batch"]),
                str(r["seq_len"]),
                r["policy"],
                f"{r[tracking.MEAN_LOOPS]:.2f}",
                f"{r[tracking.SPEEDUP]:.2f}x",
                f"{r[tracking.LOOP_BOUND]:.2f}x",
                *_against_flops(r, r[tracking.SPEEDUP]),
            ]
        )
    return rows


def _against_flops(r: dict, speedup: float) -> list[str]:
    """The row's last cells: the FLOP ratio, the share of it the speed-up realises, reused."""
    bound = r.get(tracking.FLOP_RATIO)
    return [
        f"{bound:.2f}x" if bound else "?",
        f"{speedup / bound:.0%}" if bound else "?",
        "yes" if r["reused"] else "no",
    ]


def arrivals_rows(records: list[dict]) -> list[list[str]]:
    from looplab.tracking import DECODE_TOKENS_PER_S

    rows = []
    for r in records:
        speedup = r[tracking.SPEEDUP]
        rows.append(
            [
                r["checkpoint"],
                r["method"],
                str(r["slots"]),
                r["schedule"],
                r["policy"],
                f"{r[tracking.MEAN_LOOPS]:.2f}",
                f"{r[tracking.TOKENS_PER_S]:.0f}",
                f"{r[DECODE_TOKENS_PER_S]:.0f}",
                f"{speedup:.2f}x",
                *_against_flops(r, speedup),
            ]
        )
    return rows


def print_summary(records: list[dict], out=None) -> None:
    """The prefill points' table, then (with --arrivals) the arrivals points'."""
    out = out or sys.stdout
    prefill = [r for r in records if not is_arrivals(r)]
    arrivals = [r for r in records if is_arrivals(r)]
    if prefill:
        _print_table(SUMMARY, summary_rows(prefill), out)
    if arrivals:
        if prefill:
            print(file=out)
        print(
            "decoding under continuous arrivals (speedup: decode tok/s over full's, same slots and schedule)", file=out
        )
        _print_table(ARRIVALS_SUMMARY, arrivals_rows(arrivals), out)


def _print_table(header: tuple[str, ...], rows: list[list[str]], out) -> None:
    widths = [max(len(h), *(len(row[i]) for row in rows)) if rows else len(h) for i, h in enumerate(header)]
    for row in [list(header), ["-" * w for w in widths], *rows]:
        print("  ".join(c.ljust(w) for c, w in zip(row, widths)).rstrip(), file=out)

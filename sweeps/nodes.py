"""The quick health check (looplab/doctor/) on every GPU node of a cluster, before a
sweep schedules on them: `--dry-run --doctor` with `--address`. Each node runs it in a
Ray task pinned to the node; the driver prints one line per node and the first failing
check. Without --address the check runs on this machine.
"""

from __future__ import annotations

from dataclasses import asdict
from typing import Any


def _quick_checks() -> list[dict[str, Any]]:
    import platform

    from looplab.doctor import run

    return [{**asdict(c), "host": platform.node()} for c in run(quick=True, ray=False)]


def check_nodes(address: str) -> list[tuple[str, list[dict[str, Any]]]]:
    """(node, its checks) for every alive node with a GPU; this machine alone without an address."""
    if not address:
        import platform

        return [(platform.node(), _quick_checks())]
    import ray
    from ray.util.scheduling_strategies import NodeAffinitySchedulingStrategy

    ray.init(address=address, log_to_driver=False, configure_logging=False)
    try:
        nodes = [n for n in ray.nodes() if n.get("Alive") and n.get("Resources", {}).get("GPU", 0) > 0]
        task = ray.remote(_quick_checks)
        pending = [
            (
                n["NodeManagerAddress"],
                task.options(
                    num_gpus=1, scheduling_strategy=NodeAffinitySchedulingStrategy(n["NodeID"], soft=False)
                ).remote(),
            )
            for n in nodes
        ]
        return [(name, ray.get(ref)) for name, ref in pending]
    finally:
        ray.shutdown()


def report(results: list[tuple[str, list[dict[str, Any]]]]) -> tuple[str, bool]:
    """One line per node, and whether every node passed."""
    if not results:
        return "doctor: the cluster has no GPU node up (the autoscaler starts them for a sweep)", True
    lines, ok = [], True
    for node, checks in results:
        bad = [c for c in checks if c["status"] == "fail"]
        ok &= not bad
        lines.append(
            f"doctor {node}: " + (f"FAIL {bad[0]['name']}: {bad[0]['reason']}" if bad else f"ok ({len(checks)} checks)")
        )
    return "\n".join(lines), ok

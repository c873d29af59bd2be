"""Where the trained checkpoints an evaluation or a bench step reads come from: a
sweep's trials (their stages whole in the store) or an experiment's MLflow stage runs
(a store moved with its folder found again by its stage keys)."""

from __future__ import annotations

from pathlib import Path
from typing import Any

from looplab import tracking
from looplab.keys import stage_path
from trainables.evaluation import Checkpoint


# ---- where checkpoints come from -------------------------------------------------------------
def pipeline_checkpoints(spec, trial_params: list[dict[str, Any]], storage_path: str | Path) -> list[Checkpoint]:
    """The trained stages of these trials, whole in the store (a stage folder's done.json
    names the run that trained it), each stage key once, in pipeline order."""
    from trainables.keyed_step import record_of, stored_weights
    from trainables.pipeline import checkpoint_of, stage_configs
    from trainables.storage import Storage

    found: dict[str, Checkpoint] = {}
    for params in trial_params:
        configs = stage_configs(spec, params, storage_path)
        for i, cfg in enumerate(configs):
            if cfg.stage_key() in found:
                continue
            record = record_of(str(storage_path), cfg)
            if not record.finished or record.done is None:  # a broken stage is no checkpoint to evaluate
                continue
            done = record.done
            found[cfg.stage_key()] = Checkpoint(
                checkpoint_of(storage_path, cfg),
                cfg.stage,
                cfg.stage_key(),
                cfg.config_hash(),
                tuple(c.stage for c in configs[: i + 1]),
                cfg.model.n_loops,
                done["run_id"],
                cfg.preset,
                cfg.task.kind,
                stored_weights(Storage(str(storage_path)), checkpoint_of(storage_path, cfg)),
            )
    return list(found.values())


def store_checkpoints(
    mc, experiment_id: str, storage_path: str | Path | None = None
) -> tuple[list[Checkpoint], list[str]]:
    """The experiment's trained stages from its MLflow stage runs (FINISHED, not reused
    copies), at the checkpoint their tag names, else at STORAGE/stages/<stage>-<key>/checkpoint
    (a store moved with its folder). Returns them and one note per stage run skipped."""
    from looplab.checkpoint import WEIGHTS_DIGEST, is_checkpoint, read_config, read_model_config
    from looplab.training.run_folder import CHECKPOINT_DIR
    from trainables.storage import Storage, local_checkpoint

    runs, token = [], None
    while True:
        page = mc.search_runs(
            [experiment_id],
            max_results=5000,
            page_token=token,
            filter_string=f"tags.{tracking.LEVEL} = '{tracking.STAGE}' "
            f"and tags.{tracking.REUSED} = 'false' and attributes.status = 'FINISHED'",
        )
        runs += list(page)
        token = page.token
        if not token:
            break
    found: dict[str, Checkpoint] = {}
    notes = []
    for run in sorted(runs, key=lambda r: r.info.start_time):
        tags = run.data.tags
        key, stage = tags.get(tracking.STAGE_KEY, ""), tags.get(tracking.STAGE_TAG, "")
        location = tags.get(tracking.CHECKPOINT, "")
        try:
            path = local_checkpoint(location) if location else Path("")
        except (FileNotFoundError, OSError, ValueError):
            path = Path("")
        if not is_checkpoint(path) and storage_path:  # a store moved with its folder
            location = Storage(storage_path).path(*stage_path(stage, key, CHECKPOINT_DIR))
            path = Path(location)
        if not key or not is_checkpoint(path):
            notes.append(
                f"{tracking.stage_run_name(stage, key)}: no checkpoint at {tags.get(tracking.CHECKPOINT)!r}"
                + (f" or {path}" if storage_path else "")
            )
            continue
        config = read_config(path)
        meta = config.get("metadata", {})
        lineage = tuple(meta.get("lineage") or tags.get(tracking.LINEAGE, stage).split("+"))
        found[key] = Checkpoint(
            location,
            stage,
            key,
            tags.get(tracking.CONFIG_HASH, meta.get("config_hash", "")),
            lineage,
            read_model_config(path).n_loops,
            run.info.run_id,
            tags.get(tracking.PRESET, ""),
            meta.get("task", "text"),
            config.get(WEIGHTS_DIGEST, ""),
        )
    return list(found.values()), notes

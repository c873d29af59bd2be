"""What Ray runs: a trial's pipeline of looplab stages (each stage on Ray Train), and the
downstream evaluations of the trained checkpoints (Ray tasks of their own).

pipeline.py      the trial's stage configs, derived from a declaration + sampled params
shared_stage.py  a stage's deterministic folder, its lock and its "done" marker
lease.py         the one lease mechanism behind the shared stages' and the sweeps' locks
stage_worker.py  the Ray Train worker loop that trains one stage (rank 0 logs to MLflow)
trial.py         the Tune function trainable: stages in order, MLflow runs, Tune reports
progress.py      live progress: trials post to a board (a named Ray actor) the driver prints,
                 and the driver's stop request (Ctrl-C) goes back the same way
keyed_step.py    the one content-keyed step: finished when its outputs verify; jobs inline or as Ray tasks
evaluation.py    downstream evaluation keyed by content (eval_key): the grid, reuse, one job per checkpoint
eval_tasks.py    the lm-eval tasks an evaluation reads, and what of each enters its key
checkpoints.py   the trained checkpoints those steps read: a sweep's trials, an experiment's stage runs
bench.py         the bench sweep's timed points (prefill, decoding under arrivals), keyed by content
storage.py       a storage path on a file system or an object store: read, write, upload, download
"""

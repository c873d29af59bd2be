"""What Ray runs: a trial's pipeline of looplab stages (each stage on Ray Train), and the
downstream evaluations of the trained checkpoints (Ray tasks of their own).

pipeline.py      the trial's stage configs, derived from a declaration + sampled params
shared_stage.py  a stage's deterministic folder, its lock and its "done" marker
stage_worker.py  the Ray Train worker loop that trains one stage (rank 0 logs to MLflow)
trial.py         the Tune function trainable: stages in order, MLflow runs, Tune reports
progress.py      live progress: trials post to a board (a named Ray actor) the driver prints
evaluation.py    downstream evaluation keyed by content (eval_key): plan, reuse, one job per checkpoint
"""

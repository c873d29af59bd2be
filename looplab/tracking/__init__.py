"""The tracking contract: every MLflow name the platform writes and analysis reads.

The writer (trainables/, sweeps/, the benchmarks) and the reader (analysis/) both
import the names from here; no experiment, run, tag or metric name is spelled
anywhere else: they live in names.py, the thin MLflow helpers the writers use in
mlflow_runs.py, and this package's face holds both (`from looplab import tracking`).

The tree: one experiment per sweep (`experiment_name`: sweep and preset), marked as
a model-training experiment (MLflow 3.17's UI opens its runs rather than its GenAI
overview only through the URL's mode, which looplab/dashboard.py's URLs carry; a saved
view per sweep, SHARED_VIEW_TAG, shows its trials); one parent run per sweep, keyed by
the sweep's content (tag `sweep_key`), with the sweep's params (sweep_params: the grid and
the fixed settings) and its headline metrics (BEST: the best trial's summary columns); one
child run per trial, named by its final stage's key; one nested run per stage, keyed by
its `stage_key`; one nested run per downstream evaluation (level eval), keyed by its
`eval_key` (trainables/evaluation.py) and nested under the run that trained its stage.
Run levels are in the tag `level`.

Metrics:
  training    TRAIN_METRICS per logged step, plus the stage's own diagnostics
              (hole_branch, hole_q, executed_loops, exit_prob) under their own names
  evaluation  <policy prefix><quantity>: the policy's metric prefix (looplab/policy.py:
              val_ for full depth, forced_d<D>_, dense_q<Q>_, skip_q<Q>_, and the zoo's
              <dense|skip>_<entropy|kl|stable><T>_, e.g. skip_entropy2.5_) and one of
              EVAL_QUANTITIES, e.g. val_ppl, skip_q0.4_executed_loops, forced_d2_accuracy;
              lm-eval scores are the quantity lm_eval.<task> (the task's suite accuracy,
              a fraction) and lm_eval_avg, e.g. skip_q0.4_lm_eval.piqa
  downstream  an evaluation run (level eval) logs, under its policy's prefix, for its task:
              lm_eval.<task> (accuracy), lm_eval_loops.<task> (executed loops per token on
              the task's requests: downstream, never the validation set's executed_loops),
              lm_eval_flops.<task> (backbone FLOPs per token there), lm_eval_seconds.<task>
              (the model's time on them) and lm_eval_ppl.<task> where the task reports a
              perplexity, e.g. skip_q0.4_lm_eval_loops.piqa. A family without a task
              (lm_eval_loops, lm_eval_avg) is the suite's mean over its tasks, which
              analysis computes from the runs of one checkpoint and policy
  timing      STAGE_SECONDS (the stage's training, once per stage), MLFLOW_SECONDS and
              REPORT_SECONDS (time the stage spent in MLflow and Ray reports)
  per loop    loop<r>_<quantity> at each evaluation (looplab/training/instruments.py: hidden_norm,
              grad_norm), and under a skip policy's prefix (skip_q0.4_loop2_active,
              skip_q0.4_loop2_state_gap): loop_metric / parse_loop_metric

mlflow is imported inside the functions: the library runs without it.
"""

from __future__ import annotations

# The package's face: every name of both modules, as `tracking.NAME` (the modules define
# too many names to list twice; each defines only what it exports, imports aside).
from looplab.tracking.mlflow_runs import *  # noqa: F403
from looplab.tracking.names import *  # noqa: F403

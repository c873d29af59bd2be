"""The `looplab` command: single runs and data inspection.

    looplab train --preset phop-debug --out runs/phop-debug [model.n_loops=1 train.steps=500 ...]
    looplab train --preset phop-debug --stage stage1 --init runs/phop-debug/checkpoint --out runs/s1 [exit.beta=0.1]
    looplab data mano --L 10 [--eval] --count 5 --seed 0
    looplab data phop --n 256 --p 16 --alphabet 4 --count 5 --seed 0
    looplab eval --checkpoint runs/x/checkpoint [--policies 'full;dense:0.2,0.4;skip:0.4;forced:1-3'] [--json out.json]
    looplab eval --checkpoint runs/x/checkpoint --policies 'skip-entropy:1.0,2.0;dense-kl:0.01;skip-stable:2-3'
    looplab lm-eval --checkpoint runs/lm/checkpoint --suite paper [--policy skip:0.4] [--limit 100] [--local-data DIR]
    looplab lm-eval --checkpoint runs/lm/checkpoint --tasks piqa,my_task [--include-path DIR] [--tokenizer bytes] [--output out.json]
    looplab bench --preset local --batch 1,8,16 --seq-len 512,1024 --oracle-mean 2.0 [--dtype bf16] [--packing padded] [--json out.json]
    looplab bench --decode --preset local --batch 1,8,64 --seq-len 128,2048 --oracle-mean 2.0 [--new-tokens 32]
                  [--schedule lockstep,depth]
    looplab bench-arrivals --checkpoint runs/s1/checkpoint --slots 8,32 --policies skip:0.4 [--requests 64]
                  [--prompt-len 16-128] [--new-tokens 8-64] [--schedule lockstep,depth] [--json out.json]
    looplab generate --checkpoint runs/lm/checkpoint --prompt "Once upon a time" [--policy skip:0.4] [--json]
    looplab export --checkpoint runs/lm/checkpoint --format hf exports/lm [--policy skip:0.4] [--force]
    looplab presets
    looplab info --preset paper-140m [arch=hybrid ...]
    looplab options [train. exit.beta ...]             the override keys, their defaults and meaning
    looplab doctor [--quick] [--json report.json]      does this node work? (looplab/doctor/)
    looplab dashboard runs/beta [--port 5000] [--experiment NAME]   MLflow's dashboard of a sweep, until Ctrl-C

Each command is a pair side by side: add_<command> declares its arguments (an options
dataclass whose fields looplab/arguments.py add_flags makes the flags, and whose
docstring's first paragraph is the command's help), cmd_<command> runs with them, in the
module of its group (preset_commands: train, presets, info; data_command; eval_commands:
eval, lm-eval; bench_commands: bench, bench-arrivals; generate_command; export_command;
doctor_command; dashboard_command; options_command); shared_flags.py holds the options
several commands share (Threads, Compile, Timing), `command` and the argument types of
exit policies and schedules, inputs.py the checks they make before their work;
build_parser lists the pairs.
"""

from __future__ import annotations

import sys

from looplab.arguments import Parser
from looplab.cli.bench_commands import add_bench, add_bench_arrivals, cmd_bench, cmd_bench_arrivals
from looplab.cli.dashboard_command import add_dashboard, cmd_dashboard
from looplab.cli.data_command import add_data, cmd_data
from looplab.cli.doctor_command import add_doctor, cmd_doctor
from looplab.cli.eval_commands import add_eval, add_lm_eval, check_task_names, cmd_eval, cmd_lm_eval
from looplab.cli.export_command import add_export, cmd_export
from looplab.cli.generate_command import add_generate, cmd_generate, depth_display, untrained_gate_note
from looplab.cli.inputs import check_destinations
from looplab.cli.options_command import add_options, cmd_options
from looplab.cli.preset_commands import add_info, add_presets, add_train, cmd_info, cmd_presets, cmd_train
from looplab.config import ConfigError
from looplab.errors import CheckpointNotWritten, TrainingDiverged

__all__ = [
    "add_bench",
    "add_bench_arrivals",
    "add_dashboard",
    "add_data",
    "add_doctor",
    "add_eval",
    "add_export",
    "add_generate",
    "add_info",
    "add_lm_eval",
    "add_options",
    "add_presets",
    "add_train",
    "build_parser",
    "check_task_names",
    "cmd_bench",
    "cmd_bench_arrivals",
    "cmd_dashboard",
    "cmd_data",
    "cmd_doctor",
    "cmd_eval",
    "cmd_export",
    "cmd_generate",
    "cmd_info",
    "cmd_lm_eval",
    "cmd_options",
    "cmd_presets",
    "cmd_train",
    "depth_display",
    "main",
    "untrained_gate_note",
]


def build_parser() -> Parser:
    parser = Parser(prog="looplab", description="Looped language models: single runs and data.")
    sub = parser.add_subparsers(dest="command", required=True, parser_class=Parser)
    for add in (
        add_train,
        add_data,
        add_eval,
        add_lm_eval,
        add_bench,
        add_bench_arrivals,
        add_generate,
        add_export,
        add_presets,
        add_info,
        add_options,
        add_doctor,
        add_dashboard,
    ):  # --help lists the commands in this order
        add(sub)
    return parser


def main(argv: list[str] | None = None) -> int:
    args = build_parser().parse_args(argv)
    try:
        check_destinations(args)  # before any command's work: a bad --json costs seconds, not the evaluation
        if hasattr(args, "threads"):  # a command that computes: threads chosen, never torch's default
            from looplab import threads

            threads.use(args.threads)
        return args.fn(args)
    except ConfigError as e:
        print(f"looplab: error: {e}", file=sys.stderr)
        return 2
    except (TrainingDiverged, CheckpointNotWritten) as e:  # stopped, nothing lost: the line says how to go on
        print(f"looplab: {e}", file=sys.stderr)
        return 1

"""The backbone under torch.compile: one home for what compiles, when, and how.

Training (train.compile): one application of the shared backbone M_θ with gradients
on (the R loops of a training forward all call it), not the whole loss: the loss's
Python (exit policies, sampled holes, the chunked head) would break the graph at every
data-dependent branch, and the backbone is where the elementwise work that Inductor
fuses lives (the norms, the gates, dt's softplus). On a CPU a compiled run also runs
each Mamba-2 block's conv and scan as C++ kernels (models/cpu/cpu_sequence.py, packed rows
too) instead of the torch ops: the chunked scan's tiny batched products and decay
matrices are what Inductor cannot fuse (docs/benchmarks.md).

Decoding (compile_decoding): one application to one new token per row, with the
cache, its number of rows dynamic; under a full-depth policy the whole token step
instead (embedding, R loops, head: CompiledDecodeStep.whole), on a CPU compiled ahead
of time (models/cpu/ahead_of_time.py); every policy and schedule goes through them
(generate.decode_step and depth batching call model.step), so tokens and loops are
eager's (tests/test_compile.py). On a 2-core CPU a decode step of a d 256, 4-layer
Mamba-2 at batch 1 ran 2.1-2.4x faster compiled (its ~100 small operations per layer
fused); the first steps compile (seconds).

Evaluation and prefill (the rest of what runs under torch.no_grad) stay eager: their
shapes vary from call to call (policies, batch tails, prompt lengths) and each new
shape would cost a compilation.

Shapes: each new input shape costs a compilation (tens of seconds on a small CPU, more
for a dynamic-shape graph; docs/benchmarks.md), so the compiled function serves
the first dense shapes a run meets, at most MAX_SHAPES of them (the dense batch, a last
micro-batch), compiled static; any other shape (skip's packed survivors, CHASE's
holes, whose lengths change from step to step) runs the eager backbone. Same losses as
eager to float rounding (tests/test_compile.py); a run's key does not depend on it (a
cadence-like setting).
"""

from __future__ import annotations

from typing import Callable

import torch

from looplab.models.cpu.ahead_of_time import AheadOfTimeSteps
from looplab.models.mamba2 import Mamba2
from looplab.models.ops import dispatch

AUTO, ON = "auto", "on"  # train.compile's values (looplab/config/training.py validates them)


def compiles(setting: str, device: torch.device) -> bool:
    """Whether a run with train.compile=`setting` compiles its backbone on `device`.
    auto: on CUDA only. On a 2-core CPU compiling `debug`'s backbone takes 48 s cold
    (6-8 s from Inductor's on-disk cache; building the C++ kernels, ~35 s, once a
    machine) for a step about half eager's time (docs/benchmarks.md): a preset's few
    hundred steps barely pay that back, and the miniature's protocol is eager's floats.
    On CUDA, where a small model's step is kernel launches, it has not run yet."""
    return device.type == "cuda" if setting == AUTO else setting == ON


BACKEND = "inductor"  # the suite's quick tests trace with "aot_eager" (Inductor's C++ builds take minutes)
MAX_SHAPES = 2  # static compilations per training run: the dense batch and a last micro-batch


def _compiled(fn: Callable, dynamic: bool | None, cuda_graphs: bool = False):
    # Dynamo keeps its compilations per code object, so every backbone of a process
    # (each model, its training and decoding) shares Backbone.forward's recompile limit:
    # room for one's shapes beside another's, before dynamo falls back to eager.
    config = torch._dynamo.config
    config.recompile_limit = max(config.recompile_limit, 32)
    if cuda_graphs:  # an Inductor mode: BACKEND's quick stand-in (aot_eager) has none
        return torch.compile(fn, dynamic=dynamic, mode="reduce-overhead")
    return torch.compile(fn, dynamic=dynamic, backend=BACKEND)


class CompiledBackbone:
    """Training's backbone: compiled static for the first MAX_SHAPES dense input
    signatures it meets (no seq_idx), eager for any other (see the module's docstring)."""

    def __init__(self, backbone: torch.nn.Module):
        self.backbone, self.compiled = backbone, _compiled(backbone.forward, dynamic=False)
        self.shapes: set[tuple] = set()

    def __call__(self, h, positions=None, seq_idx=None, cache=None):
        signature = (tuple(h.shape), h.dtype, positions is None, seq_idx is None)
        # A packed layout (seq_idx: skip's survivors, CHASE's holes) changes from step to
        # step: compiling one would cost its compilation (38 s for `debug`'s CHASE stage
        # on 2 cores) for a shape the next step does not meet again.
        if signature not in self.shapes and len(self.shapes) < MAX_SHAPES and seq_idx is None:
            self.shapes.add(signature)
        fn = self.compiled if signature in self.shapes else self.backbone
        return fn(h, positions, seq_idx, cache)


class CompiledDecodeStep:
    """Decoding's one-token step: compiled with its number of rows dynamic (a skip
    policy's and depth batching's running rows change from step to step), one graph for
    one row and one for any other count; every other dimension static.

    cuda_graphs=True (a GPU): Inductor's "reduce-overhead" mode, which captures each
    graph in a CUDA graph and replays it, so a step costs one launch instead of one per
    kernel. Two things make that sound here. The cache's tensors, which the step updates
    in place, are marked static (their addresses do not change between steps: a CUDA
    graph reads and writes fixed memory; an input that is mutated and not static would
    make Inductor skip the capture). And each call is its own capture step
    (cudagraph_mark_step_begin) whose output is cloned: a replay overwrites its outputs'
    memory, and a decode step's caller keeps h across the loops and steps that follow.
    Not yet run on a GPU: `looplab doctor` checks its tokens against eager's there and
    counts the captures Inductor skipped.

    whole(step): where every row runs every loop (a full-depth policy), the caller's whole
    token step (embedding, the R loops, the head) compiled as one graph instead: one
    guard check and one graph call a token instead of one a loop, and the embedding,
    positions and head fused in. On a CPU, for every row of a recurrent cache, it is
    compiled ahead of time instead (ahead_of_time: models/cpu/ahead_of_time.py), which drops
    dynamo's per-call costs too. gate_loop(fn): depth batching's step when every row of
    its batch runs under the gate's skip policy, the loop and the exit decision as one
    graph, likewise ahead of time on a CPU (its rows are the batch's, whatever loop each
    is at: one signature). storage_steps(fn): several loops on the storage by slot as
    one call of fixed shapes: depth batching's greedy steps, and decode_step's token
    under the gate's skip or dense policy or forced (under skip an exited row's later
    loops pointed at the scratch slot). The zoo's rules, attention caches and depth
    batching's other steps, whose running rows change from loop to loop, go through the
    one-loop step."""

    def __init__(
        self,
        backbone: torch.nn.Module,
        cuda_graphs: bool = False,
        whole_steps: bool = True,
        ahead_of_time: bool = True,
    ):
        self.cuda_graphs, self.whole_steps = cuda_graphs, whole_steps and not cuda_graphs
        self.ahead_of_time = self.whole_steps and ahead_of_time
        self.compiled = _compiled(backbone.forward, dynamic=None, cuda_graphs=cuda_graphs)
        self.whole_step: Callable | None = None  # whole()'s step by dynamo, compiled on first use
        self.gate_step: Callable | None = None  # gate_loop()'s step by dynamo, compiled on first use
        # storage_steps()'s functions by dynamo, per (function, every row), compiled on first use
        self.storage_fns: dict[tuple[Callable, bool], Callable] = {}
        self.packages: AheadOfTimeSteps | None = None  # and ahead of time, built on first use
        self._loop_flops: int | None = None

    def loop_flops(self, model) -> int:
        """One row's backbone loop in FLOPs (model.step_flops(1)), computed once: a
        decode step's choice of call reads it every token."""
        if self._loop_flops is None:
            self._loop_flops = model.step_flops(1)
        return self._loop_flops

    def whole(self, step: Callable, model, cache, tokens, rows, readout):
        """step(model, cache, tokens, rows, readout) compiled (generate._full_depth_step,
        where whole_steps is on: off in benchmarks/suite.py's per-loop arm and with
        cuda_graphs, whose capture is the one-loop step's, the one the doctor checks on a
        GPU): ahead of time where that applies, else by dynamo with its rows dynamic."""
        if rows is None:
            logits = self._ahead_of_time(
                model, cache, tokens.device, lambda p: p.token_step(step, cache, tokens, readout)
            )
            if logits is not NotImplemented:
                return logits
        if self.whole_step is None:
            self.whole_step = _compiled(step, dynamic=None)
        for t in (tokens, rows):
            if t is not None:
                torch._dynamo.maybe_mark_dynamic(t, 0)
        return self.whole_step(model, cache, tokens, rows, readout)

    def gate_loop(self, fn: Callable, model, rule, h, positions, slots, cache, state: tuple):
        """fn(model, rule, h, positions, cache.at_slots(slots), *state) compiled
        (depth_batching.gate_loop: depth batching's step when every row runs, its loop and
        its gate's decision in one graph, where whole_steps is on): ahead of time where
        that applies, else by dynamo with static shapes (a batch's rows are its size)."""
        outputs = self._ahead_of_time(model, cache, h.device, lambda p: p.gate_loop(fn, rule, h, slots, cache, state))
        if outputs is not NotImplemented:
            return outputs
        if self.gate_step is None:
            self.gate_step = _compiled(fn, dynamic=False)
        return self.gate_step(model, rule, h, positions, cache.at_slots(slots), *state)

    def storage_steps(self, fn: Callable, model, constants: tuple, cache, inputs: tuple, every_row: bool = True):
        """fn(model, *constants, cache.storage, *inputs) compiled: several loops on the
        storage by slot as one call of fixed shapes (depth_batching.depth_steps: greedy
        steps of a depth batch; generate._fused_token_step: a lockstep token under skip,
        dense or forced); constants: what the trace fixes (the rule, loops, steps, readout).
        every_row (the inputs are the cache's rows): ahead of time where that applies,
        else by dynamo with static shapes (a gathered readout breaks the graph); a subset
        of the rows: by dynamo, its rows dynamic. With cuda_graphs, captured in a CUDA
        graph per (rows, constants): on a GPU a call of several loops is one replay
        (DepthBatch reads out every row there)."""
        if every_row:
            outputs = self._ahead_of_time(
                model, cache, cache.length.device, lambda p: p.storage_steps(fn, constants, inputs, cache)
            )
            if outputs is not NotImplemented:
                return outputs
        else:
            for t in inputs:
                torch._dynamo.maybe_mark_dynamic(t, 0)
        if (fn, every_row) not in self.storage_fns:
            self.storage_fns[fn, every_row] = _compiled(fn, dynamic=not every_row, cuda_graphs=self.cuda_graphs)
        step = self.storage_fns[fn, every_row]
        if not self.cuda_graphs:
            return step(model, *constants, cache.storage, *inputs)
        # Captured per (rows, constants): the storage marked static as the one-loop
        # step's cache is, each call its own capture step, its outputs cloned (__call__).
        _mark_static(cache.storage)
        torch.compiler.cudagraph_mark_step_begin()
        return tuple(t.clone() for t in step(model, *constants, cache.storage, *inputs))

    def _ahead_of_time(self, model, cache, device, run: Callable[[AheadOfTimeSteps], object]):
        """run(the model's packages) where a step on this cache may run ahead of time;
        NotImplemented where it may not or no package serves it (the caller's dynamo step)."""
        packages = self._packages(model, cache, device)
        return NotImplemented if packages is None else run(packages)

    def _packages(self, model, cache, device) -> AheadOfTimeSteps | None:
        """The model's ahead-of-time packages where a step on this cache may run ahead of
        time (made on first use), else None."""
        # (BACKEND's quick stand-in builds no C++: nor does an ahead-of-time step then)
        if not (self.ahead_of_time and BACKEND == "inductor" and AheadOfTimeSteps.serve(cache, device)):
            return None
        if self.packages is None:
            self.packages = AheadOfTimeSteps(model)
        return self.packages

    def __call__(self, h, positions=None, seq_idx=None, cache=None):
        for t in (h, positions):
            if t is not None:
                torch._dynamo.maybe_mark_dynamic(t, 0)
        if not self.cuda_graphs:
            return self.compiled(h, positions, seq_idx, cache)
        if cache is not None:
            _mark_static(cache.states)
        torch.compiler.cudagraph_mark_step_begin()
        return self.compiled(h, positions, seq_idx, cache).clone()


def _mark_static(states: list) -> None:
    """Every tensor of a cache's states (a StepCache's, or an InferenceCache's storage)
    at a fixed address for CUDA graphs, marked once (a cache that grows its attention
    buffers hands new tensors, marked then)."""
    for state in states:
        for t in () if state is None else vars(state).values():
            if not hasattr(t, "_dynamo_static_input_type"):
                torch._dynamo.mark_static_address(t)


def compile_backbone(model, setting: str, device: torch.device) -> bool:
    """Give `model` (a LoopedLM) a compiled training backbone where train.compile=
    `setting` says so on `device` (compiles); LoopedLM.step calls it with gradients on
    and no cache. The eager module keeps its parameters (the compiled function reads the
    same ones), so state_dict keys and checkpoints do not change. Returns whether it did."""
    model.compiled_backbone = CompiledBackbone(model.backbone) if compiles(setting, device) else None
    # On a CPU the compiled step runs each Mamba-2 block's conv and scan as C++ kernels
    # (models/cpu/cpu_sequence.py): Inductor cannot fuse the chunked scan's tiny products.
    kernels = model.compiled_backbone is not None and device.type == "cpu" and dispatch.cpu_sequence_kernels_serve()
    for block in model.modules():
        if isinstance(block, Mamba2):
            block.cpu_kernels = kernels
    return model.compiled_backbone is not None


def compile_decoding(
    model, enabled: bool = True, cuda_graphs: bool = False, whole_steps: bool = True, ahead_of_time: bool = True
):
    """Give `model` (a LoopedLM) a compiled one-token step: LoopedLM.step runs it for a
    (n, 1, d) input with a cache and no gradients (decode_step, depth batching), and
    decode_step compiles its whole token step under a full-depth policy (whole_steps;
    ahead of time on a CPU where that applies: ahead_of_time; CompiledDecodeStep.whole).
    With enabled=False, remove it (the eager step). cuda_graphs: capture the one-loop
    step in CUDA graphs (on a CPU, Inductor captures nothing and it runs as compiled).
    Returns the model."""
    model.compiled_decode = (
        CompiledDecodeStep(model.backbone, cuda_graphs, whole_steps, ahead_of_time) if enabled else None
    )
    return model

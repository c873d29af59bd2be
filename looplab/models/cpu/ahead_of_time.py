"""Decoding's steps compiled ahead of time: torch.export, then AOTInductor.

Why: at batch 1 a small model's token step under torch.compile pays, every call,
dynamo's guard check (every parameter and cache tensor), the compiled region's entry and
Inductor's Python wrapper, which can cost as much as the step's matrix products
(docs/benchmarks.md, "Where the time goes"). An AOTInductor package is called from C++
with no guards, so what the guards checked is checked here, once per call and cheaply:

- the call's signature (what the step is: its kind and constants, such as the readout
  or the gate's q; and the shape, strides and dtype of every input: a package reads its
  inputs as laid out when it was built) picks the package compiled for it, or compiles
  one;
- a package holds its own copy of the weights (A_log, D and dt_bias are not among the
  constants a built package can be handed, so it cannot read the model's), so each
  call compares the parameters' and buffers' identities, versions and memory (an
  optimizer step or load_state_dict bumps a version) and compiles again when they
  changed. The copies are what the speed costs in memory: PACKAGE_BYTES of copies at
  most per model (and never fewer than MIN_PACKAGES packages).

Three kinds of step are packaged:
- token_step: decode_step's whole token step under a full-depth policy, for every row
  of the cache (decode_step's rows=None);
- gate_loop: depth batching's step when every row runs (inference/depth_batching.py):
  one loop for each row at its own slot, and the gate's exit decision. Its number of
  rows is the batch's, so one package serves every step of a full batch;
- storage_steps: several loops on the storage by slot in one call, for every row:
  depth batching's greedy steps, or decode_step's token under skip, dense or forced (the
  exited rows' loops pointed at the scratch slot: inference/generate.py).

Where they apply (AheadOfTimeSteps.serve): a CPU, no autocast, no gradients, and
recurrent states only (attention's buffers grow with the context, which would be a new
package each time they do). Elsewhere the caller runs the dynamo step. A failed export
or build falls back to it too, with one warning: decoding never stops on a compiler's
limitation.
"""

from __future__ import annotations

import os
import tempfile
import warnings
from typing import Callable, Iterator

import torch

from looplab.models.cache import Layout, StepCache
from looplab.policy import ExitRule

# Packages kept per model, the oldest dropped for a new one (10-20 s to build on 2 cores):
# a benchmark alternating lockstep and depth batching at two slot counts holds 6-8 of
# them, and a dropped one is built again on its next use.
PACKAGE_BYTES = 8 * 2**30  # the weights' copies one model's packages may hold together
MIN_PACKAGES = 4


def _inputs(cache) -> list[torch.Tensor]:
    """The tensors a full-depth step reads and writes: each loop's view of each block's
    state fields, then the lengths. Per-loop views, not the storage behind them: an
    input the package writes in place is written whole, and a loop's update of a
    storage-wide input would rewrite every loop's states."""
    return [t for states in cache.states for s in states if s is not None for t in vars(s).values()] + [cache.length]


def _storage(cache) -> list[torch.Tensor]:
    """Every block's state fields over all loops (InferenceCache.storage): what a step
    whose rows sit at different loops reads and writes, by slot."""
    return [t for s in cache.storage if s is not None for t in vars(s).values()]


def _states(template: list, tensors: Iterator[torch.Tensor]) -> list:
    """template's states (a list of per-block states, None where a block keeps none)
    rebuilt over the next of `tensors`, in _inputs' or _storage's order."""
    return [None if s is None else type(s)(**{k: next(tensors) for k in vars(s)}) for s in template]


class _Views:
    """What a full-depth step reads of an InferenceCache (its lengths, `at(loop,
    layout)`), over the tensors _inputs lists: the exported step's inputs."""

    def __init__(self, template, tensors):
        it = iter(tensors)
        self.states = [_states(loop, it) for loop in template.states]
        self.length = next(it)

    def at(self, loop: int, layout) -> StepCache:
        return StepCache(self.states[loop - 1], layout)


class _TokenStep(torch.nn.Module):
    """What is exported: step(model, cache, tokens, None, readout) over the cache's
    tensors as inputs, so the package updates the caller's states in place. Without
    the readout it returns an empty tensor (an exported program returns tensors)."""

    def __init__(self, model, step: Callable, template, readout: bool):
        super().__init__()
        self.model, self.step, self.template, self.readout = model, step, template, readout

    def forward(self, tokens, *tensors):
        logits = self.step(self.model, _Views(self.template, tensors), tokens, None, self.readout)
        return logits if logits is not None else tokens.new_zeros(0, dtype=torch.float32)


class _GateLoop(torch.nn.Module):
    """What is exported for depth batching: fn(model, rule, h, positions=None, StepCache
    of the storage at slots, *state) over (h, slots, *state, *storage tensors),
    returning (h, exit now, *state) (inference/depth_batching.gate_loop)."""

    def __init__(self, model, fn: Callable, template, rule, n_state: int):
        super().__init__()
        self.model, self.fn, self.storage, self.rule, self.n_state = model, fn, template.storage, rule, n_state

    def forward(self, h, slots, *flat):
        state, tensors = flat[: self.n_state], flat[self.n_state :]
        cache = StepCache(_states(self.storage, iter(tensors)), Layout.one_token(slots))
        return self.fn(self.model, self.rule, h, None, cache, *state)


class _StorageSteps(torch.nn.Module):
    """What is exported for several loops on the storage by slot: fn(model, *constants,
    the storage's states, *inputs) over (*inputs, *storage tensors), returning fn's
    tensors (inference/depth_batching.depth_steps, inference/generate._fused_token_step)."""

    def __init__(self, model, fn: Callable, template, constants: tuple, n_inputs: int):
        super().__init__()
        self.model, self.fn, self.storage = model, fn, template.storage
        self.constants, self.n_inputs = constants, n_inputs

    def forward(self, *flat):
        inputs, tensors = flat[: self.n_inputs], flat[self.n_inputs :]
        return self.fn(self.model, *self.constants, _states(self.storage, iter(tensors)), *inputs)


def _constant(c) -> object:
    """A trace constant as part of a package's key: an exit rule by its kind and value
    (each batch makes its own rule object, and must find the same package), else itself."""
    return (type(c).__name__, c.value) if isinstance(c, ExitRule) else c


def _layout(t: torch.Tensor) -> tuple:
    # A package reads its inputs as laid out when it was built: shapes, strides and
    # dtypes are its signature (it checks none of them itself).
    return tuple(t.shape), t.stride(), t.dtype


class AheadOfTimeSteps:
    """The ahead-of-time packages of one model's decode steps (module docstring)."""

    @staticmethod
    def serve(cache, device: torch.device) -> bool:
        """Whether a package can serve a step on this cache (module docstring: where
        they apply; the token step also needs every row of the cache)."""
        return (
            device.type == "cpu"
            and not cache.has_keys
            and not torch.is_autocast_enabled("cpu")
            and not torch.is_grad_enabled()
        )

    def __init__(self, model):
        self.model = model
        self.packages: dict[tuple, Callable] = {}
        self.failed = False  # an export or build failed: the caller's dynamo step from then on
        self._weights = self._weights_now()
        weight_bytes = sum(t.nbytes for _, _, t, _, _ in self._weights)
        self.max_packages = max(MIN_PACKAGES, PACKAGE_BYTES // max(weight_bytes, 1))

    def _weights_now(self) -> list[tuple]:
        """Each parameter and buffer where it is held: its owner's dict, name, tensor,
        version and memory (walking the modules costs ~0.1 ms; checking these, a few µs)."""
        return [
            (owned, name, t, t._version, t.data_ptr())
            for module in self.model.modules()
            for owned in (module._parameters, module._buffers)
            for name, t in owned.items()
            if t is not None
        ]

    def _weights_changed(self) -> bool:
        # A step, load_state_dict or `.data =` changes a version or the memory; a new
        # tensor in the module's place changes what its owner holds.
        return any(
            owned.get(name) is not t or t._version != version or t.data_ptr() != ptr
            for owned, name, t, version, ptr in self._weights
        )

    def token_step(self, step: Callable, cache, tokens: torch.Tensor, readout: bool):
        """step(model, cache, tokens, None, readout) (generate._full_depth_step) for every
        row of the cache: the logits (None without readout), or NotImplemented where no
        package can serve the call (the caller runs its dynamo step)."""
        tokens = tokens.contiguous()  # a column of a (batch, length) table is strided
        outputs = self._run(
            ("token", step, readout), lambda: _TokenStep(self.model, step, cache, readout), [tokens, *_inputs(cache)]
        )
        if outputs is NotImplemented:
            return NotImplemented
        return outputs[0] if readout else None

    def gate_loop(self, fn: Callable, rule, h: torch.Tensor, slots: torch.Tensor, cache, state: tuple):
        """fn(model, rule, h, None, the cache's storage at slots, *state)
        (depth_batching.gate_loop): its outputs (h, exit now, *state), or NotImplemented."""
        return self._run(
            ("gate", fn, _constant(rule)),
            lambda: _GateLoop(self.model, fn, cache, rule, len(state)),
            [h, slots, *state, *_storage(cache)],
        )

    def storage_steps(self, fn: Callable, constants: tuple, inputs: tuple, cache):
        """fn(model, *constants, the cache's storage, *inputs) (depth_batching.depth_steps,
        generate._fused_token_step): its outputs, or NotImplemented."""
        return self._run(
            ("storage", fn, *map(_constant, constants)),
            lambda: _StorageSteps(self.model, fn, cache, constants, len(inputs)),
            [*inputs, *_storage(cache)],
        )

    def _run(self, kind: tuple, module: Callable[[], torch.nn.Module], inputs: list[torch.Tensor]):
        """The package of this kind of step and these inputs' layouts, built from
        module() on first use, run on inputs: its outputs, or NotImplemented."""
        if self._weights_changed():  # trained or loaded since: the packages hold old weights
            self.packages.clear()
            self._weights = self._weights_now()
        key = (*kind, *(_layout(t) for t in inputs))
        if key not in self.packages:
            if self.failed:
                return NotImplemented
            package = self._build(module(), inputs)
            if package is None:
                return NotImplemented
            if len(self.packages) >= self.max_packages:  # the oldest goes (each holds a copy of the weights)
                del self.packages[next(iter(self.packages))]
            self.packages[key] = package
        return self.packages[key](inputs)

    def _build(self, module: torch.nn.Module, inputs: list[torch.Tensor]) -> Callable | None:
        # Exported on copies: tracing runs the step, which would advance the caller's cache.
        example = tuple(t.clone() for t in inputs)  # clone keeps the strides
        try:
            with tempfile.TemporaryDirectory() as folder, warnings.catch_warnings():
                warnings.simplefilter("ignore", FutureWarning)  # torch's own deprecations, about its own code
                exported = torch.export.export(module, example)
                path = torch._inductor.aoti_compile_and_package(exported, package_path=os.path.join(folder, "step.pt2"))
                loader = torch._inductor.aoti_load_package(path).loader
            # The flat call: the package's own __call__ parses its input and output specs
            # (JSON) and walks them every call, about a tenth of a token's time at batch 1;
            # the inputs here are already the flat tensor list it was exported with.
            return lambda flat: loader.boxed_run(flat)
        except Exception as error:  # noqa: BLE001 - any compiler failure: decode with dynamo instead
            self.failed = True
            warnings.warn(
                f"an ahead-of-time decode step did not build ({error}); decoding compiles with dynamo", stacklevel=2
            )
            return None

"""The CPU backend: what makes a small model fast on a CPU, apart from the model's own
definition. C++ kernels for a Mamba-2 block's sequence work and its one-token step
(cpu_sequence.py, cpu_step.py, their .cpp sources, built on first use by native.py),
and decoding's steps compiled ahead of time (ahead_of_time.py). Each kernel is checked
against the definitions in models/ops/reference.py, which the torch ops follow too."""

"""The operations of a Mamba-2 block, apart from the module that holds its weights
(models/mamba2.py), as mamba-ssm keeps its `ops/` apart from its `modules/`.

One job per module:
    ssd.py                   the chunked SSD scan in torch (prefill, training)
    conv.py                  the depthwise causal conv in torch: a sequence, one token
    ssm_step.py              one token of the SSM recurrence in torch (decoding)
    dispatch.py              which runs: mamba-ssm's CUDA kernels, the CPU step, torch
    causal_conv1d_layout.py  the input layout causal-conv1d's CUDA conv accepts
    precision.py             the float32 floor of the numerically delicate parts
    reference.py             the `*_ref` oracles: each op again from its definition,
                             independent of the fast code, for tests and checks

Nothing is re-exported here: an importer names the module it relies on.
"""

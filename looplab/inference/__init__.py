"""Inference: prefill and decoding (generate.py), depth batching (depth_batching.py) and
continuous arrivals (arrivals.py), over the cache of models/cache.py.
"""

"""Evaluation: validation under exit policies (validation.py), the lm-eval adapter
(harness.py) and the paper's task suite (suite.py).
"""

"""Evaluation: validation under exit policies (validation.py), the lm-eval adapter
(harness.py) and the paper's seven tasks (paper_tasks.py).
"""

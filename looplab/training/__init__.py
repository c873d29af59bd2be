"""Training: the loop (train.py), the stages' losses (objectives.py), CHASE's cache holes
(holes.py), data parallelism (distributed.py) and the per-loop instruments (instruments.py).
"""

"""Costs: FLOPs and the resource plan (resources.py), the memory model (memory.py), memory
measured in a child process (measured_memory.py) and wall-clock timing (timing.py).
"""

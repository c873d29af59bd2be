"""Costs: FLOPs and the resource plan (resources.py), the memory model (memory.py), memory
measured in a child process (measured_memory.py), wall-clock timing (timing.py), and this
machine's capacity with the checks that hold a command's plan to it (machine.py).
"""

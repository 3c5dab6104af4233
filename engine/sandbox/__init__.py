"""Running untrusted annotator code: the code checks (checks.py, the first line), the executor seam and
its worker pool (executor.py), the parent's handle on one worker (process.py), and the worker (worker.py).

May import `engine.domain` only. worker.py runs in its own process and imports nothing of numpy.
"""

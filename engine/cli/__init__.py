"""`evopool`: the headless contract. Progress goes to stderr; the last stdout line of each command is JSON.

Exit codes: 0 done; 1 a domain error (bad data, a locked workspace, an LLM refusal...), told in one line on
stderr with no traceback; 2 a usage error (argparse's: a wrong flag or choice, or DATA missing for a new
workspace); 130 interrupted (Ctrl-C: LLM requests in flight are cancelled, what completed is kept).
"""
from engine.cli.main import main

__all__ = ["main"]

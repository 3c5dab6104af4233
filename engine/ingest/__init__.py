"""Reading user files into a workspace: readers, row validation and options (importer.py), splits and
audit rows, labels that differ only in case, spacing or number format (variants.py), and the error types that name
file, row and reason.

May import `engine.domain` and `engine.store`.
"""

"""The DuckDB workspace: `Store` (workspace.py) and its parts (examples, pool, logs), the SQL helpers,
the append-only migrations, and the soft labels a job saves beside the database file.

The only package that imports duckdb. It may import `engine.domain` and nothing else of the engine.
"""

"""Store: one DuckDB file holding studies, runs, jobs, iterations and events.

- `connection`  opening the file (locks, read-only) and transactions
- `catalog`     writers of the studies and runs tables
"""

"""Store: one DuckDB file holding studies, runs, jobs, iterations and events.

- `connection`  opening the file (locks, read-only)
- `schema`      every table's DDL and every migration
- `tx`          transactions: a write of several rows is all or nothing
- `catalog`     writers of the studies and runs tables
- `modules`     a run's encoder modules (`run_modules`, or an older store's `runs.enc_*`) and their text
- `attempts`    which run of a point is its latest attempt, and which earlier runs it supersedes
- `errors`      what can be wrong with a store file, each in one line
"""

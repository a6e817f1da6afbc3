"""Ingest: logs, metrics.jsonl and sacct dumps become rows of the store's iterations and events tables.

- `pipeline`  which files to read, in which transaction, resumed where the last ingest stopped
- `readers`   blocks of complete lines, and the two scanners (compiled `_logscan`, pure Python)
- `logparse`  what a line means: Megatron iteration lines, failure events, rank prefixes
- `staging`   parsed rows staged and merged into the store
"""

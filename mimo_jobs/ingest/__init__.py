"""Ingest: logs, metrics.jsonl and sacct dumps become rows of the store's iterations, events and jobs tables.

- `pipeline`    ingest_paths: each file in its transaction, resumed where the last ingest stopped
- `discover`    which files to read, of which kind, and the run dir each belongs to
- `runs`        the run of each file: registered from run.yaml, or as a run known only from logs
- `readers`     blocks of complete lines; ScanOptions; the two log scanners (compiled, pure Python)
- `_logscan.c`  the compiled scanner: candidate lines found and iteration lines parsed in C
- `lines`       what a candidate log line means (LineHandler: iterations, events, tracebacks)
- `iterline`    Megatron iteration lines: their head and `key: value |` fields
- `events`      event kinds and triggers, one line's events, tracebacks, torchrun's summary, first_error
- `origin`      who wrote a line (srun/torchrun prefixes) and what a log file's path says
- `timestamps`  timestamps in log text
- `metrics`     metrics.jsonl records into rows
- `memory`      per-rank memory facts into `rank_memory`
- `layout`      what `ingest --layout/--model` says about logs produced elsewhere
- `told`        `ingest --layout/--model` resolved into what the store records for them
- `sacct`       sacct output (polled by the SLURM executor, or dumps given to ingest) and its jobs rows
- `staging`     parsed rows staged and merged into the store
"""

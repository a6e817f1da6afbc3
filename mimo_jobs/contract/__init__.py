"""What the trainer and the toolkit share, torch-free and importing nothing else of mimo_jobs but `errors`:
both sides import these modules, neither imports the other.

  iteration   the iteration record (metrics.jsonl) and the phase names
  requeue     the requeue contract: exit code, marker file, log line
  rundir      the run directory's layout and the checkpoint directory (one resolver)
  manifest    the checkpoint manifest format and its torch-free readers
  datastats   the dataset statistics file `data stats` writes and the planner reads
"""

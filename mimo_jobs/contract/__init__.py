"""What the trainer and the toolkit share, torch-free and importing nothing else of mimo_jobs but `errors`:
both sides import these modules, neither imports the other.

  iteration    the iteration record (metrics.jsonl) and the phase names
  requeue      the requeue contract: exit code, marker file, log line
  rundir       the run directory's layout and the checkpoint directory (one resolver)
  submissions  a run directory's record of its submissions and its submission lock
  manifest     the checkpoint manifest format and its torch-free readers
  memory       the memory-facts record each rank writes
  events       the event kinds ingest stores, with each kind's family and retry worth
  jobstates    what each scheduler state means
  datastats    the dataset statistics file `data stats` writes and the planner reads
  opstable     the measured operator table benchmarks/gpu/ops.py writes (`cluster.hardware.ops`)
  mocktokens   the mock data's token ids and the vocabulary they need
  placeholders  each encoder module's placeholder token id, by input kind and vocabulary
  modules      the study's module names against the trainer's slot names (one rule, both ways)
  ports        the rendezvous port of a run alone on one machine (launch.sh and the tests' launches)
"""

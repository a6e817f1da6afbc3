"""The local executor, in one package: `executor` (submit, state, cancel, the job's facts from its state
file) and `runner` (the detached process that runs launch.sh on this machine and records its facts). It has
no study section; its launch artefact is the run's launch.sh."""

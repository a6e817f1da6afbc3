"""Capacity planning before submitting: FLOPs, memory per rank class, iteration time, calibration against
measured runs, and the feasible layouts for a node count. Pure Python (no torch), so `validate`,
`predict` and `plan` start fast; docs/predict.md has the formulas and their sources."""

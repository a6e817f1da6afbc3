"""One process: build the trainer's modules (the --reference build) of each run.yaml given and save, per run,
each module's name, whether it is frozen, its state dict and the optimizer's slots.

`python encoder_modules_worker.py OUT_PT RUN_YAML...`
"""

from __future__ import annotations

import sys
from pathlib import Path


def main(out: str, run_yamls: list[str]) -> None:
    import torch

    from mimo_jobs.trainer.build import build_state
    from mimo_jobs.trainer.main import _init_dist, _install_cpu_shims, _load_run

    _install_cpu_shims()
    states = []
    for i, ry in enumerate(run_yamls):
        run, _doc = _load_run(Path(ry))
        _, timeout = _init_dist(run, True) if i == 0 else (None, None)
        st = build_state(run, run.rank_layout(), True, timeout)
        states.append(
            {
                "modules": [
                    {
                        "name": m.name,
                        "modality": m.modality,
                        "frozen": m.frozen,
                        "state": {
                            k: v.detach().clone() for k, v in m.core.state_dict().items() if v is not None
                        },
                    }
                    for m in st.modules
                ],
                "slots": list(st.optimizer.slots),
                "optimizers": sorted(st.optimizer.optimizers),
            }
        )
    torch.save(states, out)


if __name__ == "__main__":
    main(sys.argv[1], sys.argv[2:])

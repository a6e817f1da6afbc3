"""One training iteration: heterogeneous (encoder ranks | LLM ranks), colocated (every module on every rank,
no bridge) or the one-process reference; one program per rank role, each iterating the model's encoder
modules by name (the batch contract's `LaneBatch.inputs`).

Per iteration the rank draws its microbatches, all-reduces N (the global batch's loss-bearing tokens, so
every rank scales by the same 1/N: gradients do not depend on a module's DP or on which encoder ranks saw
images), runs its program, reduces each module's gradients on the module's own groups and takes the
world-wide optimizer step. Two modules of one input kind (two vision towers) are two entries like any
other: each embeds the sample's images into its own placeholders. The phases are per module
(`<module>_fwd`, `<module>_bwd`); a model of one encoder module records `enc_fwd`/`enc_bwd` (what older
records have).

Modules:
  iteration     one iteration on a rank: LR, data, N, the rank's program, gradient reduction, optimizer step
  common        what the programs share: the LLM's forward with each module's embeddings at its own
                placeholders, a module's forward on its inputs, the data draw and its alignment check
  reference     the one-process reference: each module replica by replica, every lane, no bridge
  colocated     every module and the LLM on each rank of a lane: the LLM's backward, then each module's
                from its embeddings' gradient (each timed apart)
  encoder_rank  a module on ranks of its own: 1F1B across its bridge, saved activations bounded by the
                in-flight count
  llm_stage     an LLM pipeline stage: each module's embeddings over its bridge (first stage), the loss
                (last stage), hidden states and gradients between stages
  dpsync        when the DDP transfers run: the gradient reduce under the last microbatch's backward, the
                parameter all-gather under the next forward (the trainer section's overlaps)
"""

from mimo_jobs.trainer.step.common import PhaseTimer, StepStats
from mimo_jobs.trainer.step.iteration import train_step

__all__ = ["PhaseTimer", "StepStats", "train_step"]

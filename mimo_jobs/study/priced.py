"""Which runs the planner prices: the one rule that predict, validate's memory line and the report's MFU and
predicted-vs-measured figures follow.

A run of the packaged trainer trains trainer.model (the default preset included), so it is priced as that
model. A run of its own command (trainer.command, or a point's) trains whatever that program builds: it is
priced only when the study writes trainer.model, never as the default preset.
"""

from __future__ import annotations

NO_MODEL = "no model given for this command"


def unpriced(run) -> str | None:
    """Why the planner does not price `run` (a runspec.RunSpec; None: it does)."""
    # the run's own command as study/command.py's command_of reads it (imported by neither: runspec needs this)
    if (run.point.command or run.trainer.command) and not run.trainer.model_given:
        return NO_MODEL
    return None

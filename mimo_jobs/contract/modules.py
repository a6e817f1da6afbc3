"""The one rule between the names a study gives its modules and the trainer's own names for them.

A study names each encoder module (`vision`, the one module of `encoder:`; `audio`; ...) and calls the
language model `llm`. The trainer keeps each module under a slot name of its own, the name of its checkpoint
directory, optimizer slot and canonical-init tag, which is also the key of a rank's memory facts
(contract/memory.py): `encoder` for `vision` (the name every single-encoder checkpoint has), `encoder.<name>`
for any other encoder module, `language` for the LLM. The planner prices a one-image-encoder model under the
module `encoder`. What a user reads (the store's rows, the report) names modules as the study does: every
reader turns an internal name into the study's with `study_name`, and the trainer names its slots with
`trainer_slot`. Torch-free.
"""

from __future__ import annotations

from collections.abc import Sequence

# the one module of a study's `encoder:`; model/arch.py's VISION is this name (the model package imports
# nothing of contract: tests/ingest/test_module_names.py holds the two equal)
VISION = "vision"
LLM = "llm"  # the language model's name in a study
TRAINER_ENCODER = "encoder"  # the trainer's slot of `vision`; the planner's one image encoder
TRAINER_LANGUAGE = "language"  # the trainer's slot of the LLM


def trainer_slot(name: str) -> str:
    """The trainer's slot of the module a study names `name` (`llm` -> `language`)."""
    if name == LLM:
        return TRAINER_LANGUAGE
    return TRAINER_ENCODER if name == VISION else f"{TRAINER_ENCODER}.{name}"


def study_name(internal: str, encoders: Sequence[str] = ()) -> str:
    """The study's name of a module the trainer or the planner names `internal`: `language` -> `llm`,
    `encoder.<name>` -> `<name>`, `encoder` -> `vision` (the trainer's slot of it; the planner's one image
    encoder, which is the run's one encoder module when `encoders`, its study's module names, has one
    other than vision). A name the rule does not know (`llm`, a planner's module name) is already the
    study's. Apply it once to a name read from the trainer or the planner: a study may name a module
    `encoder`."""
    if internal == TRAINER_LANGUAGE:
        return LLM
    if internal.startswith(TRAINER_ENCODER + "."):
        return internal[len(TRAINER_ENCODER) + 1 :]
    if internal == TRAINER_ENCODER:
        return encoders[0] if len(encoders) == 1 and VISION not in encoders else VISION
    return internal

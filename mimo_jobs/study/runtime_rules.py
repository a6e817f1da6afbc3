"""Rules the trainer enforces at start-up that a study file already decides: checked by `validate` for every
run and by the trainer's preflight (and the mock provider) on every rank, so validate never passes what the
ranks refuse. One owner each; pure: values in, problems out (`installed` is the only question asked of the
environment, and the caller answers it).
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass

from mimo_jobs.contract.mocktokens import MIN_VOCAB, vocab_problem
from mimo_jobs.contract.placeholders import placeholder_ids
from mimo_jobs.model.attention import keeps_scores


@dataclass(frozen=True)
class RuntimeProblem:
    path: str  # the YAML path of the offending field
    rule: str
    message: str
    fit: str

    def __str__(self) -> str:
        return f"{self.path}: {self.message}; {self.fit}"


def image_size_problems(
    sizes: list[int] | tuple[int, ...],
    unit: int,
    max_size: int,
    seq_length: int,
    text_only: float,
    tokens: Callable[[int], int],
) -> list[RuntimeProblem]:
    """Mock image sides: each a multiple of `unit` (pixels per LLM token along a side: the encoder's patch
    times its downsample) between one unit and the preset's image_size, and small enough to leave two text
    tokens (one to read, one to predict) in a sequence; `tokens(side)` is the LLM tokens of a side x side
    image (the encoder family's token rule)."""
    patch = unit
    out = []
    for s in sizes:
        if s % patch or s > max_size or s < patch:
            out.append(
                RuntimeProblem(
                    "trainer.data.image_sizes",
                    "image-size",
                    f"{s} must be a multiple of the encoder's patch x downsample ({patch} px) between {patch} and the "
                    f"preset's image_size {max_size}",
                    f"use {max(patch, min(max_size, s // patch * patch))}",
                )
            )
            continue
        n = tokens(s)
        if n + 2 > seq_length:
            out.append(
                RuntimeProblem(
                    "trainer.data.image_sizes",
                    "image-size",
                    f"a {s}x{s} image is {n} tokens, which does not fit seq_length={seq_length} with text",
                    f"use smaller images or trainer.seq_length > {n + 1}",
                )
            )
    if not sizes and text_only < 1:
        out.append(
            RuntimeProblem(
                "trainer.data.image_sizes",
                "image-size",
                "is empty but text_only_fraction < 1",
                "give at least one image size, or text_only_fraction: 1",
            )
        )
    return out


def towers_room_problem(
    sizes, tokens: dict[str, Callable[[int, int], int]], seq_length: int, text_only: float, video: int = 0
) -> RuntimeProblem | None:
    """The largest picture's placeholders, plus two text tokens, must fit the sequence: several image
    modules (`tokens`: module -> the LLM tokens of a side x side picture of `video` frames, 0 an image, by
    its family's rule) each fill their own for the same picture, and a video gives each module one image's
    worth per temporal group."""
    if (len(tokens) < 2 and not video) or text_only >= 1 or not sizes:
        return None
    most = max(sum(t(s, video) for t in tokens.values()) for s in sizes)
    if most + 2 <= seq_length:
        return None
    what = f"a {video}-frame video" if video else "the largest image"
    return RuntimeProblem(
        "trainer.data.video_frames" if video else "trainer.data.image_sizes",
        "image-size",
        f"{what} is {most} placeholder tokens over the image modules {', '.join(tokens)}, which does "
        f"not fit seq_length={seq_length} with text",
        f"use {'fewer frames, ' if video else ''}smaller images or trainer.seq_length > {most + 1}",
    )


def video_problems(data, encoders: dict, seq_length: int) -> list[RuntimeProblem]:
    """Mock videos (`video_fraction` of the image samples): frame counts to draw from, an image module to
    embed them, and room in the sequence for the longest one at the largest side."""
    if data.provider != "mock" or not data.video_fraction:
        return []
    images = {n: e for n, e in encoders.items() if e.modality == "image"}
    if not images or not data.video_frames:
        why = "trainer.model has no image module" if not images else "video_frames is empty"
        fit = "add an image module" if not images else "give video_frames, e.g. [4, 8]"
        return [
            RuntimeProblem("trainer.data.video_fraction", "module-data", f"{data.video_fraction}: {why}", fit)
        ]
    tokens = {n: _picture_tokens(e) for n, e in images.items()}
    room = towers_room_problem(
        data.image_sizes, tokens, seq_length, data.text_only_fraction, max(data.video_frames)
    )
    return [room] if room is not None else []


def dataset_video_problem(data, encoders: dict, videos: Callable[[str], int]) -> RuntimeProblem | None:
    """A dataset's videos (`videos(path)`: how many it holds, as `data prepare` recorded) go to the model's
    first image module, which embeds a video's frames only with a temporal patch (temporal_patch_size > 1:
    Qwen2-VL's 3-D patch embedding); a 2-D patch takes images only."""
    if data.provider != "energon" or not data.path:
        return None
    n = videos(str(data.path))
    if not n:
        return None
    image = next(((name, e) for name, e in encoders.items() if e.modality == "image"), None)
    if image is not None and image[1].temporal_patch_size > 1:
        return None
    why = (
        "trainer.model has no image module to embed them"
        if image is None
        else f"the image module {image[0]!r} has temporal_patch_size 1: it embeds images, not a video's frames"
    )
    return RuntimeProblem(
        "trainer.data.path",
        "module-data",
        f"{data.path} holds {n} video(s) but {why}",
        "use an image module with temporal_patch_size: 2 (Qwen2-VL's 3-D patch), or a dataset without videos",
    )


def placeholder_vocab_problem(vocab_size: int, kinds: list[tuple[str, str]]) -> RuntimeProblem | None:
    """The mock data's text ids and every encoder module's placeholder must fit the vocabulary apart: the
    placeholders take ids down from its end (batch.placeholder_ids: the image's the last, the audio's the
    second-to-last, each further module the next free one below), the text the ids from the start
    (contract.mocktokens). `kinds`: [(module, input kind)] in the model's order."""
    ids = placeholder_ids(kinds, vocab_size)
    span = vocab_size - min([vocab_size - 1, *ids.values()])  # ids reserved at the vocabulary's end
    why = vocab_problem(vocab_size - span + 1)  # MIN_VOCAB counts one placeholder
    if why is None:
        return None
    need = MIN_VOCAB + span - 1
    if span > 1:
        why = (
            f"the mock provider needs a vocabulary of at least {need} tokens for its text and the placeholders "
            f"of {', '.join(sorted(ids, key=lambda n: -ids[n]))} ({span} ids at the vocabulary's end), the "
            f"model has {vocab_size}"
        )
    return RuntimeProblem(
        "trainer.model.llm.vocab_size",
        "data",
        why,
        f"use a vocabulary of at least {need} tokens, or real data (trainer.data.provider)",
    )


def clip_room_problem(image_tokens: int, clip_tokens: int, seq_length: int) -> RuntimeProblem | None:
    """A mock sample may carry the largest picture and the longest clip together: their placeholders (each
    summed over the modules of its kind) and two text tokens must fit the sequence."""
    need = image_tokens + clip_tokens + 2
    if not clip_tokens or need <= seq_length:
        return None
    return RuntimeProblem(
        "trainer.seq_length",
        "audio-clip",
        f"{seq_length} cannot hold the largest image ({image_tokens} tokens) and clip ({clip_tokens} tokens) "
        "plus 2 text tokens",
        f"use seq_length >= {need}, or shorter clips or smaller images",
    )


def packing_problem(layers: str, attention: str, fused_softmax: bool) -> RuntimeProblem | None:
    """Packed rows need an attention that honours their block-diagonal mask (trainer/model/packed.py says
    which does, from megatron-core 0.19's sources): not Transformer Engine's causal attention (`layers`
    te), nor the fused causal softmax that megatron-core's unfused DotProductAttention (`attention`
    unfused on the local layers) runs where its kernels are installed (`fused_softmax`)."""
    if layers == "te":
        return RuntimeProblem(
            "trainer.data.packing",
            "packing",
            "Transformer Engine's causal attention ignores the packed rows' block-diagonal mask (it needs "
            "megatron-core's PackedSeqParams, not built)",
            "run packing on the local layers (a GPU without Transformer Engine, or the CPU)",
        )
    if keeps_scores(layers, attention) and fused_softmax:
        return RuntimeProblem(
            "trainer.data.packing",
            "packing",
            "the fused causal softmax of trainer.attention: unfused ignores the packed rows' block-diagonal "
            "mask",
            "use trainer.attention: sdpa (torch's fused attention takes the mask), or run packing where "
            "scaled_masked_softmax_cuda is not installed",
        )
    return None


def freeze_problem(encoder: bool, llm: bool) -> RuntimeProblem | None:
    if encoder and llm:
        return RuntimeProblem(
            "trainer.freeze", "freeze", "has both encoder and llm frozen; nothing to train", "unfreeze one"
        )
    return None


def precision_problem(precision: str, accelerator: str, packaged: bool = True) -> RuntimeProblem | None:
    """bf16 needs a GPU (the packaged trainer's rule); fp8 runs Transformer Engine's fp8 GEMMs, which need a
    GPU whatever the trainer, and the packaged trainer sets no fp8 recipe. `packaged` False: a study's own
    command, whose precision is its own but for what no CPU can do."""
    if precision == "bf16" and accelerator == "cpu" and packaged:
        return RuntimeProblem(
            "trainer.precision", "precision", "bf16 needs accelerator=gpu", "use precision: fp32 on CPU"
        )
    if precision == "fp8" and accelerator == "cpu":
        return RuntimeProblem(
            "trainer.precision",
            "precision",
            "fp8 runs Transformer Engine's fp8 GEMMs, which need a GPU (accelerator=gpu) and Transformer Engine",
            "use precision: fp32 on CPU",
        )
    if precision == "fp8" and packaged:
        return RuntimeProblem(
            "trainer.precision",
            "precision",
            "fp8 is priced by predict and plan, but the packaged trainer runs fp32 or bf16 (it sets no fp8 "
            "recipe)",
            "use precision: bf16, or a trainer.command that runs fp8 with Transformer Engine",
        )
    return None


def tp_overlap_problem(on: bool, accelerator: str, packaged: bool = True) -> RuntimeProblem | None:
    """Tensor-parallel communication overlap is Transformer Engine's userbuffers: GPUs only, and the packaged
    trainer builds none."""
    if not on:
        return None
    if accelerator == "cpu":
        return RuntimeProblem(
            "trainer.tp_comm_overlap",
            "tp-comm-overlap",
            "true needs Transformer Engine's userbuffers on GPUs (accelerator=gpu); only false runs without "
            "Transformer Engine and a GPU",
            "use tp_comm_overlap: false on CPU",
        )
    if packaged:
        return RuntimeProblem(
            "trainer.tp_comm_overlap",
            "tp-comm-overlap",
            "true is priced by predict and plan, but the packaged trainer builds no Transformer Engine "
            "userbuffers: only false runs it",
            "use tp_comm_overlap: false, or a trainer.command that runs it (Megatron's --tp-comm-overlap)",
        )
    return None


def pipeline_split_problem(trainer, packaged: bool = True) -> RuntimeProblem | None:
    """The packaged trainer splits the LLM's layers evenly; megatron-core's flags that count the embedding
    and the loss as layers are for a study's own command (predict and plan price them)."""
    if not packaged or not trainer.pipeline_split_layers:
        return None
    on = [
        f"trainer.{n}"
        for n in ("account_for_embedding_in_pipeline_split", "account_for_loss_in_pipeline_split")
        if getattr(trainer, n)
    ]
    return RuntimeProblem(
        on[0],
        "pipeline-split",
        f"{' and '.join(on)}: true is priced by predict and plan, but the packaged trainer splits the layers "
        "evenly: only false runs it",
        "set them false, or give a trainer.command that runs them (megatron-core's TransformerConfig)",
    )


def device_problems(trainer, accelerator: str, packaged: bool = True) -> list[RuntimeProblem]:
    """The precision, TP overlap and pipeline split rules of one run's trainer section on its accelerator."""
    found = (
        precision_problem(trainer.precision, accelerator, packaged),
        tp_overlap_problem(trainer.tp_comm_overlap, accelerator, packaged),
        pipeline_split_problem(trainer, packaged),
    )
    return [p for p in found if p is not None]


def tracker_problems(trainer, installed: Callable[[str], bool]) -> list[RuntimeProblem]:
    """A dashboard asked for must be installable before any rank starts, not fail at the first log."""
    out = []
    if trainer.wandb is not None and trainer.wandb.mode != "disabled" and not installed("wandb"):
        out.append(
            RuntimeProblem(
                "trainer.wandb",
                "tracker",
                "is set but the wandb package is not installed in this environment",
                "install it (pip install wandb) or set trainer.wandb.mode: disabled",
            )
        )
    if trainer.tensorboard and not installed("tensorboard"):
        out.append(
            RuntimeProblem(
                "trainer.tensorboard",
                "tracker",
                "is true but the tensorboard package is not installed",
                "install it (pip install tensorboard) or set trainer.tensorboard: false",
            )
        )
    return out


def modality_problems(data, encoders: dict) -> list[RuntimeProblem]:
    """Each encoder module needs samples of its modality, and the data's modalities need a module: the mock
    provider's shares say so at once (`text_only_fraction` 1 leaves an image module nothing to embed;
    `audio_fraction` 0 an audio one; audio clips without an audio module have no encoder). A dataset's own
    mix is its statistics' to tell (`data stats`), and the trainer's to find."""
    if data.provider != "mock":
        return []
    out, kinds = [], {}
    for name, arch in encoders.items():
        kinds.setdefault(arch.modality, []).append(name)
    for modality, names in sorted(kinds.items()):
        field, empty, fit = {
            "image": ("text_only_fraction", data.text_only_fraction >= 1, "a text_only_fraction below 1"),
            "audio": (
                "audio_fraction",
                not data.audio_fraction,
                "an audio_fraction above 0 and audio_frames",
            ),
        }.get(modality, (None, False, ""))
        if empty:
            for n in names:
                out.append(
                    RuntimeProblem(
                        f"trainer.data.{field}",
                        "module-data",
                        f"the encoder module {n!r} ({modality}) gets no {modality} from the mock data",
                        f"give the mock data {fit}, or remove the module from trainer.model",
                    )
                )
    if data.audio_fraction and "audio" not in kinds:
        out.append(
            RuntimeProblem(
                "trainer.data.audio_fraction",
                "module-data",
                f"{data.audio_fraction} of the samples carry audio but trainer.model has no audio encoder",
                "set audio_fraction: 0, or add an audio module to trainer.model.encoders",
            )
        )
    return out


def audio_clip_problems(data, encoders: dict) -> list[RuntimeProblem]:
    """Each mock clip length against each audio module's window (the family's token rule refuses a clip
    longer than the encoder takes, or one too short to give a token): the mock provider draws every listed
    length, so one that no module takes fails the job at its first audio sample."""
    if data.provider != "mock" or not data.audio_fraction:
        return []
    out, seen = [], set()
    for encoder in (e for e in encoders.values() if e.modality == "audio"):
        for frames in data.audio_frames:
            try:
                encoder.tokens_for_frames(frames)
            except ValueError as e:  # ArchError: the family's own words, with what would fit
                msg, _, fit = str(e).partition("; ")
                if msg not in seen:
                    seen.add(msg)
                    out.append(RuntimeProblem("trainer.data.audio_frames", "audio-clip", msg, fit))
    return out


def modality_twice_problem(encoders: dict, provider: str) -> RuntimeProblem | None:
    """Two encoder modules of one input kind (two vision towers) each fill placeholders of their own. The
    mock provider gives every module its own; a dataset's samples (energon) carry one placeholder run per
    `<image>`/`<audio>` marker, which the energon provider hands to the first module of that kind only, so
    there the second module would have nothing to embed."""
    if provider == "mock":
        return None
    kinds = [e.modality for e in encoders.values()]
    twice = sorted({k for k in kinds if kinds.count(k) > 1})
    if not twice:
        return None
    names = [n for n, e in encoders.items() if e.modality in twice]
    return RuntimeProblem(
        "trainer.model.encoders",
        "module-kind",
        f"{', '.join(names)} all embed {', '.join(twice)}: a dataset's samples (trainer.data.provider "
        f"{provider}) carry one placeholder run per marker, for one module of each kind",
        "keep one module of each kind with real data, or train the second module of a kind on the mock provider",
    )


def _square_tokens(encoder) -> Callable[[int], int]:
    """The LLM tokens of a side x side image for an image encoder (its family's rule: EncoderArch.tokens_for)."""
    return lambda side: encoder.tokens_for(side, side)


def _picture_tokens(encoder) -> Callable[[int, int], int]:
    """The LLM tokens of a side x side picture of `video` frames (0: an image) for an image encoder: its
    family's rule per temporal group (EncoderArch.video_tokens)."""
    return lambda side, video: (
        encoder.video_tokens(video, side, side) if video else encoder.tokens_for(side, side)
    )


def _clip_room(data, encoders: dict, seq_length: int) -> list[RuntimeProblem]:
    """clip_room_problem for the mock data of a model with an audio module: the largest picture (the
    longest video when there are videos) over the image modules, the longest clip over the audio ones."""
    audio = [e for e in encoders.values() if e.modality == "audio"]
    if data.provider != "mock" or not data.audio_fraction or not audio or not data.audio_frames:
        return []
    images = [_picture_tokens(e) for e in encoders.values() if e.modality == "image"]
    video = max(data.video_frames, default=0) if data.video_fraction else 0
    most_image = max((sum(t(s, video) for t in images) for s in data.image_sizes), default=0)
    most_clip = sum(max(e.tokens_for_frames(f) for f in data.audio_frames) for e in audio)
    room = clip_room_problem(most_image, most_clip, seq_length)
    return [room] if room is not None else []


def runtime_problems(
    trainer,
    accelerator: str,
    installed: Callable[[str], bool],
    model=None,
    videos: Callable[[str], int] = lambda _path: 0,
    layers: str | None = None,
) -> list[RuntimeProblem]:
    """Every start-up rule above for one run's trainer section (a spec.TrainerSpec) on its accelerator;
    with `model` (the resolved ModelArch) also the rules of its modules: each image module's mock image
    sizes (patch_size, image_size), each module's data of its kind, the mock data's vocabulary, a dataset's
    videos (`videos`: the caller's answer of how many a dataset holds, data.check.prepared_videos). `layers`:
    the layers a GPU run is planned on (cluster.hardware.layers), for the packing rule; the trainer asks it
    of the layers it built (trainer/model/packed.py), whose fused softmax only its host can tell."""
    llm = None if model is None else model.llm
    packing = None
    if trainer.data.packing and layers is not None:
        packing = packing_problem(layers if accelerator == "gpu" else "local", trainer.attention, False)
    frozen = freeze_problem(trainer.freeze.every_encoder(trainer.model), trainer.freeze.llm)
    out = [p for p in (frozen, packing) if p is not None] + device_problems(trainer, accelerator)
    encoders = {} if model is None else model.encoders
    if llm is not None and trainer.data.provider == "mock":
        kinds = [(n, e.modality) for n, e in encoders.items()] or [("vision", "image")]
        vocab = placeholder_vocab_problem(llm.vocab_size, kinds)
        out += [vocab] if vocab is not None else []
    if trainer.data.provider == "mock":
        d = trainer.data
        images = {n: e for n, e in encoders.items() if e.modality == "image"}
        for encoder in images.values():
            out += image_size_problems(
                d.image_sizes,
                encoder.patch_size * encoder.downsample,
                encoder.image_size,
                trainer.seq_length,
                d.text_only_fraction,
                _square_tokens(encoder),
            )
        tokens = {n: _picture_tokens(e) for n, e in images.items()}
        room = towers_room_problem(d.image_sizes, tokens, trainer.seq_length, d.text_only_fraction)
        out += [room] if room is not None and not out else []
    if model is not None:
        twice = modality_twice_problem(encoders, trainer.data.provider)
        out += [twice] if twice else []
        out += modality_problems(trainer.data, encoders)
        clips = audio_clip_problems(trainer.data, encoders)
        out += clips or _clip_room(trainer.data, encoders, trainer.seq_length)
        out += video_problems(trainer.data, encoders, trainer.seq_length)
        held = dataset_video_problem(trainer.data, encoders, videos)
        out += [held] if held else []
    return out + tracker_problems(trainer, installed)


def package_installed(name: str) -> bool:
    """The environment's answer for `installed` (no import: finding the package is enough)."""
    import importlib.util

    return importlib.util.find_spec(name) is not None

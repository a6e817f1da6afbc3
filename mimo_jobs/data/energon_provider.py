"""The trainer's Provider on megatron-energon: each LLM DP lane is one deterministic sample stream.

Placement: lane j's samples come from WorkerConfig(rank=j, world_size=llm_dp,
seed_offset=trainer.seed). An LLM rank builds the loader of its own lane; the encoder replica serving lanes
[i*k, (i+1)*k) reads exactly those k lanes (fan-in: the one lane it helps); the one-process reference reads
all. A provider with several lanes reads them through ONE multiplexed loader (mux.py: its worker count does
not grow with the lanes), which yields each lane exactly the samples of that lane's own loader. Same
dataset, same WorkerConfig, same TaskEncoder logic -> identical keys in identical order on both sides of
the bridge. Only encoder ranks (need_images) decode pixels.

State: the energon loader state (pickled to bytes so any checkpoint format can hold it; read back as data
only, loader_state.py), per lane or of the
multiplexed loader, plus per lane the count of microbatches consumed and the counted outcomes
(skips/truncations) so totals survive a restart.
"""

from __future__ import annotations

import contextlib
import logging
import weakref
from dataclasses import asdict, dataclass, field
from typing import Any, Literal

from mimo_jobs.data.batch import LaneBatch, ModuleInputs, Provider, audio_token_id, placeholder_ids

from . import loader_state
from .audio import AudioSpec, audio_spec_of
from .check import check_data_path
from .errors import DataError
from .images import ImageGeometry, geometry_of_data
from .tokenizer import load_tokenizer

log = logging.getLogger("mimo_jobs.data")

STATE_FORMAT = 1
LOG_FIRST, LOG_EVERY = (
    20,
    100,
)  # bad-sample log lines: the first 20 per lane, then every 100th (counts are exact)


def image_token_id(vocab_size: int) -> int:
    """The image placeholder: the last vocabulary entry, as in the trainer's mock provider
    (mimo_jobs.data.mock.image_token_id); the LLM scatters image embeddings where tokens == this id."""
    return vocab_size - 1


@dataclass(frozen=True)
class LoaderConfig:
    """Everything that determines a lane's sample stream (pure data; from the run spec)."""

    path: str
    llm_dp: int
    mbs: int
    num_microbatches: int
    seq_length: int
    geometry: ImageGeometry | None  # the image module's; None: no image module, images are refused
    vocab_size: int
    image_token_id: int = -1  # -1: image_token_id(vocab_size)
    tokenizer: str | None = None
    num_workers: int = 0
    seed: int = 0
    on_bad_sample: Literal["error", "skip"] = "error"
    truncate_text: bool = False
    shuffle_buffer_size: int | None = 100
    max_samples_per_sequence: int | None = 100
    packing: bool = False  # several samples per row (task_encoder.PackingTaskEncoder)
    packing_buffer_size: int = 32  # samples the packer chooses among at a time
    audio: AudioSpec | None = None  # the model's audio encoder (token rule); None: clips are refused
    trust_dataset_code: bool = False  # the dataset's own .nv-meta loader code may run (check.py)
    # the model's encoder modules, (name, input kind) in the model's order; a dataset's images go to its image
    # module, its clips to its audio module (one module of each kind: study.runtime_rules). Empty: an image
    # module "vision" when `geometry` is set, an audio module "audio" when `audio` is
    modules: tuple = ()

    def module_kinds(self) -> list[tuple[str, str]]:
        if self.modules:
            return [tuple(m) for m in self.modules]
        own = [("vision", "image")] if self.geometry is not None else []
        return own + ([("audio", "audio")] if self.audio is not None else [])

    @classmethod
    def from_run(cls, run_spec: Any, plan: Any) -> LoaderConfig:
        from mimo_jobs.model.resolve import arch_of

        tr = run_spec.trainer
        d = tr.data
        preset = arch_of(tr.model)
        return cls(
            path=str(d.path),
            llm_dp=plan.layout.llm_dp,
            mbs=plan.layout.mbs,
            num_microbatches=plan.num_microbatches,
            seq_length=tr.seq_length,
            geometry=geometry_of_data(tr.model, d),
            vocab_size=preset.llm.vocab_size,
            image_token_id=image_token_id(preset.llm.vocab_size),
            tokenizer=d.tokenizer,
            num_workers=d.num_workers,
            seed=tr.seed,
            on_bad_sample=d.on_bad_sample,
            truncate_text=d.truncate_text,
            shuffle_buffer_size=d.shuffle_buffer_size,
            max_samples_per_sequence=d.max_samples_per_sequence,
            packing=d.packing,
            packing_buffer_size=d.packing_buffer_size,
            audio=audio_spec_of(preset),
            trust_dataset_code=d.trust_dataset_code,
            modules=tuple((n, e.modality) for n, e in preset.encoders.items()),
        )


@dataclass
class LaneTotals:
    microbatches: int = 0
    samples: int = 0
    image_samples: int = 0
    truncated: int = 0
    skipped: dict[str, int] = field(default_factory=dict)  # reason -> count
    audio_samples: int = 0  # samples with at least one audio clip

    @property
    def skipped_total(self) -> int:
        return sum(self.skipped.values())

    def merge(self, o: LaneTotals) -> LaneTotals:
        sk = dict(self.skipped)
        for k, v in o.skipped.items():
            sk[k] = sk.get(k, 0) + v
        return LaneTotals(
            self.microbatches + o.microbatches,
            self.samples + o.samples,
            self.image_samples + o.image_samples,
            self.truncated + o.truncated,
            sk,
            self.audio_samples + o.audio_samples,
        )


def _lane_dataset(lane: int, cfg: LoaderConfig, enc_cfg: Any, tokenizer: Any) -> Any:
    """Lane `lane`'s energon dataset (batched, task-encoded, repeating), with its own WorkerConfig and task
    encoder: what its own loader iterates and what the multiplexed loader (mux.py) steps for it."""
    from megatron.energon import WorkerConfig, get_train_dataset
    from megatron.energon.flavors.webdataset.empty_dataset_error import EmptyDatasetError

    from .task_encoder import make_task_encoder

    encoder = make_task_encoder(tokenizer, enc_cfg)

    def restore_error(e: Exception, sample: Any, sources: Any = None) -> None:
        raise DataError(
            f"lane {lane}: could not restore a sample from the checkpointed loader state: "
            f"{type(e).__name__}: {e}"
        ) from e

    # energon's default handler logs and skips; ours raises or counts (see MimoTaskEncoder.on_error)
    worker_config = WorkerConfig(
        rank=lane,
        world_size=cfg.llm_dp,
        num_workers=cfg.num_workers,
        seed_offset=cfg.seed,
        global_error_handler=encoder.on_error,
        restore_error_handler=restore_error,
    )
    try:
        return get_train_dataset(
            cfg.path,
            worker_config=worker_config,
            batch_size=cfg.mbs,
            shuffle_buffer_size=cfg.shuffle_buffer_size,
            max_samples_per_sequence=cfg.max_samples_per_sequence,
            task_encoder=encoder,
            packing_buffer_size=cfg.packing_buffer_size if cfg.packing else None,
            repeat=True,
        )
    except EmptyDatasetError as e:
        raise DataError(
            f"trainer.data.path={cfg.path!r}: the train split is empty for lane {lane} of "
            f"{cfg.llm_dp} ({e}); add samples/shards or use fewer LLM DP lanes"
        ) from None


def _too_small(lanes: list[int], cfg: LoaderConfig, e: Exception) -> DataError:
    return DataError(
        f"lanes {lanes}: no samples ({e}); the dataset is too small for "
        f"{cfg.llm_dp} lanes x {max(1, cfg.num_workers)} workers"
    )


class _Lane:
    """One lane's own loader (an LLM rank's single lane, or the reader a provider uses per lane when not
    multiplexed)."""

    def __init__(self, lane: int, cfg: LoaderConfig, enc_cfg: Any, tokenizer: Any):
        from megatron.energon import get_savable_loader

        self.lane = lane
        self.lanes = [lane]
        self.cfg = cfg
        self.loader = get_savable_loader(_lane_dataset(lane, cfg, enc_cfg, tokenizer))
        self.it = None

    @property
    def started(self) -> bool:
        return self.it is not None

    def next(self, lane: int) -> Any:
        from megatron.energon.flavors.webdataset.empty_dataset_error import EmptyDatasetError

        if self.it is None:
            self.it = iter(self.loader)
        try:
            return next(self.it)
        except EmptyDatasetError as e:
            raise _too_small(self.lanes, self.cfg, e) from None

    def save(self) -> dict:
        # Safe with workers: the iterator (if any) has yielded at least once (pitfall: saving between
        # iter() and the first next() hangs); without an iterator energon returns None = initial state.
        return {"loader": loader_state.dumps(self.loader.save_state_rank())}

    def restore(self, state: dict) -> None:
        self.loader.restore_state_rank(loader_state.loads(state["loader"]))

    def close(self) -> None:
        from .mux import stop_loader

        stop_loader(self.it, self.loader)
        self.it = None


class _Mux:
    """The lanes' batches from one multiplexed loader (mux.MuxReader): its worker count and open shards do
    not grow with the number of lanes."""

    def __init__(self, lanes: list[int], cfg: LoaderConfig, enc_cfg: Any, tokenizer: Any):
        from megatron.energon import WorkerConfig

        from .mux import MuxReader

        self.lanes = list(lanes)
        self.cfg = cfg
        datasets = [_lane_dataset(x, cfg, enc_cfg, tokenizer) for x in lanes]
        # the loader's own config: worker count and the worker processes' global seeds (those of the first
        # lane's own loader); failures outside a lane's pipeline are raised, never skipped
        carrier = WorkerConfig(
            rank=lanes[0], world_size=cfg.llm_dp, num_workers=cfg.num_workers, seed_offset=cfg.seed
        )
        self.reader = MuxReader(datasets, lanes, carrier)

    @property
    def started(self) -> bool:
        return self.reader.started

    def next(self, lane: int) -> Any:
        from megatron.energon.flavors.webdataset.empty_dataset_error import EmptyDatasetError

        try:
            return self.reader.next(lane)
        except EmptyDatasetError as e:
            raise _too_small(self.lanes, self.cfg, e) from None

    def save(self) -> dict:
        return self.reader.save()

    def restore(self, state: dict) -> None:
        self.reader.restore(state)

    def close(self) -> None:
        self.reader.close()


class EnergonProvider(Provider):
    def __init__(
        self,
        cfg: LoaderConfig,
        lanes: list[int],
        need_images: bool,
        need_text: bool = True,
        image_slice: tuple[int, int] | None = None,
        multiplex: bool | None = None,
        need_audio: bool | None = None,
    ):
        """`multiplex`: read all `lanes` from one loader (mux.py) rather than one loader per lane; the
        default multiplexes whenever there is more than one lane (same samples either way). `need_audio`:
        load the audio clips (None: where the images are decoded)."""
        from .task_encoder import EncodeConfig

        check_data_path(cfg.path, cfg.trust_dataset_code)
        bad = [x for x in lanes if not 0 <= x < cfg.llm_dp]
        if bad or not lanes:
            raise DataError(f"lanes {lanes} must be a non-empty subset of [0, llm_dp={cfg.llm_dp})")
        self.cfg = cfg
        self.lanes = list(lanes)
        self.need_images = need_images
        self.need_text = need_text  # text is always tokenized: both sides need identical skip decisions
        img_id = cfg.image_token_id if cfg.image_token_id >= 0 else image_token_id(cfg.vocab_size)
        aud_id = audio_token_id(cfg.vocab_size) if cfg.audio is not None else None
        self.tokenizer = load_tokenizer(cfg.tokenizer, cfg.vocab_size, img_id, aud_id)
        self.image_token_id = self.tokenizer.image_token_id
        self.audio_token_id = self.tokenizer.audio_token_id
        own = {"image": self.image_token_id, "audio": self.audio_token_id}
        self.kinds = dict(cfg.module_kinds())
        self.placeholders = placeholder_ids(list(self.kinds.items()), cfg.vocab_size, own)
        self.enc_cfg = EncodeConfig(
            seq_length=cfg.seq_length,
            geometry=cfg.geometry,
            need_images=need_images,
            on_bad_sample=cfg.on_bad_sample,
            truncate_text=cfg.truncate_text,
            image_slice=image_slice,
            packing=cfg.packing,
            audio=cfg.audio,
            need_audio=need_audio,
        )
        self.multiplex = len(self.lanes) > 1 if multiplex is None else multiplex
        self._readers: list[_Lane | _Mux] = []
        self._build_readers()
        self._totals = {x: LaneTotals() for x in self.lanes}
        # Workers end when the provider is closed, collected, or at interpreter exit (the trainer need not
        # call close(); without this each worker costs a 5 s join timeout at exit).
        self._finalizer = weakref.finalize(self, _close_readers, self._readers)

    def _build_readers(self) -> None:
        """(Re)build the loaders in place (the finalizer holds this list): one multiplexed loader, or one
        loader per lane."""
        if self.multiplex:
            new = [_Mux(self.lanes, self.cfg, self.enc_cfg, self.tokenizer)]
        else:
            new = [_Lane(x, self.cfg, self.enc_cfg, self.tokenizer) for x in self.lanes]
        self._readers[:] = new
        self._reader_of = {x: r for r in new for x in r.lanes}

    # ------------------------------------------------------------ Provider

    def next(self, lane: int) -> LaneBatch:
        try:
            reader = self._reader_of[lane]
        except KeyError:
            raise DataError(f"this provider serves lanes {self.lanes}, not lane {lane}") from None
        b = reader.next(lane)
        t = self._totals[lane]
        n = t.microbatches
        t.microbatches += 1
        t.samples += len(b.image_token_counts)
        t.image_samples += sum(1 for c in b.image_token_counts if c)
        t.audio_samples += sum(1 for c in b.audio_token_counts if c)
        for e in b.events:
            if e["kind"] == "skipped":
                t.skipped[e["reason"]] = t.skipped.get(e["reason"], 0) + 1
                n_kind = t.skipped_total
            else:
                t.truncated += 1
                n_kind = t.truncated
            # every event is counted; the log names the first ones and then one line per LOG_EVERY
            if n_kind <= LOG_FIRST or n_kind % LOG_EVERY == 0:
                log.warning(
                    "data lane %d: %s sample %r in shard %s (%s); %d %s so far on this lane",
                    lane,
                    e["kind"],
                    e["key"],
                    e["shard"],
                    e["detail"],
                    n_kind,
                    e["kind"],
                )
        nmb = self.cfg.num_microbatches
        return LaneBatch(
            lane=lane,
            step=n // nmb,
            microbatch=n % nmb,
            sample_keys=list(b.__key__),
            tokens=b.tokens,
            labels=b.labels,
            loss_mask=b.loss_mask,
            position_ids=b.position_ids,
            segment_ids=b.segment_ids,
            inputs=self._module_inputs(b),
            meta={
                "events": list(b.events),
                "image_token_id": self.image_token_id,
                "audio_token_id": self.audio_token_id,
                "subflavors": list(b.__subflavors__ or []),
            },
        )

    def _module_inputs(self, b) -> dict:
        """The task encoder's batch (one image field, one audio field) as the contract's per-module entries:
        the images to the image module, the clips to the audio module."""
        fields = {
            "image": (b.image_token_counts, b.images if self.need_images else None),
            "audio": (b.audio_token_counts, b.audio),
        }
        out = {}
        for name, kind in self.kinds.items():
            counts, items = fields[kind]
            out[name] = ModuleInputs(
                self.placeholders[name], list(counts), list(items) if items is not None else None
            )
        return out

    def state_dict(self) -> dict:
        lanes = {x: {"totals": asdict(self._totals[x])} for x in self.lanes}
        mux = None
        if self.multiplex:
            mux = self._readers[0].save()
        else:
            for r in self._readers:
                lanes[r.lane].update(r.save())
        return {
            "format": STATE_FORMAT,
            "kind": "energon",
            "path": self.cfg.path,
            "num_workers": self.cfg.num_workers,
            "llm_dp": self.cfg.llm_dp,
            "mbs": self.cfg.mbs,
            "seed": self.cfg.seed,
            "lanes": lanes,  # per lane: counted totals, and its loader state unless multiplexed
            "mux": mux,  # the multiplexed loader's state (mux.MuxReader.save), or None
        }

    def load_state_dict(self, state: dict) -> None:
        if state.get("kind") != "energon" or state.get("format") != STATE_FORMAT:
            raise DataError(
                f"checkpointed data state is {state.get('kind')!r} format {state.get('format')!r}; "
                f"this run reads energon format {STATE_FORMAT}"
            )
        for k in ("num_workers", "llm_dp", "mbs", "seed"):
            if state[k] != getattr(self.cfg, k):
                raise DataError(
                    f"checkpointed data state was saved with {k}={state[k]}, this run has "
                    f"{getattr(self.cfg, k)}: resume with the same value (the sample order depends on it)"
                )
        missing = [x for x in self.lanes if x not in state["lanes"]]
        if missing:
            raise DataError(f"checkpointed data state has lanes {sorted(state['lanes'])}, missing {missing}")
        saved_mux = state.get("mux") is not None
        if saved_mux != self.multiplex:
            how = {True: "one multiplexed loader", False: "one loader per lane"}
            raise DataError(
                f"checkpointed data state was saved by {how[saved_mux]}, this provider reads lanes "
                f"{self.lanes} with {how[self.multiplex]}: resume with the same layout"
            )
        if any(r.started for r in self._readers):  # energon restores only before iterating: start afresh
            _close_readers(self._readers)
            self._build_readers()
        if self.multiplex:
            self._readers[0].restore(state["mux"])
        else:
            for r in self._readers:
                r.restore(state["lanes"][r.lane])
        self._totals = {x: LaneTotals(**state["lanes"][x]["totals"]) for x in self.lanes}

    # ------------------------------------------------------------ extras

    def totals(self) -> LaneTotals:
        out = LaneTotals()
        for t in self._totals.values():
            out = out.merge(t)
        return out

    def lane_totals(self, lane: int) -> LaneTotals:
        return self._totals[lane]

    def close(self) -> None:
        self._finalizer()


def _close_readers(readers: list) -> None:
    for r in readers:
        with contextlib.suppress(Exception):  # at interpreter exit workers may already be gone
            r.close()


def make_energon_provider(
    run_spec: Any,
    plan: Any,
    lanes: list[int],
    need_images: bool,
    need_text: bool,
    image_slice: tuple[int, int] | None = None,
) -> EnergonProvider:
    """The trainer's entry point (mimo_jobs.data.mock.make_provider, provider 'energon')."""
    return EnergonProvider(LoaderConfig.from_run(run_spec, plan), lanes, need_images, need_text, image_slice)

"""A training program of its own, written directly on megatron-core (nothing from mimo_jobs): the stand-in for
a team's existing script in the tests of `trainer.command`.

It reads its layout from its command line with Megatron-LM's argument names, trains a tiny GPT on mock
tokens with gloo on CPU under torchrun (tensor parallel x data parallel), prints Megatron-LM's iteration
lines and "successfully saved checkpoint from iteration N" lines, saves in Megatron's legacy layout
(iter_NNNNNNN/mp_rank_TT/model_optim_rng.pt, then latest_checkpointed_iteration.txt), and resumes from
--load. It keeps the requeue contract of docs/external-trainer.md: on SIGUSR2/SIGTERM, or a minute before
MIMO_JOB_DEADLINE, it saves, writes MIMO_JOBS_REQUEUE_MARKER (when set) and exits.

Run: torchrun --nproc-per-node 2 megatron_gpt_trainer.py --tensor-model-parallel-size 1 --global-batch-size 4
     --micro-batch-size 1 --seq-length 16 --train-iters 5 --save ck --load ck
"""

from __future__ import annotations

import argparse
import datetime
import json
import os
import signal
import sys
import time

os.environ.setdefault("CUDA_VISIBLE_DEVICES", "")  # a CPU program: never touch a GPU that may be visible

import torch  # noqa: E402
import torch.distributed as dist  # noqa: E402

DEADLINE_MARGIN_S = float(os.environ.get("MIMO_JOB_DEADLINE_MARGIN_S", "60"))


def parse(argv: list[str]) -> argparse.Namespace:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--tensor-model-parallel-size", type=int, default=1)
    p.add_argument("--pipeline-model-parallel-size", type=int, default=1)
    p.add_argument("--expert-model-parallel-size", type=int, default=1)
    p.add_argument("--global-batch-size", type=int, required=True)
    p.add_argument("--micro-batch-size", type=int, default=1)
    p.add_argument("--seq-length", type=int, required=True)
    p.add_argument("--train-iters", type=int, required=True)
    p.add_argument("--save", required=True)
    p.add_argument("--load", default=None)
    p.add_argument("--save-interval", type=int, default=None)
    p.add_argument("--log-interval", type=int, default=1)
    p.add_argument("--seed", type=int, default=1234)
    p.add_argument("--lr", type=float, default=1e-3)
    p.add_argument("--sleep-per-iter", type=float, default=0.0, help="stretch iterations (time-limit tests)")
    p.add_argument(
        "--sleep-until-resumed",
        action="store_true",
        help="stretch iterations only while no checkpoint was loaded (a resumed attempt runs at full speed)",
    )
    p.add_argument(
        "--no-requeue-contract",
        action="store_true",
        help="ignore warning signals and the deadline, like a program that only saves periodically",
    )
    a = p.parse_args(argv)
    if a.pipeline_model_parallel_size != 1 or a.expert_model_parallel_size != 1:
        p.error("this small trainer runs tensor x data parallel only (PP=1, EP=1)")
    return a


def install_cpu_shims() -> None:
    """megatron-core asks torch.cuda for RNG states and the current device; on a CPU build those are the
    CPU generator and device 'cpu'."""
    torch.cuda.get_rng_state = lambda *a, **k: torch.get_rng_state()
    torch.cuda.set_rng_state = lambda state, *a, **k: torch.set_rng_state(state)
    torch.cuda.manual_seed = lambda seed: None
    torch.cuda.current_device = lambda: "cpu"

    import megatron.core.tensor_parallel.random as R

    R._get_cuda_rng_state = lambda device="cuda", clone=False, graph_safe=False: torch.get_rng_state()
    R._set_cuda_rng_state = lambda new_state, device=-1, graph_safe=False: torch.set_rng_state(new_state)


class Stop:
    """Why the loop should stop early: a warning signal, or the job's deadline drawing near."""

    def __init__(self, enabled: bool) -> None:
        self.signalled = 0
        deadline = os.environ.get("MIMO_JOB_DEADLINE") if enabled else None
        self.deadline = float(deadline) if deadline else None
        if enabled:
            for sig in (signal.SIGUSR2, signal.SIGTERM):
                signal.signal(sig, self._on_signal)

    def _on_signal(self, signum, frame) -> None:
        self.signalled = signum

    def now(self) -> bool:
        """Every rank agrees (a signal may reach only some of them)."""
        near = self.deadline is not None and time.time() > self.deadline - DEADLINE_MARGIN_S
        flag = torch.tensor([1 if (self.signalled or near) else 0])
        dist.all_reduce(flag, op=dist.ReduceOp.MAX)
        return bool(flag.item())


def ckpt_file(root: str, iteration: int, tp_rank: int) -> str:
    return os.path.join(root, f"iter_{iteration:07d}", f"mp_rank_{tp_rank:02d}", "model_optim_rng.pt")


def save(args, model, opt, iteration: int, consumed: int) -> None:
    from megatron.core import parallel_state as ps

    tp_rank = ps.get_tensor_model_parallel_rank()
    if ps.get_data_parallel_rank() == 0:
        path = ckpt_file(args.save, iteration, tp_rank)
        os.makedirs(os.path.dirname(path), exist_ok=True)
        state = {"model": model.state_dict(), "optimizer": opt.state_dict(), "iteration": iteration}
        torch.save({**state, "consumed_samples": consumed, "rng": torch.get_rng_state()}, path + ".tmp")
        os.replace(path + ".tmp", path)
    dist.barrier()
    if dist.get_rank() == 0:  # the tracker file last: a save is complete once it names the iteration
        tracker = os.path.join(args.save, "latest_checkpointed_iteration.txt")
        with open(tracker + ".tmp", "w") as f:
            f.write(str(iteration))
        os.replace(tracker + ".tmp", tracker)
        print(
            f"  successfully saved checkpoint from iteration {iteration:7d} to {args.save} "
            f"[ t {tp_rank + 1}/{ps.get_tensor_model_parallel_world_size()}, p 1/1 ]",
            flush=True,
        )
    dist.barrier()


def load(args, model, opt) -> tuple[int, int]:
    from megatron.core import parallel_state as ps

    if not args.load:
        return 0, 0
    try:
        with open(os.path.join(args.load, "latest_checkpointed_iteration.txt")) as f:
            iteration = int(f.read().strip())
    except (OSError, ValueError):
        if dist.get_rank() == 0:
            print(
                f" WARNING: could not find the metadata file {args.load}; training from scratch", flush=True
            )
        return 0, 0
    state = torch.load(
        ckpt_file(args.load, iteration, ps.get_tensor_model_parallel_rank()), weights_only=False
    )
    model.load_state_dict(state["model"])
    opt.load_state_dict(state["optimizer"])
    if dist.get_rank() == 0:
        print(
            f"  successfully loaded checkpoint from {args.load} [ t 1/1, p 1/1 ] at iteration {iteration}",
            flush=True,
        )
    return iteration, state["consumed_samples"]


def mock_batch(args, iteration: int, micro: int, dp_rank: int, dp: int, vocab: int) -> torch.Tensor:
    """Tokens of one microbatch: a fixed function of (seed, iteration, sample), so a resumed run sees the same
    data; sequences count upward modulo the vocabulary so the loss can fall."""
    g = torch.Generator().manual_seed(args.seed * 1_000_003 + iteration * 10_007 + micro * dp + dp_rank)
    start = torch.randint(0, vocab, (args.micro_batch_size, 1), generator=g)
    return (start + torch.arange(args.seq_length + 1)) % vocab


def main(argv: list[str]) -> int:
    args = parse(argv)
    dist.init_process_group("gloo", timeout=datetime.timedelta(seconds=120))
    install_cpu_shims()
    from megatron.core import parallel_state as ps
    from megatron.core import tensor_parallel
    from megatron.core.models.gpt import GPTModel
    from megatron.core.models.gpt.gpt_layer_specs import get_gpt_layer_local_spec
    from megatron.core.transformer import TransformerConfig

    world, tp = dist.get_world_size(), args.tensor_model_parallel_size
    if world % tp:
        raise SystemExit(f"world size {world} is not a multiple of --tensor-model-parallel-size {tp}")
    ps.initialize_model_parallel(tensor_model_parallel_size=tp)
    dp, dp_rank = ps.get_data_parallel_world_size(), ps.get_data_parallel_rank()
    if args.global_batch_size % (args.micro_batch_size * dp):
        raise SystemExit(f"--global-batch-size {args.global_batch_size} is not divisible by mbs*dp")
    micros = args.global_batch_size // (args.micro_batch_size * dp)
    torch.manual_seed(args.seed)
    tensor_parallel.model_parallel_cuda_manual_seed(args.seed)
    vocab = 64
    cfg = TransformerConfig(
        num_layers=2,
        hidden_size=32,
        num_attention_heads=4,
        tensor_model_parallel_size=tp,
        use_cpu_initialization=True,
        hidden_dropout=0.0,
        attention_dropout=0.0,
        params_dtype=torch.float32,
    )
    model = GPTModel(
        config=cfg,
        transformer_layer_spec=get_gpt_layer_local_spec(),
        vocab_size=vocab,
        max_sequence_length=args.seq_length,
    )
    opt = torch.optim.Adam(model.parameters(), lr=args.lr)
    params = sum(p.numel() for p in model.parameters()) * tp
    if dist.get_rank() == 0:
        print(
            f"using world size: {world}, data-parallel size: {dp}, context-parallel size: 1, "
            f"tensor-model-parallel size: {tp}, pipeline-model-parallel size: 1",
            flush=True,
        )
    start, consumed = load(args, model, opt)
    stop = Stop(enabled=not args.no_requeue_contract)
    # given explicitly: megatron-core's default causal mask is built on device 'cuda' (True = masked)
    causal = torch.triu(torch.ones(1, 1, args.seq_length, args.seq_length, dtype=torch.bool), diagonal=1)
    for it in range(start + 1, args.train_iters + 1):
        t0 = time.time()
        opt.zero_grad()
        total = torch.zeros(1)
        for m in range(micros):
            tokens = mock_batch(args, it, m, dp_rank, dp, vocab)
            inp, labels = tokens[:, :-1].contiguous(), tokens[:, 1:].contiguous()
            pos = torch.arange(args.seq_length).unsqueeze(0).expand_as(inp)
            loss = model(inp, pos, causal, labels=labels).float().mean() / micros
            loss.backward()
            total += loss.detach()
        for p in model.parameters():  # data-parallel gradient average
            if p.grad is not None:
                dist.all_reduce(p.grad, group=ps.get_data_parallel_group())
                p.grad /= dp
        norm = float(torch.nn.utils.clip_grad_norm_(model.parameters(), 1.0))
        opt.step()
        dist.all_reduce(total, group=ps.get_data_parallel_group())
        consumed += args.global_batch_size
        if start == 0 or not args.sleep_until_resumed:
            time.sleep(args.sleep_per_iter)
        dt = time.time() - t0
        if dist.get_rank() == 0 and it % args.log_interval == 0:
            tflops = 6 * params * args.global_batch_size * args.seq_length / dt / world / 1e12
            stamp = datetime.datetime.now().strftime("%Y-%m-%d %H:%M:%S")
            print(
                f" [{stamp}] iteration {it:8d}/{args.train_iters:8d} | consumed samples: {consumed:12d} | "
                f"elapsed time per iteration (ms): {dt * 1000:.1f} | throughput per GPU (TFLOP/s/GPU): "
                f"{tflops:.6f} | learning rate: {args.lr:.6E} | global batch size: {args.global_batch_size:5d} | "
                f"lm loss: {float(total) / dp:.6E} | loss scale: 1.0 | grad norm: {norm:.3f} | "
                "number of skipped iterations:   0 | number of nan iterations:   0 |",
                flush=True,
            )
        saved = bool(args.save_interval and it % args.save_interval == 0 and it < args.train_iters)
        if saved:
            save(args, model, opt, it, consumed)
        if it < args.train_iters and stop.now():
            if not saved:
                save(args, model, opt, it, consumed)
            marker = os.environ.get("MIMO_JOBS_REQUEUE_MARKER")
            if marker and dist.get_rank() == 0:
                with open(marker, "w") as f:
                    json.dump({"iteration": it, "signal": stop.signalled or None}, f)
            if dist.get_rank() == 0:
                print(f"exiting program at iteration {it} to be requeued", flush=True)
            dist.barrier()
            dist.destroy_process_group()
            return 0
    save(args, model, opt, args.train_iters, consumed)
    dist.destroy_process_group()
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))

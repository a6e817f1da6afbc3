"""The trainer section's DDP settings reach megatron-core's DistributedDataParallelConfig as the study states
them (trainer/build.py ddp_config), and their defaults build the DDP the packaged trainer always built. The
overlaps run in a real world in tests/trainer/test_parity.py; a bf16 reduce needs bf16 parameters, a GPU's."""

from __future__ import annotations

from mimo_jobs.study.spec import TrainerSpec
from mimo_jobs.trainer.build import ddp_config


def test_the_defaults_build_the_ddp_of_before():
    c = ddp_config(TrainerSpec(train_iters=1))
    assert (c.grad_reduce_in_fp32, c.overlap_grad_reduce, c.overlap_param_gather) == (True, False, False)
    assert not c.use_distributed_optimizer and not c.align_param_gather


def test_each_setting_reaches_the_config():
    t = TrainerSpec(
        train_iters=1,
        precision="bf16",
        use_distributed_optimizer=True,
        overlap_grad_reduce=True,
        overlap_param_gather=True,
        grad_reduce_dtype="bf16",
    )
    c = ddp_config(t)
    assert (c.grad_reduce_in_fp32, c.overlap_grad_reduce, c.overlap_param_gather) == (False, True, True)
    assert c.use_distributed_optimizer
    # the trainer dispatches the gathers itself at the iteration's start (step/dpsync.py)
    assert c.align_param_gather
    only_reduce = ddp_config(TrainerSpec(train_iters=1, overlap_grad_reduce=True))
    assert only_reduce.overlap_grad_reduce and not only_reduce.overlap_param_gather

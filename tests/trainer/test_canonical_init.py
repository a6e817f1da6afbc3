"""canonical_init_ gives an expert the same weights whichever way its layers hold them: megatron-core's
SequentialMLP (local_experts.<i>.linear_fc1.weight) or Transformer Engine's grouped GEMM (linear_fc1.weight<i>),
under any expert-parallel (EP) and expert-tensor-parallel (ETP) layout."""

from __future__ import annotations

import pytest
import torch

from mimo_jobs.trainer.model.models import canonical_init_

EXPERTS, HIDDEN, FFN = 4, 8, 12
SEED = 7


def _param(shape, tp: bool, dim: int, allreduce: bool) -> torch.nn.Parameter:
    p = torch.nn.Parameter(torch.empty(shape))
    p.tensor_model_parallel, p.partition_dim, p.partition_stride = tp, dim, 1
    p.allreduce = allreduce
    return p


class _Linear(torch.nn.Module):
    """One expert's linear of a SequentialMLP (ColumnParallelLinear / RowParallelLinear attributes)."""

    def __init__(self, shape, dim: int):
        super().__init__()
        self.weight = _param(shape, True, dim, True)


class _Config:
    def __init__(self, gated: bool):
        self.gated_linear_unit = gated


class TEColumnParallelGroupedLinear(torch.nn.Module):
    """Stand-in named as megatron-core names its TE grouped linear: parameters weight0..weight<n-1> with the
    attributes TE sets. With megatron handling the expert comms (EP > 1 or ETP > 1) TE is built with
    parallel_mode None and records partition_dim 0 whatever the layer's real split dimension."""

    split_dim = 0

    def __init__(self, n: int, shape, ep: int, etp: int, gated: bool = False):
        super().__init__()
        self.config = _Config(gated)  # megatron-core's TEGroupedLinear keeps its TransformerConfig
        explicit_comm = ep > 1 or etp > 1
        dim = 0 if explicit_comm else self.split_dim
        for i in range(n):
            self.register_parameter(f"weight{i}", _param(shape, True, dim, allreduce=not ep > 1))


class TERowParallelGroupedLinear(TEColumnParallelGroupedLinear):
    split_dim = 1


def _model(experts: torch.nn.Module) -> torch.nn.Module:
    """decoder.layers.0.mlp.experts.<...>, as in megatron-core's GPTModel."""
    mlp, layer, decoder, root = (torch.nn.Module() for _ in range(4))
    mlp.experts = experts
    layer.mlp = mlp
    decoder.layers = torch.nn.ModuleList([layer])
    root.decoder = decoder
    return root


def _sequential(gated: bool = False) -> dict[int, tuple[torch.Tensor, torch.Tensor]]:
    """The full expert set of a one-rank SequentialMLP: expert -> (fc1 [FFN, H] ([gate; up] [2 FFN, H] when
    gated), fc2 [H, FFN])."""
    experts = torch.nn.Module()
    experts.local_experts = torch.nn.ModuleList()
    for _ in range(EXPERTS):
        e = torch.nn.Module()
        e.linear_fc1 = _Linear((2 * FFN if gated else FFN, HIDDEN), 0)
        e.linear_fc1.weight.partition_stride = 2 if gated else 1  # megatron-core's MLP: stride 2 when gated
        e.linear_fc2 = _Linear((HIDDEN, FFN), 1)
        experts.local_experts.append(e)
    m = _model(experts)
    canonical_init_(m, SEED, "language", 0, 1, 0, 1, 0, EXPERTS)
    return {
        i: (e.linear_fc1.weight.detach(), e.linear_fc2.weight.detach())
        for i, e in enumerate(experts.local_experts)
    }


def _grouped(ep: int, etp: int, tp: int, gated: bool = False) -> dict[int, tuple[torch.Tensor, torch.Tensor]]:
    """Every (EP rank, ETP rank) of a grouped-GEMM layout initialised alone, then put back together (a gated
    fc1's ETP rank holds [its gate rows; its up rows], as TEGroupedMLP chunks it)."""
    local = EXPERTS // ep
    fc1_rows = 2 * FFN if gated else FFN
    shards: dict[int, tuple[list, list]] = {}
    for ep_rank in range(ep):
        for etp_rank in range(etp):
            experts = torch.nn.Module()
            experts.linear_fc1 = TEColumnParallelGroupedLinear(
                local, (fc1_rows // etp, HIDDEN), ep, etp, gated
            )
            experts.linear_fc2 = TERowParallelGroupedLinear(local, (HIDDEN, FFN // etp), ep, etp, gated)
            m = _model(experts)
            # a dense TP rank of 1 of `tp`: expert weights must not follow it
            canonical_init_(m, SEED, "language", tp - 1, tp, etp_rank, etp, ep_rank, local)
            for i in range(local):
                fc1, fc2 = shards.setdefault(ep_rank * local + i, ([], []))
                fc1.append(getattr(experts.linear_fc1, f"weight{i}").detach())
                fc2.append(getattr(experts.linear_fc2, f"weight{i}").detach())
    if gated:  # [gate_0; up_0], [gate_1; up_1] -> [gate_0; gate_1; up_0; up_1]
        return {
            g: (torch.cat([x.chunk(2)[0] for x in a] + [x.chunk(2)[1] for x in a]), torch.cat(b, dim=1))
            for g, (a, b) in shards.items()
        }
    return {g: (torch.cat(a, dim=0), torch.cat(b, dim=1)) for g, (a, b) in shards.items()}


@pytest.mark.parametrize("ep", [1, 2, 4])
@pytest.mark.parametrize("etp", [1, 2])
def test_grouped_gemm_experts_equal_the_sequential_init(ep: int, etp: int) -> None:
    want = _sequential()
    got = _grouped(ep, etp, tp=2)
    assert sorted(got) == list(range(EXPERTS))
    for g in range(EXPERTS):
        assert torch.equal(got[g][0], want[g][0]), f"expert {g} fc1 (EP {ep}, ETP {etp})"
        assert torch.equal(got[g][1], want[g][1]), f"expert {g} fc2 (EP {ep}, ETP {etp})"
    assert not torch.equal(want[0][0], want[1][0])  # experts differ from each other


@pytest.mark.parametrize("ep", [1, 2])
def test_gated_grouped_experts_cut_gate_and_up_per_expert_tp_rank(ep: int) -> None:
    """TE's GroupedLinear records partition_stride 1; a gated fc1 still holds [gate shard; up shard] on each
    expert-TP rank, so rank 0 must not get all the gate rows and rank 1 all the up rows."""
    want = _sequential(gated=True)
    got = _grouped(ep, etp=2, tp=2, gated=True)
    for g in range(EXPERTS):
        assert torch.equal(got[g][0], want[g][0]), f"expert {g} gated fc1 (EP {ep}, ETP 2)"
        assert torch.equal(got[g][1], want[g][1]), f"expert {g} fc2 (EP {ep}, ETP 2)"


def test_te_fused_norms_take_the_local_layers_names() -> None:
    """Transformer Engine keeps a layer's norms inside the next linear (linear_qkv.layer_norm_weight,
    linear_fc1.layer_norm_bias): their canonical names are the local layers' norms, the one name checkpoints,
    resharding, HF load and export use."""
    from mimo_jobs.trainer.model.models import LOCAL_NAMES, TE_NAMES, layer_naming, param_shards

    def layer(te: bool) -> torch.nn.Module:
        lay, attn, mlp = torch.nn.Module(), torch.nn.Module(), torch.nn.Module()
        attn.linear_qkv, mlp.linear_fc1 = torch.nn.Module(), torch.nn.Module()
        attn.linear_qkv.weight = _param((3 * HIDDEN, HIDDEN), False, 0, True)
        mlp.linear_fc1.weight = _param((FFN, HIDDEN), False, 0, True)
        for owner, local, te_name in (
            (attn.linear_qkv, "input_layernorm", "layer_norm_"),
            (mlp.linear_fc1, "pre_mlp_layernorm", "layer_norm_"),
        ):
            for what in ("weight", "bias"):
                p = _param((HIDDEN,), False, 0, True)
                if te:
                    owner.register_parameter(te_name + what, p)
                else:
                    norm = getattr(lay, local, None) or torch.nn.Module()
                    norm.register_parameter(what, p)
                    setattr(lay, local, norm)
        lay.self_attention, lay.mlp = attn, mlp
        root, dec = torch.nn.Module(), torch.nn.Module()
        dec.layers = torch.nn.ModuleList([lay])
        root.decoder = dec
        return root

    te, local = layer(True), layer(False)
    names = lambda m: sorted(sh.cname for _, _, sh in param_shards(m, 0, 1))  # noqa: E731
    assert names(te) == names(local)
    assert "decoder.layers.0.input_layernorm.weight" in names(te)
    assert (layer_naming(te), layer_naming(local)) == (TE_NAMES, LOCAL_NAMES)
    canonical_init_(te, SEED, "language", 0, 1)
    canonical_init_(local, SEED, "language", 0, 1)
    assert torch.equal(
        te.state_dict()["decoder.layers.0.self_attention.linear_qkv.weight"],
        local.state_dict()["decoder.layers.0.self_attention.linear_qkv.weight"],
    )


def test_an_unknown_grouped_linear_is_refused() -> None:
    experts = torch.nn.Module()
    experts.linear_fc1 = torch.nn.Module()
    experts.linear_fc1.register_parameter("weight0", _param((FFN // 2, HIDDEN), True, 0, False))
    with pytest.raises(NotImplementedError, match="grouped linear"):
        canonical_init_(_model(experts), SEED, "language", 0, 1, 0, 2, 0, 1)

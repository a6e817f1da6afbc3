"""What the trainer needs of a model at a layout, checked by validate and by the trainer's own guard alike.

megatron-core 0.19 splits attention heads and query groups, the MLP width and the projector over TP, and
the expert MLP width over expert TP; a size that does not divide fails deep inside model construction, so
validate names it first. The vocabulary is padded instead (params.padded_vocab), never refused. Top-1 softmax
routing renormalised over its one expert (megatron-core's moe_router_pre_softmax=False with topk=1) weighs every
token by softmax of one score, 1.0: the router's weights get a zero gradient and never learn, so it is refused.
The packaged trainer trains an image encoder beside the LLM: a text-only model (no encoder) is priced for
other programs' runs but refused for it.
"""

from __future__ import annotations

from mimo_jobs.model.arch import ModelArch

RULE = "model-tp"
ENCODER_RULE = "model-encoder"


def encoder_problem(arch: ModelArch) -> tuple[str, str, str] | None:
    """(rule, message, fit) when the packaged trainer cannot train `arch` for want of an image encoder."""
    if arch.encoder is not None:
        return None
    return (
        ENCODER_RULE,
        "trainer.model.encoder is missing: the packaged trainer trains an image encoder with the LLM, and "
        "a text-only model describes another program's runs only",
        "name trainer.model.encoder (a packaged encoder or {hf_config: PATH}), or run your own program "
        "with trainer.command",
    )


def tp_problems(
    arch: ModelArch,
    enc_tp: int,
    llm_tp: int,
    llm_etp: int = 1,
    llm_pp: int = 1,
    packaged: bool = True,
) -> list[tuple[str, str, str]]:
    """(rule, message, fit) for every model dimension the point's TP sizes do not divide, and for tied
    embeddings split over pipeline stages (the trainer ties the tables only when one stage holds both);
    with `packaged` (the run is the packaged trainer's), a text-only model too."""
    e, m = arch.encoder, arch.llm
    checks = []
    if e is not None:
        checks += [
            ("encoder.tp", enc_tp, "encoder.num_attention_heads", e.num_attention_heads),
            ("encoder.tp", enc_tp, "encoder.ffn_hidden_size", e.ffn_hidden_size),
            ("encoder.tp", enc_tp, "llm.hidden_size (the projector's width)", m.hidden_size),
        ]
    checks += [
        ("llm.tp", llm_tp, "llm.num_attention_heads", m.num_attention_heads),
        ("llm.tp", llm_tp, "llm.num_query_groups", m.query_groups),
    ]
    if m.moe_layers < m.num_layers:
        checks.append(("llm.tp", llm_tp, "llm.ffn_hidden_size", m.ffn_hidden_size))
    if m.moe_shared_expert_intermediate_size:
        checks.append(
            (
                "llm.tp",
                llm_tp,
                "llm.moe_shared_expert_intermediate_size",
                m.moe_shared_expert_intermediate_size,
            )
        )
    if m.num_experts:
        checks.append(("llm.etp", llm_etp, "llm.moe_ffn_hidden_size", m.expert_ffn))
    missing = encoder_problem(arch) if packaged else None
    out = [missing] if missing else []
    if m.num_experts and m.moe_router_topk == 1 and m.moe_router_score_function == "softmax":
        if not m.moe_router_pre_softmax:
            out.append(
                (
                    "model-router",
                    "llm: top-1 softmax routing renormalised over one expert has a zero gradient",
                    "llm.moe_router_pre_softmax: true (HuggingFace: norm_topk_prob false)",
                )
            )
    if m.tie_word_embeddings and llm_pp > 1:
        out.append(
            (
                "model-tied",
                f"llm.tie_word_embeddings with llm.pp={llm_pp}: the first and last stages would share the table",
                "llm.pp=1",
            )
        )
    for axis, size, field, n in checks:
        if size > 0 and n % size:
            fits = [k for k in range(1, size) if n % k == 0]
            out.append((RULE, f"{axis}={size} does not divide {field}={n}", f"{axis} in {fits} divides it"))
    return out


def experts_apart(ep: int, etp: int, tp: int) -> bool:
    """Whether the routed experts get their own gradient buffer and optimizer part, reduced over the
    expert-DP group: whenever the expert grid differs from the dense one (EP > 1, or expert TP != TP, where
    each TP rank routes only its own sequence-parallel share of the tokens through whole experts).
    megatron-core 0.19 applies the same rule to its own layers (tensor_parallel/layers.py `use_expert_pgs`,
    https://github.com/NVIDIA/Megatron-LM/pull/5916; 0.16.1 did so only with EP > 1), and so does the trainer
    (trainer/model/models.py)."""
    return ep > 1 or etp != tp

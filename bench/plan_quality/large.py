"""Solve times on large real-shaped models: `python -m bench.plan_quality.large
[--instances NAME ...] [--fractions F ...] [--repeats N]`.

The plan-quality suite's instances hold at most 64 traps of up to 26 tensors each. Models a user
may profile are larger in two ways, and both slowed the solver: traps that hold many tensors of
one size (the experts of a mixture-of-experts layer), and many traps (leaf granularity). Three
instances, bf16 weights, one forward at a 2,048-token prefill (context 2,048), roofline compute
times (`instances._trap`), PCIe4 copies:
- deepseek-v3-moe: DeepSeek-V3 (61 layers, hidden 7168, vocab 129280). Per layer an attention
  trap (MLA: q_a_proj, q_b_proj, kv_a_proj_with_mqa, kv_b_proj, o_proj, and the layer's two
  norms) and an MLP trap: a dense MLP (intermediate 18432) in the first 3 layers, then an MoE trap
  of 256 routed experts and one shared expert (gate, up, down of intermediate 2048 each) and the
  router (772 tensors; top-8 routed + the shared expert active per token);
- qwen3-235b-moe: Qwen3-235B-A22B (94 layers, hidden 4096, 64 query / 4 KV heads of 128, vocab
  151936). Per layer an attention trap (q, k, v, o, q_norm, k_norm and the layer's two norms) and
  an MoE trap of 128 experts (intermediate 1536) and the router (385 tensors; top-8);
- llama-405b-leaves: Llama-3.1-405B (126 layers, hidden 16384, ffn 53248, KV width 1024, vocab
  128256) at leaf granularity (`leaves.leaf_stats` with the suite's Llama refiner, what
  `ftc --granularity leaves` records): one trap per linear (7 a layer) and per norm (2), the
  parameter-free compute between them as gap traps (5), and the embedding and head: 1,766 traps.
Their weights (1.3 TB, 0.47 TB, 0.81 TB) exceed the suite's 80 GiB device, so the device here is
the suite's PCIe4 device with `MEMORY_BYTES` (2 TiB) of memory, more than the largest budget.
Per instance and budget (a fraction of the weights) it prints the least CPU time of `--repeats`
solves with `adaptive` (one per pass over all the cases), the plan's strategy, its makespan and
makespan / LB (LB = max(total compute, copy time of (weights - budget)), the suite's
`lower_bound_ms`), and the suite's CPU reference loop (solve times are pure-Python CPU times and
scale with it). `large_problems(..., layers=N)` builds the same models with N layers (tests).
Must not know: how plans are searched.
"""

from __future__ import annotations

import argparse
import time
from collections.abc import Callable
from dataclasses import replace

from bench.plan_quality.__main__ import cpu_reference_ms, lower_bound_ms
from bench.plan_quality.instances import BANDWIDTHS, _llama, _t, _trap, device
from bench.plan_quality.leaves import leaf_stats
from bench.plan_quality.refine import llama_refiner
from flextensor_compile.solve import Plan, Problem, problem_from_stats, solve
from flextensor_compile.stats import Stats, TensorStat, TrapStat
from flextensor_runtime.errors import BudgetError
from flextensor_runtime.profile import DeviceSpec, PlanConfig

__all__ = [
    "FRACTIONS",
    "LARGE_INSTANCES",
    "MEMORY_BYTES",
    "TOKENS",
    "deepseek_v3",
    "large_device",
    "large_problems",
    "llama_405b_leaves",
    "qwen3_235b",
]

FRACTIONS = (0.3, 0.6, 0.9)
MEMORY_BYTES = 2 << 40  # 2 TiB: holds the largest budget (0.9 of DeepSeek-V3's 1.3 TB)
TOKENS = 2048  # prefill tokens, and the attention context


def large_device() -> DeviceSpec:
    """The suite's PCIe4 device (copy curve and latency) with `MEMORY_BYTES` of memory."""
    return replace(device(BANDWIDTHS["pcie4"]), memory_bytes=MEMORY_BYTES)


def _mlp(p: str, h: int, inter: int) -> list[TensorStat]:
    """gate_proj, up_proj, down_proj of one MLP or expert under prefix `p`."""
    return [_t(p + "gate_proj.weight", (inter, h)), _t(p + "up_proj.weight", (inter, h)),
            _t(p + "down_proj.weight", (h, inter))]  # fmt: skip


def _moe_trap(p: str, h: int, inter: int, experts: int, shared: int, top_k: int) -> TrapStat:
    """The MoE trap `{p}mlp`: the router, `experts` routed experts and `shared` shared ones."""
    m, act = p + "mlp.", TOKENS * h * 2
    tensors = [_t(m + "gate.weight", (experts, h))]
    for e in range(experts):
        tensors += _mlp(f"{m}experts.{e}.", h, inter)
    if shared:
        tensors += _mlp(m + "shared_experts.", h, inter * shared)
    flops = 2 * TOKENS * ((top_k + shared) * 3 * h * inter + experts * h)
    return _trap(p + "mlp", tensors, flops, 4 * act)


def _ends(h: int, vocab: int) -> tuple[TrapStat, TrapStat]:
    act = TOKENS * h * 2
    embed = _trap("embed_tokens", [_t("model.embed_tokens.weight", (vocab, h))], 0, act)
    head = [_t("model.norm.weight", (h,)), _t("lm_head.weight", (vocab, h))]
    return embed, _trap("lm_head", head, 2 * h * vocab, act)


def _mla_attn(p: str, h: int = 7168) -> TrapStat:
    """DeepSeek-V3's multi-head latent attention (128 heads, q/k 192 wide, v 128 wide)."""
    a = p + "self_attn."
    shapes = {"q_a_proj": (1536, h), "q_b_proj": (24576, 1536), "kv_a_proj_with_mqa": (576, h),
              "kv_b_proj": (32768, 512), "o_proj": (h, 16384)}  # fmt: skip
    tensors = [_t(p + "input_layernorm.weight", (h,)),
               *(_t(f"{a}{n}.weight", s) for n, s in shapes.items()),
               _t(p + "post_attention_layernorm.weight", (h,))]  # fmt: skip
    proj = sum(o * i for o, i in shapes.values())
    flops = 2 * TOKENS * proj + 2 * TOKENS * TOKENS * 128 * (192 + 128)
    return _trap(a[:-1], tensors, flops, 3 * TOKENS * h * 2)


def deepseek_v3(layers: int = 61) -> Stats:
    """DeepSeek-V3 with `layers` layers (the first min(3, layers) dense)."""
    h = 7168

    def layer(i: int, p: str) -> list[TrapStat]:
        if i >= 3:
            return [_mla_attn(p, h), _moe_trap(p, h, 2048, experts=256, shared=1, top_k=8)]
        mlp_flops, mlp_act = 2 * TOKENS * 3 * h * 18432, TOKENS * (2 * h + 2 * 18432) * 2
        return [_mla_attn(p, h), _trap(p + "mlp", _mlp(p + "mlp.", h, 18432), mlp_flops, mlp_act)]

    return _model("deepseek-v3-moe", h, 129280, layers, layer)


def _model(name: str, h: int, vocab: int, layers: int,
           layer: Callable[[int, str], list[TrapStat]]) -> Stats:  # fmt: skip
    """The embedding, each layer's traps (`layer(i, prefix)`), the head, on `large_device`."""
    embed, head = _ends(h, vocab)
    traps = [embed]
    for i in range(layers):
        traps += layer(i, f"model.layers.{i}.")
    traps.append(head)
    return Stats(name, large_device(), tuple(traps), timing_source="roofline")


def _gqa_attn(p: str, h: int, q: int, kv: int) -> TrapStat:
    """Qwen3's grouped-query attention with per-head q/k norms (head width 128)."""
    a = p + "self_attn."
    shapes = {"q_proj": (q, h), "k_proj": (kv, h), "v_proj": (kv, h), "o_proj": (h, q)}
    tensors = [_t(p + "input_layernorm.weight", (h,)),
               *(_t(f"{a}{n}.weight", s) for n, s in shapes.items()),
               _t(a + "q_norm.weight", (128,)), _t(a + "k_norm.weight", (128,)),
               _t(p + "post_attention_layernorm.weight", (h,))]  # fmt: skip
    flops = 2 * TOKENS * sum(o * i for o, i in shapes.values()) + 4 * TOKENS * TOKENS * q
    return _trap(a[:-1], tensors, flops, 3 * TOKENS * h * 2)


def qwen3_235b(layers: int = 94) -> Stats:
    """Qwen3-235B-A22B with `layers` layers, every one MoE."""
    h = 4096

    def layer(_i: int, p: str) -> list[TrapStat]:
        return [_gqa_attn(p, h, 8192, 512), _moe_trap(p, h, 1536, experts=128, shared=0, top_k=8)]

    return _model("qwen3-235b-moe", h, 151936, layers, layer)


def llama_405b_leaves(layers: int = 126) -> Stats:
    """Llama-3.1-405B with `layers` layers at leaf granularity (see the module docstring)."""
    h, ffn, kv = 16384, 53248, 1024
    base = _llama("llama-405b-leaves", layers, h, ffn, kv, 128256, TOKENS, TOKENS)
    leaves = leaf_stats(base, llama_refiner(h, ffn, kv, tokens=TOKENS, context=TOKENS))
    return replace(leaves, device=large_device())


LARGE_INSTANCES: dict[str, Callable[..., Stats]] = {
    "deepseek-v3-moe": deepseek_v3,
    "qwen3-235b-moe": qwen3_235b,
    "llama-405b-leaves": llama_405b_leaves,
}


def large_problems(names: list[str], fractions: list[float], layers: int | None = None
                   ) -> list[tuple[str, Problem]]:  # fmt: skip
    """('NAME FRACTION', problem) per instance and budget; `layers`: that many layers instead of
    the model's own count."""
    cases = []
    for name in names:
        build = LARGE_INSTANCES[name]
        stats = build() if layers is None else build(layers)
        weights = sum(t.bytes for tr in stats.traps for t in tr.tensors if t.tie is None)
        for frac in fractions:
            config = PlanConfig(budget_bytes=int(frac * weights))
            cases.append((f"{name} {frac:g}", problem_from_stats(stats, config)))
    return cases


def _outcome(problem: Problem, plan: Plan | BudgetError) -> str:
    if isinstance(plan, BudgetError):
        return f"no plan fits (least budget {plan.least_bytes})"
    lb = lower_bound_ms(problem, problem.total_bytes)
    return (f"{plan.strategy}, makespan {plan.makespan_ms:.1f} ms, "
            f"{plan.makespan_ms / lb:.3f} x LB ({lb:.1f} ms)")  # fmt: skip


def _solve(problem: Problem) -> Plan | BudgetError:
    try:
        return solve(problem, "adaptive")
    except BudgetError as exc:
        return exc


def _describe(label: str, problem: Problem) -> str:
    tensors = sum(len(t.items) for t in problem.traps)
    return (f"{label}: {len(problem.traps)} traps, {tensors} streamable tensors, "
            f"{problem.total_bytes / 1e9:.1f} GB of weights")  # fmt: skip


def main() -> None:
    ap = argparse.ArgumentParser(prog="python -m bench.plan_quality.large")
    ap.add_argument("--instances", nargs="*", choices=list(LARGE_INSTANCES),
                    default=list(LARGE_INSTANCES))  # fmt: skip
    ap.add_argument("--fractions", nargs="*", type=float, default=list(FRACTIONS))
    ap.add_argument("--repeats", type=int, default=2)
    ap.add_argument("--layers", type=int, help="build every model with this many layers")
    args = ap.parse_args()
    cases = large_problems(args.instances, args.fractions, args.layers)
    for name in args.instances:
        first = next((p for label, p in cases if label.startswith(name + " ")), None)
        if first is not None:
            print(_describe(name, first))
    best, reference = [float("inf")] * len(cases), float("inf")
    plans: list[Plan | BudgetError] = []
    for rep in range(max(1, args.repeats)):
        for k, (_, problem) in enumerate(cases):
            reference = min(reference, cpu_reference_ms(1))
            start = time.process_time()
            plan = _solve(problem)
            best[k] = min(best[k], (time.process_time() - start) * 1e3)
            if rep == 0:
                plans.append(plan)
    for (label, problem), ms, plan in zip(cases, best, plans, strict=True):
        print(f"{label:<24}{ms:>9.1f} ms  {_outcome(problem, plan)}")
    print(f"CPU reference loop: {reference:.3f} ms on this machine; solve times scale with it")


if __name__ == "__main__":
    main()

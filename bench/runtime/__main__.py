"""`python -m bench.runtime [--quick]`: per-trap-call overhead next to accelerate and diffusers
group offloading, cold start, and peak host RSS deploying from safetensors, as text tables."""

from __future__ import annotations

import argparse

import torch

from bench.runtime.overhead import measure
from bench.runtime.startup import cold_start, peak_rss


def _overhead_table(quick: bool) -> float:
    rows = measure(iters=100 if quick else 400, warmup=20)
    peers = [r.per_call_us for r in rows if r.name.startswith(("accelerate", "diffusers"))]
    best_peer = min(peers)
    print(
        f"{'variant (64 traps, dim 64, 1 thread)':40s} {'forward us':>11s} {'per call us':>12s} {'vs best peer':>13s}"
    )
    for r in rows:
        ratio = "" if r.name == "plain" else f"{r.per_call_us / best_peer:.3f}"
        print(f"{r.name:40s} {r.forward_us:11.1f} {r.per_call_us:12.2f} {ratio:>13s}")
    ours = next(r.per_call_us for r in rows if r.name == "flextensor traps (resident)")
    return ours / best_peer


def _cold_table(quick: bool) -> dict[str, dict[str, float]]:
    cold = cold_start(repeats=1 if quick else 5)
    fields = ("import_torch_s", "import_ft_s", "install_s", "first_forward_s", "second_forward_s")
    print(
        f"{'cold start (median, s)':22s}" + "".join(f"{f.removesuffix('_s'):>16s}" for f in fields)
    )
    for name, row in cold.items():
        print(f"{name:22s}" + "".join(f"{row[f]:16.4f}" for f in fields))
    return cold


def main() -> None:
    parser = argparse.ArgumentParser(prog="python -m bench.runtime")
    parser.add_argument("--quick", action="store_true", help="fewer repeats (a smoke run)")
    args = parser.parse_args()
    torch.set_num_threads(1)
    ratio = _overhead_table(args.quick)
    print()
    cold = _cold_table(args.quick)
    print()
    rss = peak_rss()
    print(f"peak host RSS deploying {rss['weight_bytes'] / 2**20:.0f} MiB of weights from safetensors "
          f"(added RSS / weight bytes): flextensor lazy {rss['flextensor_ratio']:.3f}, "
          f"load_state_dict {rss['load_state_dict_ratio']:.3f}")  # fmt: skip
    print()
    ft = cold["flextensor"]
    print("targets: per-call overhead <= 1/3 of the better peer: "
          f"{ratio:.3f} ({'met' if ratio <= 1 / 3 else 'MISSED'}); import <= torch + 0.3 s: "
          f"+{ft['import_ft_s']:.3f} s ({'met' if ft['import_ft_s'] <= 0.3 else 'MISSED'}); "
          f"peak RSS <= 1.2x weights: {rss['flextensor_ratio']:.3f} "
          f"({'met' if rss['flextensor_ratio'] <= 1.2 else 'MISSED'}); warm-up forwards: 0")  # fmt: skip


if __name__ == "__main__":
    main()

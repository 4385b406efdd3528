#!/usr/bin/env python
"""One SAC update against the arithmetic limit of the core: ms per update, GFLOP/s, peak.

    python benchmarks/bench_update.py                  # 2×256, batch 256, HalfCheetah's sizes
    python benchmarks/bench_update.py --hidden 128 --threads 2

Times :meth:`themis.agents.sac.SAC.update` (critic, actor and temperature steps, target update)
in float32 and with bfloat16 products (``precision=bf16``), counts its multiply-adds from the
layer sizes (forward 1×, backward 2× for layers whose weights train, 1× where only the input
gradient flows), and sets the rate beside the core's measured matmul peak (a 1024×1024×1024
product, float32 and bfloat16). Prints a Markdown table, last.

    python benchmarks/bench_update.py --hidden 256 --depth 3 --batch 512 --obs 39 --act 4 \
        --subnormal 0.4                                  # Meta-World's SAC, dead units

``--subnormal F`` gives a fixed random fraction F of every parameter's gradient entries a size
of 1e-20 (units that have almost stopped firing: their squared gradients, and so Adam's second
moments, are subnormal floats, as in long runs) and times each precision with subnormals kept
and flushed (:func:`themis.core.precision.flush_denormals`, which a run sets).
"""

from __future__ import annotations

import argparse
import itertools
import platform
import time

import torch

from themis.agents.buffers import ReplayBufferSamples
from themis.agents.sac import SAC, SACConfig


def update_flops(obs: int, act: int, hidden: int, depth: int, batch: int) -> float:
    """Floating-point operations (2 × multiply-adds) of one SAC update's matrix products."""
    def macs(inp: int, out: int) -> int:
        dims = [inp] + [hidden] * depth + [out]
        return sum(a * b for a, b in itertools.pairwise(dims))
    actor, critic = macs(obs, 2 * act), 2 * macs(obs + act, 1)  # twin critics
    per_sample = (actor + critic          # target: actor(s') and target critics, no grad
                  + critic + 2 * critic   # critic forward and backward
                  + actor + critic        # actor loss forward: actor(s), critics(s, a)
                  + critic + 2 * actor)   # backward: input gradients of the critics, actor
    return 2.0 * per_sample * batch


def peak(dtype: torch.dtype, n: int = 1024, reps: int = 10) -> float:
    """GFLOP/s of an ``n × n × n`` matrix product in ``dtype``."""
    a, b = torch.randn(n, n, dtype=dtype), torch.randn(n, n, dtype=dtype)
    for _ in range(3):
        a @ b
    start = time.perf_counter()
    for _ in range(reps):
        a @ b
    return 2 * n**3 * reps / (time.perf_counter() - start) / 1e9


def time_update(agent: SAC, batches: list[ReplayBufferSamples], n: int) -> float:
    """Milliseconds per update, the best of five blocks of ``n``."""
    best = float("inf")
    for i in range(n):  # warm-up
        agent.update(batches[i % len(batches)], i)
    for _ in range(5):
        start = time.perf_counter()
        for i in range(n):
            agent.update(batches[i % len(batches)], i)
        best = min(best, (time.perf_counter() - start) / n * 1e3)
    return best


def dead_units(agent: SAC, fraction: float) -> None:
    """Gradient hooks that set a fixed random ``fraction`` of every parameter's gradient entries
    to ±1e-20 (their squares, 1e-40, are subnormal float32)."""
    gen = torch.Generator().manual_seed(1)
    for param in [*agent.actor.parameters(), *agent.critic.parameters()]:
        mask = torch.rand(param.shape, generator=gen) < fraction
        param.register_hook(lambda g, m=mask: torch.where(m, torch.sign(g) * 1e-20, g))


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--hidden", type=int, default=256)
    parser.add_argument("--depth", type=int, default=2)
    parser.add_argument("--batch", type=int, default=256)
    parser.add_argument("--obs", type=int, default=17, help="HalfCheetah-v5: 17")
    parser.add_argument("--act", type=int, default=6, help="HalfCheetah-v5: 6")
    parser.add_argument("--threads", type=int, default=1)
    parser.add_argument("--updates", type=int, default=100, help="updates per timed block")
    parser.add_argument("--subnormal", type=float, default=0.0,
                        help="fraction of gradient entries of size 1e-20 (Adam's second moments "
                             "subnormal); times subnormals kept and flushed")
    args = parser.parse_args(argv)
    if not 0.0 <= args.subnormal <= 1.0:
        parser.error("--subnormal is a fraction in [0, 1]")
    if min(args.hidden, args.depth, args.batch, args.obs, args.act, args.threads,
           args.updates) < 1:
        parser.error("every size, --threads and --updates must be positive")
    torch.set_num_threads(args.threads)
    torch.manual_seed(0)
    b, o, a = args.batch, args.obs, args.act
    batches = [ReplayBufferSamples(torch.randn(b, o), torch.rand(b, a) * 2 - 1, torch.randn(b, o),
                                   torch.randn(b), torch.ones(b)) for _ in range(8)]
    flops = update_flops(o, a, args.hidden, args.depth, b)
    peaks = {"fp32": peak(torch.float32), "bf16": peak(torch.bfloat16)}
    cfg = SACConfig(hidden_dim=args.hidden, hidden_depth=args.depth, batch_size=b)
    rows = []
    flushes = (False, True) if args.subnormal else (None,)
    for (name, precision), flush in itertools.product(
            (("fp32", None), ("bf16", torch.bfloat16)), flushes):
        if flush is not None:
            torch.set_flush_denormal(flush)
        torch.manual_seed(0)
        agent = SAC(o, a, torch.device("cpu"), cfg, precision=precision)
        if args.subnormal:
            dead_units(agent, args.subnormal)
        ms = time_update(agent, batches, args.updates)
        rate = flops / ms / 1e6
        label = name if flush is None else f"{name}, subnormals {'flushed' if flush else 'kept'}"
        rows.append((label, ms, rate, peaks[name], flops / peaks[name] / 1e6))
    torch.set_flush_denormal(False)
    print(f"\nSAC update, {args.depth}×{args.hidden}, batch {b}, obs {o}, action {a}: "
          f"{flops / 1e9:.2f} GFLOP in matrix products; {args.threads} thread(s), "
          f"{args.subnormal:.0%} of gradient entries 1e-20, "
          f"torch {torch.__version__}, {platform.processor() or platform.machine()}, "
          f"{time.strftime('%Y-%m-%d')}\n")
    print("| precision | ms per update | GFLOP/s in the update | matmul peak (GFLOP/s) | "
          "ms at the peak | fraction of the peak |")
    print("|---|---|---|---|---|---|")
    for name, ms, rate, top, floor in rows:
        print(f"| {name} | {ms:.2f} | {rate:.0f} | {top:.0f} | {floor:.2f} | {rate / top:.0%} |")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())

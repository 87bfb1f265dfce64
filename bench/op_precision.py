#!/usr/bin/python3
"""Each op of slimshard's models, forward + backward, in fp32 and in bf16 on this CPU, one thread: the
measurement behind the bf16 compute policy (which ops run in bf16, which stay in fp32; docs/precision.md).

Runs on Debian's python3-torch, which is the same LibTorch library (libtorch_cpu.so.1.13) slimshard links, so
the kernels timed are the kernels slimshard calls. Prints one line per op: median ms fp32, bf16, and the ratio.
  bench/op_precision.py                       # gpt-25m's shapes at micro-batch 4
  bench/op_precision.py --batch 8 --embd 256 --seq-len 128 --heads 4
"""
import argparse, json, statistics, time
import torch
import torch.nn.functional as F


def timed(fn, repeats):
    fn()  # warm-up (allocations, oneDNN primitive creation)
    fn()
    out = []
    for _ in range(repeats):
        t0 = time.perf_counter()
        fn()
        out.append(time.perf_counter() - t0)
    return statistics.median(out) * 1e3


def fwd_bwd(make_inputs, op):
    def run():
        inputs = make_inputs()
        y = op(*inputs)
        y.backward(torch.ones_like(y))
    return run


def main():
    p = argparse.ArgumentParser()
    p.add_argument("--batch", type=int, default=4)
    p.add_argument("--seq-len", type=int, default=256)
    p.add_argument("--embd", type=int, default=512)
    p.add_argument("--heads", type=int, default=8)
    p.add_argument("--vocab", type=int, default=256)
    p.add_argument("--repeats", type=int, default=15)
    p.add_argument("--json", default="")
    a = p.parse_args()
    torch.set_num_threads(1)
    torch.manual_seed(0)
    B, T, C, H = a.batch, a.seq_len, a.embd, a.heads
    D = C // H
    mask = torch.ones(T, T, dtype=torch.bool).triu(1)

    def leaf(shape, dt):
        return (torch.randn(*shape) * 0.5).to(dt).requires_grad_()

    ops = {
        # name: (inputs(dtype), op)
        "linear C->4C (mm)": (lambda dt: (leaf((B * T, C), dt), leaf((4 * C, C), dt), leaf((4 * C,), dt)),
                              lambda x, w, b: F.linear(x, w, b)),
        "linear 4C->C (mm)": (lambda dt: (leaf((B * T, 4 * C), dt), leaf((C, 4 * C), dt), leaf((C,), dt)),
                              lambda x, w, b: F.linear(x, w, b)),
        "attention q@k^T (bmm)": (lambda dt: (leaf((B, H, T, D), dt), leaf((B, H, T, D), dt)),
                                  lambda q, k: q @ k.transpose(-2, -1)),
        "attention att@v (bmm)": (lambda dt: (leaf((B, H, T, T), dt), leaf((B, H, T, D), dt)),
                                  lambda att, v: att @ v),
        "masked_fill + softmax": (lambda dt: (leaf((B, H, T, T), dt),),
                                  lambda s: s.masked_fill(mask, float("-inf")).softmax(-1)),
        "gelu": (lambda dt: (leaf((B * T, 4 * C), dt),), lambda x: F.gelu(x)),
        "layer_norm": (lambda dt: (leaf((B, T, C), dt), leaf((C,), dt), leaf((C,), dt)),
                       lambda x, w, b: F.layer_norm(x, (C,), w, b)),
        "residual add": (lambda dt: (leaf((B, T, C), dt), leaf((B, T, C), dt)), lambda x, y: x + y),
        "cross_entropy (log_softmax)": (lambda dt: (leaf((B * T, a.vocab), dt),),
                                        lambda l: F.cross_entropy(l, torch.zeros(B * T, dtype=torch.long))),
        "embedding": (lambda dt: (leaf((a.vocab, C), dt),),
                      lambda w: F.embedding(torch.randint(0, a.vocab, (B, T)), w)),
        "conv2d 1->32 3x3 (cnn)": (lambda dt: (leaf((64, 1, 28, 28), dt), leaf((32, 1, 3, 3), dt)),
                                   lambda x, w: F.conv2d(x, w, padding=1)),
        "conv2d 32->64 3x3 (cnn)": (lambda dt: (leaf((64, 32, 14, 14), dt), leaf((64, 32, 3, 3), dt)),
                                    lambda x, w: F.conv2d(x, w, padding=1)),
        "relu": (lambda dt: (leaf((B * T, 4 * C), dt),), lambda x: F.relu(x)),
        "max_pool2d (cnn)": (lambda dt: (leaf((64, 32, 28, 28), dt),), lambda x: F.max_pool2d(x, 2)),
    }
    # The same ops on bf16 inputs but computed in fp32 (cast in, cast back out where a bf16 op follows): what
    # keeping an op in fp32 inside a bf16 model costs, casts included.
    islands = {
        "masked_fill + softmax": lambda s: torch.softmax(s.masked_fill(mask, float("-inf")), -1,
                                                         dtype=torch.float32).to(torch.bfloat16),
        "gelu": lambda x: F.gelu(x.float()).to(torch.bfloat16),
        "layer_norm": lambda x, w, b: F.layer_norm(x.float(), (C,), w.float(), b.float()).to(torch.bfloat16),
        "cross_entropy (log_softmax)": lambda l: F.cross_entropy(l.float(), torch.zeros(B * T, dtype=torch.long)),
        "max_pool2d (cnn)": lambda x: F.max_pool2d(x.float(), 2).to(torch.bfloat16),
        "relu": lambda x: F.relu(x.float()).to(torch.bfloat16),
    }
    rows = []
    print(f"op forward+backward, median of {a.repeats}, 1 thread, torch {torch.__version__}; "
          f"B={B} T={T} C={C} H={H}")
    print(f"{'op':30s} {'fp32 ms':>9s} {'bf16 ms':>9s} {'fp32/bf16':>9s} {'fp32 in a bf16 model (casts)':>29s}")
    for name, (make, op) in ops.items():
        t32 = timed(fwd_bwd(lambda: make(torch.float32), op), a.repeats)
        t16 = timed(fwd_bwd(lambda: make(torch.bfloat16), op), a.repeats)
        row = {"op": name, "fp32_ms": t32, "bf16_ms": t16, "speedup": t32 / t16}
        extra = ""
        if name in islands:
            row["fp32_island_ms"] = timed(fwd_bwd(lambda: make(torch.bfloat16), islands[name]), a.repeats)
            extra = f"{row['fp32_island_ms']:9.3f} ms ({'fp32' if row['fp32_island_ms'] < t16 else 'bf16'} wins)"
        rows.append(row)
        print(f"{name:30s} {t32:9.3f} {t16:9.3f} {t32 / t16:8.2f}x {extra:>29s}")
    # The GEMM ceiling the issue measures against: one large square mm, fp32 and bf16.
    for dt in (torch.float32, torch.bfloat16):
        n = 1024
        x, y = torch.randn(n, n).to(dt), torch.randn(n, n).to(dt)
        ms = timed(lambda: torch.mm(x, y), a.repeats)
        rows.append({"op": f"gemm {n}", "dtype": str(dt), "ms": ms, "gflops": 2 * n**3 / ms / 1e6})
        print(f"gemm {n}x{n}x{n} {str(dt):15s} {ms:9.3f} ms = {2 * n**3 / ms / 1e6:.0f} GFLOP/s")
    if a.json:
        with open(a.json, "w") as f:
            json.dump({"shape": vars(a), "torch": torch.__version__, "rows": rows}, f, indent=1)


if __name__ == "__main__":
    main()

#!/usr/bin/python3
"""PyTorch's data parallelism on slimshard's training task, for Slim-DP's comparison (bench/slim_peers.sh).

The GPT of ../shared/bench/torch_ddp_peer.py trained on the KJV bytes with exactly slimshard's batches: the
same 90/10 split, the same rows (row r of step t starts at splitmix64-mix(seed, t, r) mod (train - T), as
src/data/datasets.cpp), each rank its slice of the global batch; AdamW (betas 0.9/0.95, weight decay 0.1 on
matrices), warmup min(100, steps/10) then cosine to lr/10, global-norm clipping at 1.0; validation on 256 rows
spread over the validation text, at the end. Modes (the synchronisation a user would pick instead of Slim-DP):
  ddp       DistributedDataParallel, fp32 all-reduce of gradients
  fp16      DDP with PyTorch's fp16_compress_hook (gradients travel as fp16: half the bytes)
  localsgd  post-local SGD: post_localSGD_hook + PeriodicModelAverager (model averaging every --period steps
            after --localsgd-warmup steps of DDP) — the nearest relative of Slim-DP at alpha = 1
Bytes sent per rank are counted by the ring convention slimshard uses (all-reduce 2(W-1)/W of the tensor).
Prints one JSON object per step and a summary line, like slimshard's --metrics. Start it with
run_torch_ddp_peer.sh-style environment (RANK, WORLD_SIZE, MASTER_ADDR, MASTER_PORT).
"""
import argparse, importlib.util, json, math, os, subprocess, sys, time
import torch, torch.nn.functional as F
import torch.distributed as dist

M64 = (1 << 64) - 1


def mix64(x):
    x = (x + 0x9E3779B97F4A7C15) & M64
    x = ((x ^ (x >> 30)) * 0xBF58476D1CE4E5B9) & M64
    x = ((x ^ (x >> 27)) * 0x94D049BB133111EB) & M64
    return x ^ (x >> 31)


def row_key(seed, step, row):
    return mix64(mix64(seed ^ 0x5EED) ^ mix64((step * 1099511628211 + row) & M64))


def kjv_bytes(cache):
    path = os.path.join(cache, "kjv.txt")
    if not os.path.exists(path):
        os.makedirs(cache, exist_ok=True)
        text = subprocess.run(["bible", "-f", "Gen1:1-Rev22:21"], capture_output=True, check=True).stdout
        with open(path, "wb") as f:
            f.write(text)
    return open(path, "rb").read()


def main():
    p = argparse.ArgumentParser()
    p.add_argument("--mode", default="ddp", choices=["ddp", "fp16", "localsgd"])
    p.add_argument("--layers", type=int, default=4)
    p.add_argument("--heads", type=int, default=4)
    p.add_argument("--embd", type=int, default=256)
    p.add_argument("--seq-len", type=int, default=128)
    p.add_argument("--batch-size", type=int, default=16, help="global, rows")
    p.add_argument("--steps", type=int, default=1000)
    p.add_argument("--lr", type=float, default=3e-3)
    p.add_argument("--seed", type=int, default=1337)
    p.add_argument("--period", type=int, default=4, help="localsgd: steps between model averages")
    p.add_argument("--localsgd-warmup", type=int, default=100, help="localsgd: DDP steps before local SGD")
    p.add_argument("--eval-rows", type=int, default=256)
    p.add_argument("--cache", default=os.environ.get("SLIMSHARD_CACHE", os.path.expanduser("~/.cache/slimshard")))
    p.add_argument("--peer", default=os.path.join(os.path.dirname(__file__), "../../shared/bench/torch_ddp_peer.py"))
    p.add_argument("--metrics", default="")
    a = p.parse_args()
    dist.init_process_group("gloo")
    rank, world = dist.get_rank(), dist.get_world_size()
    torch.set_num_threads(1)
    torch.manual_seed(a.seed)
    spec = importlib.util.spec_from_file_location("torch_ddp_peer", a.peer)
    peer = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(peer)
    data = kjv_bytes(a.cache)
    cut = len(data) * 9 // 10
    train, val = torch.tensor(list(data[:cut]), dtype=torch.long), torch.tensor(list(data[cut:]), dtype=torch.long)
    T, B = a.seq_len, a.batch_size
    local = B // world
    model = torch.nn.parallel.DistributedDataParallel(peer.GPT(256, T, a.layers, a.heads, a.embd))
    n_params = sum(q.numel() for q in model.parameters())
    averager = None
    if a.mode == "fp16":
        from torch.distributed.algorithms.ddp_comm_hooks import default_hooks
        model.register_comm_hook(None, default_hooks.fp16_compress_hook)
    elif a.mode == "localsgd":
        from torch.distributed.algorithms.ddp_comm_hooks.post_localSGD_hook import PostLocalSGDState, post_localSGD_hook
        from torch.distributed.algorithms.model_averaging.averagers import PeriodicModelAverager
        # Each rank its own subgroup: after the warm-up nothing is all-reduced but the periodic average.
        # (dist.new_subgroups needs CUDA in PyTorch 1.13; every rank makes every group, in order.)
        subgroup = [dist.new_group(ranks=[r]) for r in range(world)][rank]
        model.register_comm_hook(PostLocalSGDState(process_group=None, subgroup=subgroup,
                                                   start_localSGD_iter=a.localsgd_warmup), post_localSGD_hook)
        averager = PeriodicModelAverager(period=a.period, warmup_steps=a.localsgd_warmup)
    decay = [q for q in model.parameters() if q.dim() >= 2]
    no_decay = [q for q in model.parameters() if q.dim() < 2]
    opt = torch.optim.AdamW([{"params": decay, "weight_decay": 0.1}, {"params": no_decay, "weight_decay": 0.0}],
                            lr=a.lr, betas=(0.9, 0.95), eps=1e-8)
    warmup = min(100, a.steps // 10)

    def lr_at(step):
        if step < warmup:
            return a.lr * (step + 1) / warmup
        progress = min(1.0, max(0.0, (step - warmup) / max(1, a.steps - warmup)))
        return a.lr / 10 + 0.5 * (a.lr - a.lr / 10) * (1 + math.cos(math.pi * progress))

    ring = 2 * (world - 1) / world
    grad_bytes = ring * n_params * (2 if a.mode == "fp16" else 4)
    out = open(a.metrics, "w") if a.metrics and rank == 0 else None
    span = len(train) - T
    sent, times = 0.0, []
    for step in range(a.steps):
        t0 = time.perf_counter()
        rows = [row_key(a.seed, step, r) % span for r in range(rank * local, (rank + 1) * local)]
        batch = torch.stack([train[s:s + T + 1] for s in rows])
        for g in opt.param_groups:
            g["lr"] = lr_at(step)
        opt.zero_grad(set_to_none=True)
        loss = model(batch[:, :T], batch[:, 1:])
        loss.backward()
        torch.nn.utils.clip_grad_norm_(model.parameters(), 1.0)
        opt.step()
        step_bytes = grad_bytes if (a.mode != "localsgd" or step < a.localsgd_warmup) else 0.0
        if averager is not None:
            averager.average_parameters(model.parameters())  # averages when its step count says so:
            if step >= a.localsgd_warmup and (step - a.localsgd_warmup) % a.period == 0:
                step_bytes += ring * n_params * 4
        sent += step_bytes
        l = loss.detach().clone()
        dist.all_reduce(l)
        times.append(time.perf_counter() - t0)
        last = {"step": step + 1, "loss": l.item() / world, "comm_bytes": step_bytes}
        if out and step + 1 < a.steps:  # the last record waits for the validation loss
            out.write(json.dumps(last) + "\n")
    # Validation: 256 rows spread over the validation text (as slimshard), rows split over ranks.
    chunks = (len(val) - 1) // T
    want = min(a.eval_rows, chunks)
    starts = [i * chunks // want * T for i in range(want)]
    mine = starts[rank::world]
    total = torch.zeros(2)
    model.eval()
    with torch.no_grad():
        for s in mine:
            x = val[s:s + T + 1].unsqueeze(0)
            total += torch.tensor([model.module(x[:, :T], x[:, 1:]).item(), 1.0])
    dist.all_reduce(total)
    if out:
        last["val_loss"] = (total[0] / total[1]).item()
        out.write(json.dumps(last) + "\n")
        med = sorted(times[2:])[len(times[2:]) // 2] if len(times) > 2 else times[-1]
        out.write(json.dumps({"summary": True, "peer": f"torch-{a.mode}", "val_loss": (total[0] / total[1]).item(),
                              "comm_bytes": sent, "tokens_per_s": B * T / med, "steps": a.steps,
                              "params": n_params, "world": world}) + "\n")
        out.close()
    dist.destroy_process_group()


if __name__ == "__main__":
    main()

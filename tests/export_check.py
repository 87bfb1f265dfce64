#!/usr/bin/python3
"""export_check.py MODEL.safetensors TEXT EXPECTED_LOSS [PEER.py]

Loads a `slimshard export` file into the PyTorch peer's GPT (PEER.py, ../shared/bench/torch_ddp_peer.py; if it is
not there, the same architecture defined below) by reading the safetensors layout directly (8-byte header length,
JSON header, raw little-endian bytes), computes the loss on the first 4 rows of T+1 bytes of TEXT, and exits 0 if
it equals EXPECTED_LOSS (what slimshard computed) within 1e-4 relative. Needs Debian's python3-torch.
"""
import importlib.util
import json
import math
import os
import struct
import sys

import torch
import torch.nn as nn
import torch.nn.functional as F


class Block(nn.Module):  # used only when the peer script is absent: pre-LayerNorm block, GELU MLP
    def __init__(self, c, h):
        super().__init__()
        self.h = h
        self.ln1, self.ln2 = nn.LayerNorm(c), nn.LayerNorm(c)
        self.qkv, self.proj = nn.Linear(c, 3 * c), nn.Linear(c, c)
        self.fc, self.fc2 = nn.Linear(c, 4 * c), nn.Linear(4 * c, c)

    def forward(self, x):
        b, t, c = x.shape
        q, k, v = (z.view(b, t, self.h, c // self.h).transpose(1, 2) for z in self.qkv(self.ln1(x)).split(c, 2))
        att = (q @ k.transpose(-2, -1)) / math.sqrt(c // self.h)
        att = att.masked_fill(~torch.ones(t, t, dtype=torch.bool).tril(), float("-inf")).softmax(-1)
        x = x + self.proj((att @ v).transpose(1, 2).reshape(b, t, c))
        return x + self.fc2(F.gelu(self.fc(self.ln2(x))))


class GPT(nn.Module):
    def __init__(self, vocab, block, layers, heads, embd):
        super().__init__()
        self.wte, self.wpe = nn.Embedding(vocab, embd), nn.Embedding(block, embd)
        self.blocks = nn.ModuleList(Block(embd, heads) for _ in range(layers))
        self.ln_f, self.head = nn.LayerNorm(embd), nn.Linear(embd, vocab, bias=False)

    def forward(self, idx, targets):
        x = self.wte(idx) + self.wpe(torch.arange(idx.shape[1]))
        for blk in self.blocks:
            x = blk(x)
        logits = self.head(self.ln_f(x))
        return F.cross_entropy(logits.view(-1, logits.size(-1)), targets.reshape(-1))


def read_safetensors(path):
    dtypes = {"F32": torch.float32, "F16": torch.float16, "BF16": torch.bfloat16, "I64": torch.int64}
    raw = open(path, "rb").read()
    (n,) = struct.unpack("<Q", raw[:8])
    header = json.loads(raw[8:8 + n])
    out = {}
    for name, e in header.items():
        if name == "__metadata__":
            continue
        a, b = e["data_offsets"]
        t = torch.frombuffer(bytearray(raw[8 + n + a:8 + n + b]), dtype=dtypes[e["dtype"]])
        out[name] = t.reshape(e["shape"])
    return out


def peer_name(n):  # GPT-2/nanoGPT names -> the peer's module names
    n = n.replace("transformer.h.", "blocks.").replace("transformer.", "").replace("lm_head.", "head.")
    for a, b in ((".ln_1.", ".ln1."), (".ln_2.", ".ln2."), (".attn.c_attn.", ".qkv."), (".attn.c_proj.", ".proj."),
                 (".mlp.c_fc.", ".fc."), (".mlp.c_proj.", ".fc2.")):
        n = n.replace(a, b)
    return n


def main():
    model_path, text_path, expected = sys.argv[1], sys.argv[2], float(sys.argv[3])
    peer = sys.argv[4] if len(sys.argv) > 4 else ""
    gpt_class, source = GPT, "the architecture defined in export_check.py"
    if peer and os.path.exists(peer):
        spec = importlib.util.spec_from_file_location("torch_ddp_peer", peer)
        mod = importlib.util.module_from_spec(spec)
        spec.loader.exec_module(mod)
        gpt_class, source = mod.GPT, peer
    cfg = json.load(open(model_path[: -len(".safetensors")] + ".config.json"))
    model = gpt_class(cfg["vocab_size"], cfg["block_size"], cfg["n_layer"], cfg["n_head"], cfg["n_embd"])
    weights = {peer_name(k): v for k, v in read_safetensors(model_path).items()}
    model.load_state_dict(weights, strict=True)  # every name and shape must match
    t = cfg["block_size"]
    data = torch.tensor(list(open(text_path, "rb").read()[: 4 * (t + 1)]), dtype=torch.long).view(4, t + 1)
    with torch.no_grad():
        loss = model(data[:, :t], data[:, 1:]).item()
    ok = abs(loss - expected) <= 1e-4 * abs(expected)
    print(f"PyTorch GPT from {source}: loss {loss:.6f}, slimshard {expected:.6f}: {'same' if ok else 'DIFFERENT'}")
    sys.exit(0 if ok else 1)


if __name__ == "__main__":
    main()

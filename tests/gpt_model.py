#!/usr/bin/python3
"""The PyTorch twin of the character-level GPT example (examples' char_gpt), for the fixtures
(tests/fixtures/make_gpt_fixture.py), the interop test (tests/torch_gpt_interop.py) and the
speed/loss comparison (benchmarks/pytorch_gpt.py). Pre-LayerNorm GPT-2: token + position embeddings,
`layers` Blocks (causal self-attention and a GELU(tanh) MLP, each on a residual), a final LayerNorm
and a head tied to the token embedding. GPT-2's init: Linear and Embedding weights N(0, 0.02), the
residual projections (attn.proj, mlp.2) N(0, 0.02 / sqrt(2 * layers)), biases 0, LayerNorm 1 and 0.

State_dict names (those xtrain's export writes): wte.weight, wpe.weight,
blocks.<i>.{ln1,ln2}.{weight,bias}, blocks.<i>.attn.{qkv,proj}.{weight,bias},
blocks.<i>.mlp.{0,2}.{weight,bias}, ln_f.{weight,bias}, head.weight (the same tensor as wte.weight).

Also the text data recipe the C++ data set follows: load_corpus(path) -> (train_ids, val_ids, vocab).

usage: tests/gpt_model.py [CORPUS]   (self-test: parameter count, a forward/backward, the corpus)"""
import math
import os

import numpy as np
import torch
from torch import nn

DEFAULT_CORPUS = "/usr/share/games/fortunes"


class CausalSelfAttention(nn.Module):
    def __init__(self, embd, heads):
        super().__init__()
        if embd % heads:
            raise ValueError(f"embd {embd} is not a multiple of heads {heads}")
        self.heads = heads
        self.qkv = nn.Linear(embd, 3 * embd)
        self.proj = nn.Linear(embd, embd)

    def forward(self, x):
        B, T, C = x.shape
        hd = C // self.heads
        q, k, v = (t.view(B, T, self.heads, hd).transpose(1, 2) for t in self.qkv(x).split(C, dim=2))
        att = (q @ k.transpose(-2, -1)) * (1.0 / math.sqrt(hd))  # [B, H, T, T]
        causal = torch.ones(T, T, dtype=torch.bool, device=x.device).triu(1)  # True above the diagonal
        att = att.masked_fill(causal, float("-inf")).float().softmax(-1).to(q.dtype)  # fp32 softmax
        y = (att @ v).transpose(1, 2).reshape(B, T, C)
        return self.proj(y)


class Block(nn.Module):
    def __init__(self, embd, heads):
        super().__init__()
        self.ln1 = nn.LayerNorm(embd)
        self.attn = CausalSelfAttention(embd, heads)
        self.ln2 = nn.LayerNorm(embd)
        self.mlp = nn.Sequential(nn.Linear(embd, 4 * embd), nn.GELU(approximate="tanh"), nn.Linear(4 * embd, embd))

    def forward(self, x):
        x = x + self.attn(self.ln1(x))
        return x + self.mlp(self.ln2(x))


def gpt_init(module, layers):
    """GPT-2's init of every Linear, Embedding and LayerNorm in module (a GPT, Block or attention)."""
    for name, m in module.named_modules():
        if isinstance(m, (nn.Linear, nn.Embedding)):
            std = 0.02 / math.sqrt(2 * layers) if name.endswith(("attn.proj", "mlp.2")) or name == "proj" else 0.02
            nn.init.normal_(m.weight, 0.0, std)
            if getattr(m, "bias", None) is not None:
                nn.init.zeros_(m.bias)
        elif isinstance(m, nn.LayerNorm) and m.elementwise_affine:
            nn.init.ones_(m.weight)
            nn.init.zeros_(m.bias)


class GPT(nn.Module):
    def __init__(self, vocab, block, layers, heads, embd):
        super().__init__()
        self.block = block
        self.wte = nn.Embedding(vocab, embd)
        self.wpe = nn.Embedding(block, embd)
        self.blocks = nn.ModuleList([Block(embd, heads) for _ in range(layers)])
        self.ln_f = nn.LayerNorm(embd)
        self.head = nn.Linear(embd, vocab, bias=False)
        self.head.weight = self.wte.weight  # tied: one tensor under two state_dict names
        gpt_init(self, layers)  # the head is an nn.Linear too: wte is drawn twice, same distribution

    def forward(self, ids):
        T = ids.shape[1]
        if T > self.block:
            raise ValueError(f"sequence length {T} exceeds the block size {self.block}")
        x = self.wte(ids) + self.wpe(torch.arange(T, device=ids.device))
        for b in self.blocks:
            x = b(x)
        return self.head(self.ln_f(x))


def param_groups(model, weight_decay):
    """AdamW groups: decay on the blocks' Linear weights (qkv, proj, mlp.0, mlp.2) only; none on
    biases, LayerNorm parameters and the embeddings (wte, also the tied head, and wpe)."""
    decay, rest = [], []
    for name, p in model.named_parameters():  # the tied head is listed once, as wte.weight
        parts = name.split(".")
        is_matrix = parts[0] == "blocks" and parts[-1] == "weight" and ".".join(parts[2:-1]) in (
            "attn.qkv", "attn.proj", "mlp.0", "mlp.2")
        (decay if is_matrix else rest).append(p)
    return [{"params": decay, "weight_decay": weight_decay}, {"params": rest, "weight_decay": 0.0}]


def corpus_files(path):
    """The corpus files: path itself, or the regular files (a link to one counts; no subfolders)
    directly in the folder path, sorted byte-wise by name, less those ending in .dat or .u8."""
    if not os.path.exists(path):
        raise FileNotFoundError(f"corpus {path} does not exist (Debian's fortunes package installs "
                                f"{DEFAULT_CORPUS}; or pass a text file or folder)")
    if not os.path.isdir(path):
        return [path]
    names = sorted(os.listdir(os.fsencode(path)))  # bytes: a byte-wise sort
    files = [os.path.join(os.fsencode(path), n) for n in names if not n.endswith((b".dat", b".u8"))]
    files = [os.fsdecode(f) for f in files if os.path.isfile(f)]
    if not files:
        raise ValueError(f"corpus folder {path} holds no regular file (other than *.dat, *.u8)")
    return files


def load_corpus(path=DEFAULT_CORPUS):
    """(train_ids, val_ids, vocab_bytes): the concatenated bytes as token ids (int64), the id of a
    byte being its index in the sorted list of distinct bytes (vocab_bytes, uint8); train is the
    first floor(0.9 * n) tokens, validation the rest."""
    data = b"".join(open(f, "rb").read() for f in corpus_files(path))
    if len(data) < 2:
        raise ValueError(f"corpus {path} holds {len(data)} bytes: too few to train on")
    raw = np.frombuffer(data, dtype=np.uint8)
    vocab_bytes = np.unique(raw)  # sorted ascending
    lookup = np.zeros(256, dtype=np.int64)
    lookup[vocab_bytes] = np.arange(len(vocab_bytes))
    ids = lookup[raw]
    n_train = int(0.9 * len(ids))
    return ids[:n_train], ids[n_train:], vocab_bytes


if __name__ == "__main__":
    import sys
    torch.manual_seed(0)
    model = GPT(vocab=114, block=64, layers=4, heads=4, embd=128)
    count = sum(p.numel() for p in model.parameters())
    assert count == 816128, count
    assert model.head.weight is model.wte.weight
    groups = param_groups(model, 0.1)
    assert sum(len(g["params"]) for g in groups) == len(list(model.parameters())) and len(groups[0]["params"]) == 16
    logits = model(torch.randint(114, (2, 64)))
    assert logits.shape == (2, 64, 114)
    logits.logsumexp(-1).mean().backward()
    print(f"GPT(vocab 114, block 64, layers 4, heads 4, embd 128): {count} parameters "
          f"({sum(p.numel() for p in groups[0]['params'])} with weight decay), {len(model.state_dict())} "
          f"state_dict entries; forward/backward OK")
    path = sys.argv[1] if len(sys.argv) > 1 else DEFAULT_CORPUS
    train, val, vocab = load_corpus(path)
    print(f"corpus {path}: {len(corpus_files(path))} files, {len(train) + len(val)} bytes, vocab {len(vocab)}, "
          f"train {len(train)}, val {len(val)} tokens")

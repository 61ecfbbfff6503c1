#!/usr/bin/python3
"""The PyTorch twin of the character-level GPT example (tests/gpt_model.py), for side-by-side
speed and loss comparisons.

Same data (tests/gpt_model.py's load_corpus: the corpus bytes as ids into their sorted distinct
values, the first 90 % train, the rest validation), AdamW (decay 0.1 on the blocks' Linear weights
only, betas 0.9 and 0.99), gradient clipping at a norm of 1.0, a constant learning rate (--cosine:
a linear warmup over --lr-warmup steps, then a cosine down to lr / 10 at --iters). Step s trains on
--batch random windows: i = torch.randint(len(train) - block, (batch,), generator=g), with g seeded
once from --seed; x = train[i:i + block], y = train[i + 1:i + 1 + block]. Every --eval-every steps
(and after the last) the mean loss over --eval-iters random batches of train and of validation, in
eval mode without gradients (drawn from a second generator seeded from --seed + 1, so evaluation
does not shift the training batches), is printed as

  step K: train loss X, val loss Y, Z tokens/s

Z being the training tokens since the previous line over the training time alone (evaluation not
counted); then "Final val loss: Y" and

  RESULT tokens_per_s=<median of the per-line rates> val_loss=<final val loss> params=<count>

One thread by default (OMP/OpenBLAS/MKL set before torch is imported). --bf16 runs forward and loss
under torch.autocast('cpu', bfloat16) (master weights, gradients and AdamW in fp32; the attention
softmax and the cross-entropy in fp32). --warmup-iters N first runs N untimed training steps, then
restores the model, the optimizer and the batch generator, so the timed run and its losses are the
same as without them. --max-seconds S stops training once the training time reaches S.

usage: benchmarks/pytorch_gpt.py [--corpus PATH] [--layers 4 --heads 4 --embd 128 --block 64]
           [--batch 12] [--iters 2000] [--lr 1e-3] [--seed 1337] [--eval-every 500] [--eval-iters 20]
           [--bf16] [--cosine] [--lr-warmup 100] [--warmup-iters 0] [--max-seconds 0] [--threads 1]
"""
import argparse
import copy
import math
import os
import statistics
import sys
import time

os.environ.setdefault("OMP_NUM_THREADS", "1")
os.environ.setdefault("OPENBLAS_NUM_THREADS", "1")
os.environ.setdefault("MKL_NUM_THREADS", "1")
sys.path.insert(0, os.path.join(os.path.dirname(os.path.abspath(__file__)), "..", "tests"))
import gpt_model  # noqa: E402
import torch  # noqa: E402
import torch.nn.functional as F  # noqa: E402


def get_batch(data, block, batch, generator):
    i = torch.randint(len(data) - block, (batch,), generator=generator)
    offsets = torch.arange(block)
    x = data[i[:, None] + offsets]
    y = data[i[:, None] + offsets + 1]
    return x, y


def loss_of(model, x, y, bf16):
    with torch.autocast(device_type="cpu", dtype=torch.bfloat16, enabled=bf16):
        logits = model(x)
    return F.cross_entropy(logits.float().view(-1, logits.shape[-1]), y.view(-1))


def evaluate(model, splits, a, generator):
    """{split: mean loss over a.eval_iters random batches}, in eval mode without gradients."""
    model.eval()
    out = {}
    with torch.no_grad():
        for name, data in splits.items():
            out[name] = sum(loss_of(model, *get_batch(data, a.block, a.batch, generator), a.bf16).item()
                            for _ in range(a.eval_iters)) / a.eval_iters
    model.train()
    return out


def learning_rate(step, a):
    if not a.cosine:
        return a.lr
    warmup = min(a.lr_warmup, a.iters)
    if step < warmup:
        return a.lr * (step + 1) / warmup
    progress = (step - warmup) / max(1, a.iters - warmup)
    low = a.lr / 10
    return low + 0.5 * (1 + math.cos(math.pi * min(1.0, progress))) * (a.lr - low)


def train_step(model, opt, data, a, generator, lr):
    for group in opt.param_groups:
        group["lr"] = lr
    x, y = get_batch(data, a.block, a.batch, generator)
    loss = loss_of(model, x, y, a.bf16)
    opt.zero_grad(set_to_none=True)
    loss.backward()
    torch.nn.utils.clip_grad_norm_(model.parameters(), 1.0)
    opt.step()


def main():
    p = argparse.ArgumentParser(description="PyTorch twin of xtrain's char_gpt example.")
    p.add_argument("--corpus", default=os.environ.get("XTRAIN_GPT_CORPUS") or gpt_model.DEFAULT_CORPUS,
                   help="a text file, or a folder whose regular files are concatenated (default: %(default)s)")
    p.add_argument("--layers", type=int, default=4)
    p.add_argument("--heads", type=int, default=4)
    p.add_argument("--embd", type=int, default=128)
    p.add_argument("--block", type=int, default=64)
    p.add_argument("--batch", type=int, default=12)
    p.add_argument("--iters", type=int, default=2000)
    p.add_argument("--lr", type=float, default=1e-3)
    p.add_argument("--seed", type=int, default=1337)
    p.add_argument("--eval-every", type=int, default=500)
    p.add_argument("--eval-iters", type=int, default=20)
    p.add_argument("--bf16", action="store_true", help="autocast the forward to bfloat16 on the CPU")
    p.add_argument("--cosine", action="store_true", help="linear warmup then cosine decay to lr / 10")
    p.add_argument("--lr-warmup", type=int, default=100, help="warmup steps of --cosine (default %(default)s)")
    p.add_argument("--warmup-iters", type=int, default=0,
                   help="untimed steps first (model, optimizer and batch generator restored after them)")
    p.add_argument("--max-seconds", type=float, default=0, help="stop once the training time reaches this (0: no limit)")
    p.add_argument("--threads", type=int, default=1)
    a = p.parse_args()
    for name in ("layers", "heads", "embd", "block", "batch", "iters", "eval_every", "eval_iters", "threads"):
        if getattr(a, name) < 1:
            p.error(f"--{name.replace('_', '-')} must be at least 1")
    if a.embd % a.heads:
        p.error(f"--embd {a.embd} is not a multiple of --heads {a.heads}")
    try:
        train_ids, val_ids, vocab = gpt_model.load_corpus(a.corpus)
    except (OSError, ValueError) as e:
        sys.exit(f"error: {e}")
    if min(len(train_ids), len(val_ids)) <= a.block:
        sys.exit(f"error: corpus {a.corpus} too small for --block {a.block}: train {len(train_ids)}, "
                 f"val {len(val_ids)} tokens (each needs more than block)")
    torch.set_num_threads(a.threads)
    torch.manual_seed(a.seed)
    splits = {"train": torch.from_numpy(train_ids), "val": torch.from_numpy(val_ids)}
    model = gpt_model.GPT(len(vocab), a.block, a.layers, a.heads, a.embd)
    opt = torch.optim.AdamW(gpt_model.param_groups(model, 0.1), lr=a.lr, betas=(0.9, 0.99))
    g = torch.Generator().manual_seed(a.seed)
    g_eval = torch.Generator().manual_seed(a.seed + 1)
    count = sum(p.numel() for p in model.parameters())
    print(f"pytorch {torch.__version__} | threads {torch.get_num_threads()} | {'bf16 autocast' if a.bf16 else 'fp32'} "
          f"| GPT layers {a.layers} heads {a.heads} embd {a.embd} block {a.block} vocab {len(vocab)} | parameters {count} "
          f"| batch {a.batch} | {a.iters} iters | lr {a.lr:g}{' cosine' if a.cosine else ''} "
          f"| corpus {a.corpus}: train {len(train_ids)}, val {len(val_ids)} tokens", flush=True)

    if a.warmup_iters:
        saved = copy.deepcopy(model.state_dict()), copy.deepcopy(opt.state_dict()), g.get_state()
        for s in range(a.warmup_iters):
            train_step(model, opt, splits["train"], a, g, learning_rate(s, a))
        model.load_state_dict(saved[0])
        opt.load_state_dict(saved[1])
        g.set_state(saved[2])

    tokens_per_step = a.batch * a.block
    rates, train_seconds, interval_seconds, interval_steps = [], 0.0, 0.0, 0
    losses = evaluate(model, splits, a, g_eval)
    print(f"step 0: train loss {losses['train']:.4f}, val loss {losses['val']:.4f}", flush=True)
    step = 0
    while step < a.iters:
        start = time.perf_counter()
        train_step(model, opt, splits["train"], a, g, learning_rate(step, a))
        seconds = time.perf_counter() - start
        step += 1
        train_seconds += seconds
        interval_seconds += seconds
        interval_steps += 1
        out_of_time = a.max_seconds > 0 and train_seconds >= a.max_seconds
        if step % a.eval_every == 0 or step == a.iters or out_of_time:
            rate = interval_steps * tokens_per_step / interval_seconds
            rates.append(rate)
            losses = evaluate(model, splits, a, g_eval)
            print(f"step {step}: train loss {losses['train']:.4f}, val loss {losses['val']:.4f}, {rate:.0f} tokens/s",
                  flush=True)
            interval_seconds, interval_steps = 0.0, 0
        if out_of_time:
            print(f"stopped at step {step}: --max-seconds {a.max_seconds:g} of training time reached")
            break
    print(f"Total training time: {train_seconds:.2f} s ({step} steps, {step * tokens_per_step} tokens)")
    print(f"Final val loss: {losses['val']:.4f}")
    print(f"RESULT tokens_per_s={statistics.median(rates):.0f} val_loss={losses['val']:.4f} params={count}")


if __name__ == "__main__":
    main()

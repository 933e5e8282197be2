"""Probes of the look-up a RAG answer needs, on synthetic sequences (train/README.md, "What
stops the look-up at a distance"). Fine-tunes a checkpoint on recall sequences (recall_row:
facts `k1 k2 noise.. = v.`, then queries `? k1 k2 =`) with 0..G noise tokens between key and
`=`, or exactly G with --fixed, optionally mixed with gather sequences (--gather P: facts
`k1 k2 noise.. = k1 k2.`, the loss on the repeated key, which only a head that finds the
fact's first token answers) and optionally on a model grown by N layers. Every 100 steps it
prints the accuracy of recall at gap 0 and at G, and of gather at G, on fixed held-out rows.

    OPENBLAS_NUM_THREADS=1 /usr/bin/python3 train/recall_probe.py --gap 2 --fixed --steps 600

Nothing is written; it measures what the recipe's stages can teach, and how fast."""

import argparse
import os
import random
import sys
import time

import torch

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
import bpe  # noqa: E402
import train  # noqa: E402


def gather_row(tok, rng, gap):
    """3-8 facts `k1 k2 noise.. = k1 k2.` over random ordinary tokens, the loss on the repeated
    key: its first token is predicted from the `=` alone, so a head must find the fact's first
    token at the varying distance (the second one is then plain copying)."""
    dot, eq = tok.encode(".")[0], tok.encode("=")[0]
    lo, hi = 256, len(tok) - len(bpe.SPECIAL)
    ids, spans = [tok.id("<|im_start|>")], []
    for _ in range(rng.randint(3, 8)):
        k = [rng.randrange(lo, hi), rng.randrange(lo, hi)]
        ids += k + [rng.randrange(lo, hi) for _ in range(rng.randint(0, gap))] + [eq]
        spans.append((len(ids), len(ids) + 2))
        ids += k + [dot]
    return ids, [0] * len(ids), spans


def main(argv=None):
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--init", default="models/chunkgate-rag")
    ap.add_argument("--grow", type=int, default=0, help="layers to insert (Llama.grow)")
    ap.add_argument("--gap", type=int, default=3)
    ap.add_argument("--fixed", action="store_true", help="exactly --gap noise tokens per fact")
    ap.add_argument("--gather", type=float, default=0.0, help="share of gather sequences")
    ap.add_argument("--steps", type=int, default=600)
    ap.add_argument("--lr", type=float, default=1e-3)
    ap.add_argument("--batch", type=int, default=32)
    ap.add_argument("--seed", type=int, default=1)
    a = ap.parse_args(argv)
    torch.set_num_threads(2)
    torch.manual_seed(a.seed)
    tok = bpe.load(os.path.join(a.init, "tokenizer.json"))
    model = train.load_model(a.init)
    if a.grow:
        model.grow(a.grow)
    er = random.Random("probe")
    held = {"recall 0": [train.recall_row(tok, er, 0) for _ in range(100)],
            "recall %d" % a.gap: [train.recall_row(tok, er, a.gap, fixed=a.fixed)
                                  for _ in range(100)],
            "gather %d" % a.gap: [gather_row(tok, er, a.gap) for _ in range(100)]}
    opt = train.new_optimizer(model, a.lr)
    rng = random.Random(a.seed)
    t0 = time.time()
    for step in range(1, a.steps + 1):
        for g in opt.param_groups:
            g["lr"] = a.lr * min(1.0, step / 50)
        rows = [gather_row(tok, rng, a.gap) if rng.random() < a.gather else
                train.recall_row(tok, rng, a.gap, fixed=a.fixed) for _ in range(a.batch)]
        ids, m, w = train.batch(rows, rng, 0, 0.25)
        loss, _ = train.batch_losses(model(ids[:, :-1], m[:, :-1, :-1]), ids, w)
        train.take_step(model, opt, loss)
        if step % 100 == 0 or step == a.steps:
            accs = " ".join("%s %.3f" % (k, train.span_accuracy(model, rows))
                            for k, rows in held.items())
            print("step %d loss %.3f %s (%.0f s)" % (step, float(loss), accs, time.time() - t0),
                  flush=True)


if __name__ == "__main__":
    main()

#!/usr/bin/python3
"""Trains chunkgate's small RAG model: a byte-level BPE tokenizer and a LlamaForCausalLM
checkpoint that answers questions over fictional documents (train/world.py).

    OPENBLAS_NUM_THREADS=1 /usr/bin/python3 train/train.py --out models/rag
    OPENBLAS_NUM_THREADS=1 /usr/bin/python3 train/train.py --out models/rag-block \\
        --init models/rag --steps 600 --block-mask 0.5 --lr 5e-4

The first command trains from scratch; the second fine-tunes the first under the
chunk-isolating mask of DESIGN §5 for half of its batches (Block-Attention's recipe), which
makes the model reuse-ready. Both are deterministic from --seed for a given thread count
(CPU, Debian's python3-torch). Output: config.json, model.safetensors (BF16),
tokenizer.json, tokenizer_config.json (with the ChatML chat template), generation_config.json,
train_log.json and README.md (the model card).

Training sequences are what the worker computes for a chat request with `documents`: every
segment tokenized on its own and concatenated (the separators are not tokens), then the answer
and <|im_end|>. The loss weights answer tokens 1 and the rest --context-weight.
"""

import argparse
import ctypes
import json
import math
import os
import random
import signal
import struct
import sys
import time

os.environ.setdefault("OPENBLAS_NUM_THREADS", "1")
# threads with no work sleep rather than spin: torch's OpenMP threads (the elementwise passes)
# and OpenBLAS's (the products, under --blas-threads) take turns on the same cores, and one that
# spins waiting takes the core from the one with work. A float32 step of w256L6 on six-document
# prompts took 4.7-5.1 s on the 2-core Zen 3 with both set, against 6.3-7.0 s spinning, with
# the same results (the threads' shares of the work are unchanged)
os.environ.setdefault("OMP_WAIT_POLICY", "PASSIVE")
os.environ.setdefault("OPENBLAS_THREAD_TIMEOUT", "4")
import torch  # noqa: E402
import torch.nn.functional as F  # noqa: E402

HERE = os.path.dirname(os.path.abspath(__file__))
sys.path.insert(0, HERE)
import bpe  # noqa: E402
import world  # noqa: E402

CONFIG = dict(vocab_size=1024, hidden_size=128, num_hidden_layers=4, num_attention_heads=4,
              num_key_value_heads=2, intermediate_size=384, rope_theta=10000.0,
              rms_norm_eps=1e-5, max_position_embeddings=2048)


# further single-hop questions a training prompt carries as more chat turns (at least, at most)
EXTRA = (3, 8)


# ---- the model, from the published Llama formulas ----

class Llama(torch.nn.Module):
    def __init__(self, c):
        super().__init__()
        self.c = c
        d, hd = c["hidden_size"], c["hidden_size"] // c["num_attention_heads"]
        self.hd = hd
        self.nh, self.nkv = c["num_attention_heads"], c["num_key_value_heads"]
        self.embed = torch.nn.Embedding(c["vocab_size"], d)
        self.layers = torch.nn.ModuleList(self.new_layer() for _ in range(c["num_hidden_layers"]))
        self.norm = torch.nn.Parameter(torch.ones(d))
        inv = c["rope_theta"] ** (-torch.arange(0, hd, 2, dtype=torch.float64) / hd)
        ang = torch.arange(c["max_position_embeddings"], dtype=torch.float64)[:, None] * inv
        ang = torch.cat([ang, ang], dim=-1)
        self.register_buffer("cos", ang.cos().float(), persistent=False)
        self.register_buffer("sin", ang.sin().float(), persistent=False)
        # weights drawn with std 1/sqrt(fan-in) (residual outputs scaled down by the depth);
        # the embeddings (tied: also the output layer) with std c["embed_std"]: at GPT-2's
        # 0.02 a narrow model starts with token identities too faint for attention to match
        # on, and sits for a thousand steps or more on the plateau before copying heads form;
        # at 1.0 they form several times sooner (train/README.md)
        torch.nn.init.normal_(self.embed.weight, std=c.get("embed_std", 1.0))
        for L in self.layers:
            for lin in (L.q, L.k, L.v, L.gate, L.up):
                torch.nn.init.normal_(lin.weight, std=d ** -0.5)
            depth = math.sqrt(2 * len(self.layers))
            torch.nn.init.normal_(L.o.weight, std=d ** -0.5 / depth)
            torch.nn.init.normal_(L.down.weight, std=c["intermediate_size"] ** -0.5 / depth)

    def new_layer(self):
        d, hd, c = self.c["hidden_size"], self.hd, self.c
        L = torch.nn.Module()
        L.ln1 = torch.nn.Parameter(torch.ones(d))
        L.q = torch.nn.Linear(d, self.nh * hd, bias=False)
        L.k = torch.nn.Linear(d, self.nkv * hd, bias=False)
        L.v = torch.nn.Linear(d, self.nkv * hd, bias=False)
        L.o = torch.nn.Linear(self.nh * hd, d, bias=False)
        L.ln2 = torch.nn.Parameter(torch.ones(d))
        L.gate = torch.nn.Linear(d, c["intermediate_size"], bias=False)
        L.up = torch.nn.Linear(d, c["intermediate_size"], bias=False)
        L.down = torch.nn.Linear(c["intermediate_size"], d, bias=False)
        return L

    def grow(self, n):
        """Inserts n layers spread between the present ones (after every len/n of them), each
        with its attention and MLP outputs at zero: the grown model computes exactly what it
        did, and training gives the new layers their work (progressive stacking)."""
        d = self.c["hidden_size"]
        old = list(self.layers)
        every = len(old) / n
        out, added = [], 0
        for i, L in enumerate(old):
            out.append(L)
            while added < n and (i + 1) >= round(every * (added + 1)):
                N = self.new_layer()
                for lin in (N.q, N.k, N.v, N.gate, N.up):
                    torch.nn.init.normal_(lin.weight, std=d ** -0.5)
                torch.nn.init.zeros_(N.o.weight)
                torch.nn.init.zeros_(N.down.weight)
                out.append(N)
                added += 1
        self.layers = torch.nn.ModuleList(out)
        self.c["num_hidden_layers"] = len(out)

    @torch.no_grad()
    def widen(self, c):
        """This model in the larger geometry c (hidden size, head dim, KV heads, MLP width at
        least this model's, the same layers and head count), computing exactly what it computes:
        every old weight in place, the new ones that a product reads from at zero and the rest
        drawn as at initialisation, so that training gives the new width its work. RoPE pairs
        dims (i, i + hd/2) at frequency theta^(-2i/hd): an old pair i moves to the new pair 2i,
        which turns at the same frequency. Attention scores are divided by sqrt(hd), so the old
        query rows are scaled by sqrt(new hd / old hd); RMSNorm divides by the root mean square
        over all dims, so with the new dims of the residual stream at zero the norms' old
        weights are scaled by sqrt(old d / new d)."""
        d0, d1 = self.c["hidden_size"], c["hidden_size"]
        h0, h1 = self.hd, c["hidden_size"] // c["num_attention_heads"]
        nh, kv0, kv1 = self.nh, self.nkv, c["num_key_value_heads"]
        m0, m1 = self.c["intermediate_size"], c["intermediate_size"]
        assert c["num_attention_heads"] == nh and d1 >= d0 and h1 % h0 == 0 and m1 >= m0
        assert kv1 % kv0 == 0 and (nh // kv1) * kv1 == nh
        new = Llama(dict(c, embed_std=self.c.get("embed_std", 1.0)))
        step = h1 // h0
        rows = [step * i for i in range(h0 // 2)] + [h1 // 2 + step * i for i in range(h0 // 2)]
        nscale = math.sqrt(d0 / d1)
        new.embed.weight.zero_()
        new.embed.weight[:, :d0] = self.embed.weight
        new.norm.zero_()
        new.norm[:d0] = self.norm * nscale
        g0, g1 = nh // kv0, nh // kv1
        for A, B in zip(self.layers, new.layers):
            B.ln1.fill_(nscale)
            B.ln1[:d0] = A.ln1 * nscale
            B.ln2.fill_(nscale)
            B.ln2[:d0] = A.ln2 * nscale
            B.q.weight.zero_()
            B.o.weight.zero_()
            for h in range(nh):
                B.q.weight[h * h1 + torch.tensor(rows), :d0] = \
                    A.q.weight[h * h0:(h + 1) * h0] * math.sqrt(h1 / h0)
                B.o.weight[:d0, h * h1:h * h1 + h0] = A.o.weight[:, h * h0:(h + 1) * h0]
            for k in range(kv1):
                old = (k * g1) // g0  # the old KV head of this new head's queries
                B.k.weight[k * h1 + torch.tensor(rows), :d0] = A.k.weight[old * h0:(old + 1) * h0]
                B.v.weight[k * h1:k * h1 + h0, :d0] = A.v.weight[old * h0:(old + 1) * h0]
            for lin0, lin1 in ((A.gate, B.gate), (A.up, B.up)):
                lin1.weight[:m0, :d0] = lin0.weight
            B.down.weight.zero_()
            B.down.weight[:d0, :m0] = A.down.weight
        return new

    def rms(self, x, w):
        return x * torch.rsqrt(x.pow(2).mean(-1, keepdim=True) + self.c["rms_norm_eps"]) * w

    def rope(self, x, pos):
        cos, sin = self.cos[pos][:, None], self.sin[pos][:, None]
        h = x.shape[-1] // 2
        rot = torch.cat([-x[..., h:], x[..., :h]], dim=-1)
        return x * cos + rot * sin

    def forward(self, ids, mask):
        """ids [B, T]; mask [B, T, T] bool (True: may attend), causal or stricter. Logits
        [B, T, V].

        The query heads that share a KV head are one matrix product against it, their rows
        stacked ([T * g, hd] against [T, hd]: no broadcast batch dimension, which torch would
        expand into g copies of K and V and then multiply in small pieces), the 1/sqrt(head
        dim) scale is applied to the queries rather than to the [T, T] scores, and the mask is
        an additive bias built once for all layers and added by the product itself (baddbmm).
        The [T, T] passes are what a training step of long prompts spends most of its time on,
        and the mask is causal (or stricter: the block mask), so the queries go in up to four
        runs of positions, each against the keys up to its own end: 4 runs compute 5/8 of the
        scores."""
        B, T = ids.shape
        pos = torch.arange(T, device=ids.device)
        h = self.embed(ids)
        g, kv, hd = self.nh // self.nkv, self.nkv, self.hd
        runs = max(1, min(4, T // 128))
        cuts = [T * i // runs for i in range(runs + 1)]
        bias = None
        for L in self.layers:
            x = self.rms(h, L.ln1)
            q = self.rope(L.q(x).view(B, T, self.nh, hd), pos) * (1.0 / math.sqrt(hd))
            k = self.rope(L.k(x).view(B, T, kv, hd), pos)
            v = L.v(x).view(B, T, kv, hd)
            # rows of q in (position, head of the group) order: a run of positions is a run
            # of rows
            q = q.view(B, T, kv, g, hd).transpose(1, 2).reshape(B * kv, T * g, hd)
            k = k.transpose(1, 2).reshape(B * kv, T, hd)
            v = v.transpose(1, 2).reshape(B * kv, T, hd)
            if bias is None:
                # in the dtype the products run in (bfloat16 under --bf16), converted once
                dt = (torch.get_autocast_gpu_dtype() if q.is_cuda and torch.is_autocast_enabled()
                      else torch.get_autocast_cpu_dtype()
                      if not q.is_cuda and torch.is_autocast_cpu_enabled() else q.dtype)
                bias = torch.zeros(mask.shape, dtype=dt, device=q.device)
                bias = bias.masked_fill_(~mask, float("-inf"))[:, None, :, None]
                bias = bias.expand(B, kv, T, g, T).reshape(B * kv, T * g, T)
            out = []
            for t0, t1 in zip(cuts, cuts[1:]):
                r0, r1 = t0 * g, t1 * g
                s = torch.baddbmm(bias[:, r0:r1, :t1], q[:, r0:r1], k[:, :t1].transpose(1, 2))
                out.append(torch.softmax(s, dim=-1) @ v[:, :t1])
            a = out[0] if runs == 1 else torch.cat(out, 1)
            h = h + L.o(a.view(B, kv, T, g, hd).transpose(1, 2).reshape(B, T, -1))
            x = self.rms(h, L.ln2)
            h = h + L.down(F.silu(L.gate(x)) * L.up(x))
        return self.rms(h, self.norm) @ self.embed.weight.t()

    def hf_tensors(self):
        """The weights under their Hugging Face names (tied embeddings: no lm_head)."""
        t = {"model.embed_tokens.weight": self.embed.weight, "model.norm.weight": self.norm}
        for i, L in enumerate(self.layers):
            p = "model.layers.%d." % i
            t.update({p + "input_layernorm.weight": L.ln1,
                      p + "self_attn.q_proj.weight": L.q.weight,
                      p + "self_attn.k_proj.weight": L.k.weight,
                      p + "self_attn.v_proj.weight": L.v.weight,
                      p + "self_attn.o_proj.weight": L.o.weight,
                      p + "post_attention_layernorm.weight": L.ln2,
                      p + "mlp.gate_proj.weight": L.gate.weight,
                      p + "mlp.up_proj.weight": L.up.weight,
                      p + "mlp.down_proj.weight": L.down.weight})
        return t


# ---- safetensors ----

def bf16_bytes(t):
    """Round-to-nearest-even bf16 of a float32 tensor, as raw little-endian bytes."""
    i = t.detach().float().cpu().contiguous().view(torch.int32).to(torch.int64) & 0xFFFFFFFF
    r = (i + 0x7FFF + ((i >> 16) & 1)) >> 16
    return r.to(torch.int32).to(torch.int16).numpy().astype("<i2").tobytes()


def save_safetensors(path, tensors):
    header, blobs, off = {}, [], 0
    for name in sorted(tensors):
        b = bf16_bytes(tensors[name])
        header[name] = {"dtype": "BF16", "shape": list(tensors[name].shape),
                        "data_offsets": [off, off + len(b)]}
        blobs.append(b)
        off += len(b)
    h = json.dumps(header, separators=(",", ":")).encode()
    h += b" " * (-len(h) % 8)
    with open(path, "wb") as f:
        f.write(struct.pack("<Q", len(h)) + h)
        for b in blobs:
            f.write(b)


def load_safetensors(path):
    with open(path, "rb") as f:
        n = struct.unpack("<Q", f.read(8))[0]
        header = json.loads(f.read(n))
        data = f.read()
    out = {}
    for name, d in header.items():
        if name == "__metadata__":
            continue
        a, b = d["data_offsets"]
        assert d["dtype"] == "BF16"
        raw = torch.frombuffer(bytearray(data[a:b]), dtype=torch.int16).to(torch.int32)
        out[name] = (raw << 16).view(torch.float32).reshape(d["shape"])
    return out


def round_bf16_(model):
    """Rounds the weights to what the checkpoint stores, so evaluation sees the served model."""
    with torch.no_grad():
        for name, t in model.hf_tensors().items():
            raw = torch.frombuffer(bytearray(bf16_bytes(t)), dtype=torch.int16).to(torch.int32)
            t.copy_((raw << 16).view(torch.float32).reshape(t.shape))


def load_into(model, path):
    got = load_safetensors(path)
    with torch.no_grad():
        for name, t in model.hf_tensors().items():
            t.copy_(got[name])


def load_model(d):
    """The checkpoint in directory d, in the geometry its config.json gives."""
    with open(os.path.join(d, "config.json")) as f:
        got = json.load(f)
    model = Llama({k: got[k] for k in CONFIG})
    load_into(model, os.path.join(d, "model.safetensors"))
    return model


# ---- sequences and masks ----

def encode(tok, ex):
    """Token ids of an example's segments (each on its own), their segment roles (0 system,
    1.. chunks, -1 question and answer) and the answer's tokens (with <|im_end|>)."""
    ids, seg = [], []
    segs = world.segments(ex)
    for i, s in enumerate(segs):
        t = tok.encode(s)
        ids += t
        seg += [i if i < len(segs) - 1 else -1] * len(t)
    ans = tok.encode(ex["answer"]) + [tok.id("<|im_end|>")]
    return ids, seg, ans


def encode_turns(tok, ex):
    """A training sequence: the example's prompt and answer, then its further questions as more
    chat turns (as the template renders them). Returns the ids, the segment roles and the
    answer weights' spans [(start, end)) of the tokens that are answers."""
    ids, seg, ans = encode(tok, ex)
    spans = [(len(ids), len(ids) + len(ans))]
    ids = ids + ans
    for q, a in ex.get("more", []):
        turn = tok.encode("\n<|im_start|>user\n" + q + "<|im_end|>\n<|im_start|>assistant\n")
        ids += turn
        at = tok.encode(a) + [tok.id("<|im_end|>")]
        spans.append((len(ids), len(ids) + len(at)))
        ids += at
    return ids, seg + [-1] * (len(ids) - len(seg)), spans


def masks(segs, T, block):
    """[T, T] attention mask for one sequence whose segment roles are segs (-2 marks padding,
    which may stand anywhere): causal, and with block set the chunk-isolating mask of DESIGN §5
    (block = "strict": a chunk sees itself; "sys": also the system)."""
    seg = torch.full((T,), -2, dtype=torch.long)
    seg[:len(segs)] = torch.tensor(segs)
    causal = torch.tril(torch.ones(T, T, dtype=torch.bool))
    valid = (seg != -2)
    m = causal & valid[None, :]
    if block:
        qi = (seg == -1)[:, None]          # question / answer rows see everything
        same = seg[:, None] == seg[None, :]
        allowed = qi | same
        if block == "sys":
            allowed = allowed | (seg[None, :] == 0)
        m = m & allowed
    m |= torch.eye(T, dtype=torch.bool)    # padding rows attend to themselves (no NaN)
    return m


def copy_row(tok, rng):
    """A copying sequence: random ordinary tokens, then the same tokens again, with the loss on
    the repeat. Mixed into the batches, it grows the attention heads that find an earlier
    occurrence of the current token and copy what followed it ("induction heads") much sooner
    than the RAG examples alone do; every answer here needs them."""
    n = rng.randint(8, 32)
    body = [rng.randrange(256, len(tok) - len(bpe.SPECIAL)) for _ in range(n)]
    ids = [tok.id("<|im_start|>")] + body + body
    return ids, [0] * len(ids), [(1 + n, len(ids))]


def recall_row(tok, rng, gap, names=False, fixed=False):
    """An associative recall sequence over random ordinary tokens: 3-8 facts `k1 k2 g.. = v.`,
    each a key of two tokens (half of them sharing one with an earlier key), 0..gap tokens of
    noise, `=` and a value of one or two tokens; then three queries `? k1 k2 =` whose values
    carry the loss. Only the whole key answers, and with gap > 0 the value stands at a varying
    distance from its key: the look-up a RAG answer needs (the name asked for, then the value
    stated after it), without the language around it. Copying heads alone do not do it.
    With names set, the keys are people's names (half of them namesakes) and the values their
    cities, as the documents spell them: the same look-up on the tokens of the RAG data.
    With fixed set, every fact has exactly gap tokens of noise (train/recall_probe.py)."""
    dot, eq, ask = tok.encode(".")[0], tok.encode("=")[0], tok.encode("?")[0]
    lo, hi = 256, len(tok) - len(bpe.SPECIAL)
    n = rng.randint(3, 8)
    if names:
        w = world.World(rng, "train")
        people = [w.person()]
        while len(people) < n:
            people.append((rng.random() < 0.5 and w.namesake(rng.choice(people))) or w.person())
        keys = [tok.encode(p["name"]) for p in people]
        vals = [tok.encode(w.city()) for _ in people]
    else:
        keys = []
        while len(keys) < n:
            k = [rng.randrange(lo, hi), rng.randrange(lo, hi)]
            if keys and rng.random() < 0.5:
                o = rng.choice(keys)
                i = rng.randrange(2)
                k[i] = o[i]
            if k not in keys:
                keys.append(k)
        vals = [[rng.randrange(lo, hi) for _ in range(rng.randint(1, 2))] for _ in keys]
    ids = [tok.id("<|im_start|>")]
    for k, v in zip(keys, vals):
        noise = gap if fixed else rng.randint(0, gap)
        ids += k + [rng.randrange(lo, hi) for _ in range(noise)] + [eq] + v + [dot]
    spans = []
    for _ in range(3):
        i = rng.randrange(n)
        ids += [ask] + keys[i] + [eq]
        spans.append((len(ids), len(ids) + len(vals[i]) + 1))
        ids += vals[i] + [dot]
    return ids, [0] * len(ids), spans


def batches(tok, rng, n, block_frac, ctx_w, docs_at, copy_at, group=8, hard=0.0, bind=0.0,
            recall=0.0, gap_at=lambda: 0, recall_names=0.0):
    """Batches of n training sequences, drawn `group` batches at a time and sorted by length
    so that little of each batch is padding. docs_at() is the curriculum's most documents,
    copy_at() its share of copying sequences, hard the share of examples with hard distractors
    (world.question), bind the share of binding drills (world.binding_example), recall the
    share of recall sequences (recall_row) with gap_at() tokens of noise at most, recall_names
    the share of those over people's names."""
    while True:
        rows = []
        for _ in range(n * group):
            if rng.random() < copy_at():
                rows.append(copy_row(tok, rng))
                continue
            if recall and rng.random() < recall:
                rows.append(recall_row(tok, rng, gap_at(),
                                       bool(recall_names) and rng.random() < recall_names))
                continue
            if bind and rng.random() < bind:
                rows.append(encode_turns(tok, world.binding_example(rng, "train",
                                                                    rng.randint(*EXTRA))))
                continue
            ex = world.example(rng, "train", max_docs=docs_at(), extra=rng.randint(*EXTRA),
                               hard=bool(hard) and rng.random() < hard)
            rows.append(encode_turns(tok, ex))
        rows.sort(key=lambda r: len(r[0]))
        order = list(range(group))
        rng.shuffle(order)
        for g in order:
            yield batch(rows[g * n:(g + 1) * n], rng, block_frac, ctx_w)


def batch(rows, rng, block_frac, ctx_w):
    n = len(rows)
    T = max(len(r[0]) for r in rows)
    ids = torch.zeros(n, T, dtype=torch.long)
    w = torch.zeros(n, T)
    ms = []
    for b, (x, seg, spans) in enumerate(rows):
        ids[b, :len(x)] = torch.tensor(x)
        # weight of predicting token t+1 at position t
        w[b, :len(x) - 1] = ctx_w
        for a0, a1 in spans:
            w[b, a0 - 1:a1 - 1] = 1.0
        block = None
        if block_frac and rng.random() < block_frac:
            block = "strict" if rng.random() < 0.75 else "sys"
        ms.append(masks(seg, T, block))
    return ids, torch.stack(ms), w


# ---- optimisation ----

def new_optimizer(model, lr):
    """AdamW with weight decay on the weight matrices only (not on the norms' gains)."""
    decay = [p for p in model.parameters() if p.dim() == 2]
    rest = [p for p in model.parameters() if p.dim() < 2]
    return torch.optim.AdamW([{"params": decay, "weight_decay": 0.05},
                              {"params": rest, "weight_decay": 0.0}],
                             lr=lr, betas=(0.9, 0.98), eps=1e-8)


def batch_losses(logits, ids, w):
    """From the logits of ids[:, :-1]: the batch's loss weighted by w (batch()'s weights:
    answer tokens 1, the rest the context weight) and the mean loss of its answer tokens."""
    ce = F.cross_entropy(logits.float().reshape(-1, logits.shape[-1]), ids[:, 1:].reshape(-1),
                         reduction="none")
    wt = w[:, :-1].reshape(-1)
    return (ce * wt).sum() / wt.sum(), (ce * (wt == 1.0)).sum() / (wt == 1.0).sum()


def take_step(model, opt, loss):
    """One optimizer step on loss, the gradient's norm clipped to 1."""
    opt.zero_grad(set_to_none=True)
    loss.backward()
    torch.nn.utils.clip_grad_norm_(model.parameters(), 1.0)
    opt.step()


# ---- evaluation ----

@torch.no_grad()
def evaluate(model, tok, exs, block=None, batch=64):
    """Exact match per kind, by teacher forcing: greedy decoding reproduces the answer exactly
    when, at every answer position and at <|im_end|>, the expected token is the most likely one,
    so one forward pass per example decides it (an answer the model would spell with other
    tokens counts as wrong, which is stricter than comparing text)."""
    model.eval()
    right = {k: [0, 0] for k in world.KINDS}
    for b0 in range(0, len(exs), batch):
        part = exs[b0:b0 + batch]
        rows = []
        for ex in part:
            ids, seg, ans = encode(tok, ex)
            rows.append((ids + ans, seg + [-1] * len(ans), len(ids)))
        T = max(len(r[0]) for r in rows)
        x = torch.zeros(len(rows), T, dtype=torch.long)
        for i, (ids, _, _) in enumerate(rows):
            x[i, :len(ids)] = torch.tensor(ids)
        m = torch.stack([masks(seg, T, block) for _, seg, _ in rows])
        pred = model(x.to(model.cos.device), m.to(model.cos.device)).argmax(-1).cpu()
        for ex, (ids, _, plen), p in zip(part, rows, pred):
            ok = bool((p[plen - 1:len(ids) - 1] == x[0].new_tensor(ids[plen:])).all())
            right[ex["kind"]][0] += ok
            right[ex["kind"]][1] += 1
    model.train()
    return {k: round(a / n, 4) for k, (a, n) in right.items() if n}


@torch.no_grad()
def evaluate_recall(model, tok, gap, n=100, names=False):
    """Exact match on the queries of n recall sequences (recall_row) with 0..gap noise tokens,
    by teacher forcing as evaluate() does."""
    rng = random.Random("recall-%d%s" % (gap, " names" if names else ""))
    return span_accuracy(model, [recall_row(tok, rng, gap, names) for _ in range(n)])


@torch.no_grad()
def span_accuracy(model, rows):
    """Exact match on the answer spans of rows (ids, segments, spans), by teacher forcing."""
    model.eval()
    ids, m, _ = batch(rows, random.Random(0), 0, 0.0)
    pred = model(ids.to(model.cos.device), m.to(model.cos.device)).argmax(-1).cpu()
    right = total = 0
    for b, (_, _, spans) in enumerate(rows):
        for a0, a1 in spans:
            right += bool((pred[b, a0 - 1:a1 - 1] == ids[b, a0:a1]).all())
            total += 1
    model.train()
    return round(right / total, 4)


# ---- files ----

def write_checkpoint(out, model, tok, log, args):
    os.makedirs(out, exist_ok=True)
    c = model.c
    cfg = {"architectures": ["LlamaForCausalLM"], "model_type": "llama",
           "hidden_act": "silu", "attention_bias": False, "mlp_bias": False,
           "head_dim": c["hidden_size"] // c["num_attention_heads"],
           "tie_word_embeddings": True, "torch_dtype": "bfloat16",
           "bos_token_id": None, "eos_token_id": tok.id("<|im_end|>"),
           "pad_token_id": tok.id("<|endoftext|>"), "rope_scaling": None}
    cfg.update({k: v for k, v in c.items() if k != "embed_std"})
    with open(os.path.join(out, "config.json"), "w") as f:
        json.dump(cfg, f, indent=2)
    with open(os.path.join(out, "generation_config.json"), "w") as f:
        json.dump({"eos_token_id": tok.id("<|im_end|>"), "do_sample": False}, f, indent=2)
    save_safetensors(os.path.join(out, "model.safetensors"), model.hf_tensors())
    with open(os.path.join(out, "tokenizer.json"), "w") as f:
        json.dump(tok.to_json(), f, ensure_ascii=False)
    with open(os.path.join(out, "tokenizer_config.json"), "w") as f:
        json.dump({"tokenizer_class": "PreTrainedTokenizerFast", "bos_token": None,
                   "eos_token": "<|im_end|>", "pad_token": "<|endoftext|>",
                   "add_bos_token": False, "model_max_length": c["max_position_embeddings"],
                   "chat_template": world.CHAT_TEMPLATE}, f, indent=2)
    with open(os.path.join(out, "train_log.json"), "w") as f:
        json.dump(log, f, indent=1)
    write_card(out, log, model)


def loss_svg(points, path):
    """The training loss curve (weighted loss and answer-token loss against step) as SVG."""
    W, H, L, B = 640, 320, 60, 40
    xs = [p[0] for p in points]
    ymax = max(max(p[1], p[2]) for p in points)
    X = lambda v: L + v / max(xs) * (W - L - 20)  # noqa: E731
    Y = lambda v: H - B - v / ymax * (H - B - 20)  # noqa: E731
    out = ['<svg xmlns="http://www.w3.org/2000/svg" width="%d" height="%d" font-family="sans-serif" '
           'font-size="11"><rect width="100%%" height="100%%" fill="white"/>' % (W, H),
           '<line x1="%d" y1="%d" x2="%d" y2="%d" stroke="black"/>' % (L, H - B, W - 20, H - B),
           '<line x1="%d" y1="%d" x2="%d" y2="20" stroke="black"/>' % (L, H - B, L)]
    for i in range(5):
        v = ymax * i / 4
        out.append('<text x="%d" y="%.0f" text-anchor="end">%.2f</text>' % (L - 4, Y(v) + 4, v))
        s = max(xs) * i / 4
        out.append('<text x="%.0f" y="%d" text-anchor="middle">%d</text>' % (X(s), H - B + 14, s))
    for col, k, name in (("#036", 1, "weighted loss"), ("#c00", 2, "answer-token loss")):
        pts = " ".join("%.1f,%.1f" % (X(p[0]), Y(p[k])) for p in points)
        out.append('<polyline fill="none" stroke="%s" points="%s"/>' % (col, pts))
        out.append('<text x="%d" y="%d" fill="%s">%s</text>' % (W - 160, 30 + 14 * k, col, name))
    out.append('<text x="%d" y="%d" text-anchor="middle">step</text></svg>' % ((W + L) / 2, H - 6))
    with open(path, "w") as f:
        f.write("\n".join(out) + "\n")


def parents(init):
    """The runs a fine-tune of init goes on from, first run first, each as its train_log.json
    has it (args, seconds, loss, probe, held-out), so that the model card gives the whole
    recipe and the whole loss curve without the earlier runs' directories."""
    if not init or not os.path.exists(os.path.join(init, "train_log.json")):
        return []
    with open(os.path.join(init, "train_log.json")) as f:
        prev = json.load(f)
    keep = {k: prev[k] for k in ("args", "seconds", "loss", "probe", "heldout") if k in prev}
    return prev.get("parents", []) + [keep]


def shown_path(path):
    """A path as a model card shows it: relative to the repository, or <name> outside it."""
    rel = os.path.relpath(os.path.abspath(path), os.path.dirname(HERE))
    return "<%s>" % os.path.basename(os.path.normpath(path)) if rel.startswith("..") else rel


def recipe_command(out, a):
    """The train.py command line of a run with options a (its log's args) and output out."""
    default = vars(parser().parse_args(["--out", a["out"]]))
    cmd = "OPENBLAS_NUM_THREADS=1 /usr/bin/python3 train/train.py --out %s" % shown_path(out)
    for k, v in a.items():
        if k in ("out", "card", "resume", "stop_at") or (v == default.get(k) and k != "seed") \
                or v is None:
            continue
        if k == "init":
            v = shown_path(v)
        if isinstance(v, bool):  # a flag (store_true) that is set
            cmd += " --%s" % k.replace("_", "-")
            continue
        cmd += " --%s %s" % (k.replace("_", "-"), v if not isinstance(v, float) else "%g" % v)
    return cmd


def write_card(out, log, model):
    """README.md: the model card (command, seed, data, loss curve, held-out accuracy)."""
    a = log["args"]
    chain = log.get("parents", [])
    cmd = recipe_command(out, a)
    n_params = sum(p.numel() for p in model.parameters())
    lines = ["# %s" % os.path.basename(os.path.normpath(os.path.abspath(out))), "",
             "A small LlamaForCausalLM trained by chunkgate's recipe (`train/`) to answer questions "
             "over fictional documents. It exists so that chunk reuse can be measured on answers, "
             "not on random weights; it knows nothing of the real world.", "",
             "- Recipe: `%s` (%d threads, Debian python3-torch on CPU)." % (cmd, a["threads"])
             if not chain else
             "- Recipe (%d threads, Debian python3-torch on CPU), %d runs, each from the one "
             "before:\n%s" % (a["threads"], len(chain) + 1, "\n".join(
                 "  %d. `%s`" % (i + 1, recipe_command(c["args"]["out"], c["args"]))
                 for i, c in enumerate(chain + [log]))),
             "- Architecture: %d layers, hidden %d, %d heads / %d KV heads (head dim %d), MLP %d, "
             "vocabulary %d (byte-level BPE trained by the recipe), tied embeddings, RoPE theta "
             "%g; %.2f M parameters, stored as BF16." % (
                 model.c["num_hidden_layers"], model.c["hidden_size"],
                 model.c["num_attention_heads"], model.c["num_key_value_heads"],
                 model.c["hidden_size"] // model.c["num_attention_heads"],
                 model.c["intermediate_size"], model.c["vocab_size"], model.c["rope_theta"],
                 n_params / 1e6),
             "- Data (`train/world.py`, drawn fresh for every batch from the seed): a world of "
             "people, companies and cities; each training example is 1-6 documents (growing over "
             "the first %d%% of the run; a person's city, employer, job and age; a company's "
             "city, product and founding year, in varied sentences with filler), shuffled, under "
             "one of several system prompts, and one question: single-hop, two-hop (a person's "
             "employer's city or product), comparison (ages, founding years) or about someone in "
             "no document (\"unknown\"), then %d-%d more single-hop questions as further turns; "
             "some sequences are copying sequences (train/README.md). The "
             "sequence is what chunkgate-worker computes for a chat request with `documents` "
             "under the ChatML template: each segment tokenized on its own. The loss weights the "
             "answer tokens 1 and the rest %g." % (round(100 * a["curriculum"]), EXTRA[0], EXTRA[1],
                                                   a["context_weight"]),
             "- Held out: entity names (one in eight, by a hash of the name; evaluation uses only "
             "those), and some document sentences, questions and system prompts.",
             "- Attention during training: plain causal%s." % (
                 "" if not a["block_mask"] else
                 "; %d%% of the batches under the chunk-isolating mask of DESIGN §5 (three in four "
                 "of those `strict`, the rest `sys`)" % round(100 * a["block_mask"])),
             "- Time: %s s." % log.get("seconds", "-") if not chain else
             "- Time: %s s (%s)." % (sum(c.get("seconds", 0) for c in chain + [log]),
                                    " + ".join(str(c.get("seconds", "-")) for c in chain + [log])),
             ""]
    if "heldout" in log:
        h = log["heldout"]
        lines += ["## Held-out exact match (torch, greedy; %d questions per kind)" % a["eval_n"], "",
                  "| attention | " + " | ".join(world.KINDS) + " |",
                  "|---" * (len(world.KINDS) + 1) + "|"]
        for name, label in (("full", "causal (full prefill)"),
                            ("strict_mask", "chunk-isolating mask, strict"),
                            ("sys_mask", "chunk-isolating mask, sys")):
            lines.append("| %s | %s |" % (label, " | ".join("%.1f%%" % (100 * h[name][k])
                                                             for k in world.KINDS)))
        lines += ["", "Every evaluation prompt carries 4-6 documents. The masked rows are what "
                  "strict and sys reuse compute without any recompute; `bench/README.md` measures "
                  "the same through the gateway, and `train/README.md` breaks the accuracy down "
                  "by the number of documents and the phrasings.", ""]
    # the whole recipe's curve: each run's steps after those of the runs before it
    pts, probes, base = [], [], 0
    for c in chain + [log]:
        pts += [[base + p[0]] + p[1:] for p in c.get("loss", [])]
        probes += [[base + st, acc] for st, acc in c.get("probe", [])]
        base = pts[-1][0] if pts else base  # a run under --seconds ends before --steps
    if pts:
        loss_svg(pts, os.path.join(out, "loss.svg"))
        lines += ["## Training loss", "", "![loss](loss.svg)", ""]
        lines += ["Steps are counted across the recipe's runs.", ""] if chain else []
        lines += ["| step | weighted loss | answer-token loss |", "|---|---|---|"]
        for p in pts[::max(1, len(pts) // 12)] + ([pts[-1]] if len(pts) % 12 else []):
            lines.append("| %d | %.3f | %.3f |" % tuple(p))
        lines.append("")
    if probes:
        lines += ["## Held-out probe during training (25 questions per kind)", "",
                  "| step | " + " | ".join(world.KINDS) + " |", "|---" * (len(world.KINDS) + 1) + "|"]
        for step, acc in probes:
            lines.append("| %d | %s |" % (step, " | ".join("%.0f%%" % (100 * acc.get(k, 0))
                                                          for k in world.KINDS)))
        lines.append("")
    with open(os.path.join(out, "README.md"), "w") as f:
        f.write("\n".join(lines))


def lr_shape(args, step):
    """The learning rate's share of --lr at step (after the warmup)."""
    if args.schedule == "wsd":
        left = (args.steps - step) / max(1.0, args.decay * args.steps)
        return 0.1 + 0.9 * min(1.0, max(0.0, left))
    return 0.1 + 0.9 * 0.5 * (1 + math.cos(math.pi * step / args.steps))


def args_set(args, name):
    """Whether --name was given a value other than its default."""
    return getattr(args, name) != parser().get_default(name)


def parser():
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--out", required=True)
    ap.add_argument("--seed", type=int, default=1)
    ap.add_argument("--steps", type=int, default=2400)
    ap.add_argument("--batch", type=int, default=16)
    ap.add_argument("--lr", type=float, default=2e-3)
    ap.add_argument("--warmup", type=int, default=100)
    ap.add_argument("--schedule", choices=("cosine", "wsd"), default="cosine",
                    help="learning rate after the warmup: a cosine down to a tenth, or constant "
                         "until the last --decay share of the run, then linear down to a tenth")
    ap.add_argument("--decay", type=float, default=0.2, help="the share of the run --schedule wsd decays over")
    ap.add_argument("--context-weight", type=float, default=0.25)
    ap.add_argument("--copy-steps", type=int, default=3000,
                    help="at most this many first steps on copying sequences alone, until their "
                         "loss is under 1 nat (none with --init)")
    ap.add_argument("--copy-warmup", type=float, default=0.0,
                    help="share of the run whose batches are a third copying sequences")
    ap.add_argument("--embed-std", type=float, default=1.0,
                    help="standard deviation of the initial embeddings")
    ap.add_argument("--curriculum", type=float, default=0.3,
                    help="share of the run over which prompts grow from 1 to 6 documents")
    ap.add_argument("--hard", type=float, default=0.0,
                    help="share of training examples whose distractors state the asked fact for "
                    "entities of the same type, half of them with names sharing a part")
    ap.add_argument("--bind", type=float, default=0.0,
                    help="share of training sequences that are binding drills: one-sentence "
                    "documents stating the same fact for several entities")
    ap.add_argument("--recall", type=float, default=0.0,
                    help="share of recall sequences (random-token key look-ups) among the RAG "
                    "examples")
    ap.add_argument("--recall-gap", type=int, default=3,
                    help="most noise tokens between a recall key and its value")
    ap.add_argument("--recall-names", type=float, default=0.0,
                    help="share of the recall sequences whose keys are people's names and "
                    "values their cities")
    ap.add_argument("--recall-steps", type=int, default=0,
                    help="a stage of recall sequences alone before the RAG examples, the gap "
                    "growing from 0 to --recall-gap over it")
    ap.add_argument("--rope-theta", type=float, default=CONFIG["rope_theta"])
    ap.add_argument("--hidden", type=int, default=CONFIG["hidden_size"])
    ap.add_argument("--layers", type=int, default=CONFIG["num_hidden_layers"])
    ap.add_argument("--heads", type=int, default=CONFIG["num_attention_heads"])
    ap.add_argument("--kv-heads", type=int, default=CONFIG["num_key_value_heads"])
    ap.add_argument("--mlp", type=int, default=CONFIG["intermediate_size"])
    ap.add_argument("--bf16", action="store_true",
                    help="train the matrix products in bfloat16 (torch.autocast; the weights and "
                    "optimizer stay float32): several times faster where oneDNN has AMX or "
                    "AVX512-BF16; refused on a CPU without AVX-512, where it is 10x slower")
    ap.add_argument("--block-mask", type=float, default=0.0,
                    help="share of batches trained under the chunk-isolating mask")
    ap.add_argument("--init", help="fine-tune this checkpoint directory (its tokenizer too)")
    ap.add_argument("--grow-layers", type=int, default=0,
                    help="with --init: insert this many layers between the checkpoint's, their "
                         "outputs starting at zero")
    ap.add_argument("--eval-every", type=int, default=200)
    ap.add_argument("--eval-n", type=int, default=200, help="held-out questions per kind, at the end")
    ap.add_argument("--threads", type=int, default=2)
    ap.add_argument("--blas-threads", type=int, default=1,
                    help="OpenBLAS threads for the steps on RAG prompts (the copying and recall "
                         "stages keep one); 2 pays at hidden 256 on 2 cores, not at hidden 128 "
                         "(train/README.md)")
    ap.add_argument("--device", default="cpu",
                    help="where to train: cpu (the committed checkpoints), or cuda to try settings "
                         "fast; a run on a GPU is not bit-identical to the same run on the CPU")
    ap.add_argument("--seconds", type=float, default=0.0,
                    help="a time budget: the run ends after --steps or after this many seconds, "
                         "whichever comes first, and the schedule and curriculum follow the "
                         "larger share done; 0: none (the committed runs)")
    ap.add_argument("--resume", action="store_true",
                    help="continue the run in --out from its resume.pt, which the run writes "
                         "at every --eval-every and when it is stopped with SIGTERM or SIGINT; "
                         "the resumed run is bit-identical to one that never stopped (the same "
                         "options are required, and --seconds is not allowed; --steps may "
                         "change while a --schedule wsd run is before its decay, bit-identical "
                         "to a run started with the new --steps)")
    ap.add_argument("--stop-at", type=int, default=0,
                    help="stop as SIGTERM does, at the first point from this step on where the "
                         "run can be saved for --resume (at most 8 steps on): to spread a long "
                         "run over several sittings")
    ap.add_argument("--card", action="store_true",
                    help="only rewrite the model card of --out from its train_log.json")
    return ap


def blas_threads(n):
    """Sets the threads of OpenBLAS, through which Debian's torch runs its float32 matrix
    products on the CPU (started at one: OPENBLAS_NUM_THREADS above). False where the BLAS
    is not OpenBLAS. The results are deterministic for a given count, not across counts."""
    for name in ("libopenblas.so.0", "libblas.so.3"):
        try:
            lib = ctypes.CDLL(name)
        except OSError:
            continue
        if hasattr(lib, "openblas_set_num_threads"):
            lib.openblas_set_num_threads(int(n))
            return True
    return False


# ---- stopping and resuming ----

RESUMABLE = ("step", "run", "rag0", "copying", "recall0", "recalling", "drawn")


def save_resume(out, model, opt, rng, tok, log, state, seconds):
    """Writes out/resume.pt: everything the run needs to go on exactly where it is (the float32
    weights, the optimizer, the random state, the stage, the log). Written between steps where
    no batch generator holds drawn rows (see main), so the data from here on is drawn again
    from the random state alone."""
    os.makedirs(out, exist_ok=True)
    path = os.path.join(out, "resume.pt")
    torch.save({"model": model.state_dict(), "opt": opt.state_dict(), "rng": rng.getstate(),
                "torch_rng": torch.get_rng_state(), "merges": tok.merges, "log": log,
                "state": state, "seconds": seconds}, path + ".tmp")
    os.replace(path + ".tmp", path)


def docs_at_step(a, at, rag0):
    """The documents of a prompt at run position at (steps): 1, growing to 6 over --curriculum of
    the run from rag0 (the end of the copying stage) on."""
    return min(6, 1 + int(5 * (at - rag0) / max(1, a.curriculum * a.steps)))


def copy_share(a, step):
    """The share of copying sequences in a batch: a third early in the run (--copy-warmup), then
    one in ten."""
    return 0.33 if step < a.copy_warmup * a.steps else 0.1


def schedule_at(a, step, rag0):
    """What --steps decides at a step of a run that counts steps (no --seconds): the learning
    rate's share, the documents of a prompt, and the share of copying sequences."""
    return lr_shape(a, step), docs_at_step(a, step, rag0), copy_share(a, step)


def steps_change_ok(was, args, state):
    """Whether a run stopped after state["step"] may go on under another --steps: every step it
    ran would have run the same under the new count (a --schedule wsd run still before its decay,
    its curriculum and copying warm-up behind it or unchanged), so the result is bit-identical to
    a run started with the new --steps. Lengthens a long run while it is still in its stable
    phase."""
    old = argparse.Namespace(**dict(vars(args), steps=was["steps"]))
    done = state["step"]
    rag0 = state["rag0"] or 0
    return (args.schedule == "wsd" and done < args.steps
            and all(schedule_at(old, t, rag0) == schedule_at(args, t, rag0)
                    for t in range(1, done + 1)))


def load_resume(out, args):
    """resume.pt of out, checked against the options of this run; --steps may differ where
    steps_change_ok allows it (the log then records the change)."""
    path = os.path.join(out, "resume.pt")
    if not os.path.exists(path):
        sys.exit("train.py: --resume: no %s (a finished run removes it)" % path)
    r = torch.load(path)
    was = dict(r["log"]["args"], resume=args.resume, stop_at=args.stop_at)
    diff = sorted(k for k, v in vars(args).items()
                  if was.get(k, parser().get_default(k)) != v)
    if diff == ["steps"]:
        if not steps_change_ok(was, args, r["state"]):
            sys.exit("train.py: --resume with --steps %d (was %d) would change steps the run has "
                     "already made (its learning rate, curriculum or copying share); another "
                     "--steps goes only with --schedule wsd before the decay"
                     % (args.steps, was["steps"]))
        r["log"].setdefault("steps_changed", []).append(
            {"after_step": r["state"]["step"], "from": was["steps"], "to": args.steps})
        r["log"]["args"]["steps"] = args.steps
        diff = []
    if diff:
        sys.exit("train.py: --resume needs the options of the run it continues; these differ: "
                 + ", ".join("--%s %s (was %s)" % (k.replace("_", "-"), getattr(args, k), was.get(k))
                             for k in diff))
    return r


def cpu_flags(path="/proc/cpuinfo"):
    """The first processor's feature flags in /proc/cpuinfo (empty where there is none)."""
    try:
        with open(path) as f:
            for line in f:
                if line.startswith("flags"):
                    return set(line.split(":", 1)[1].split())
    except OSError:
        pass
    return set()


def slow_bf16(flags):
    """Why --bf16 would crawl on a CPU with these flags, or None. oneDNN (under Debian's torch)
    has bfloat16 matrix kernels for AMX, AVX512-BF16 and, by conversion, AVX-512, and none
    for AVX2 alone, where a training step of hidden 256 on six-document prompts took 160 s in
    bfloat16 against 14 s in float32 (a 2-core Zen 3)."""
    if flags & {"amx_bf16", "avx512_bf16", "avx512bw"}:
        return None
    return ("this CPU has no AVX-512 (nor AMX or AVX512-BF16), where bfloat16 matrix products "
            "run about 10x slower than float32; train without --bf16")


def main(argv=None):
    args = parser().parse_args(argv)
    if args.card:
        with open(os.path.join(args.out, "train_log.json")) as f:
            log = json.load(f)
        write_card(args.out, log, Llama(dict(CONFIG, **log.get("config", {}))))
        return
    if args.resume and args.seconds:
        sys.exit("train.py: --resume follows steps; a run under --seconds cannot be resumed")
    dev = torch.device(args.device)
    why = slow_bf16(cpu_flags()) if args.bf16 and dev.type == "cpu" else None
    if why:
        sys.exit("train.py: --bf16: " + why)
    torch.set_num_threads(args.threads)
    torch.manual_seed(args.seed)
    rng = random.Random(args.seed)
    t0 = time.time()
    resumed = load_resume(args.out, args) if args.resume else None
    if resumed:
        tok = bpe.Tokenizer(resumed["merges"])
    elif args.init:
        tok = bpe.load(os.path.join(args.init, "tokenizer.json"))
    else:
        corpus_rng = random.Random("corpus-%d" % args.seed)
        texts = []
        for _ in range(4000):
            ex = world.example(corpus_rng, "train")
            texts += world.segments(ex) + [ex["answer"]]
        tok = bpe.Tokenizer(bpe.train(texts, CONFIG["vocab_size"]))
    print("tokenizer: %d tokens (%.0f s)" % (len(tok), time.time() - t0), flush=True)
    if resumed:
        model = Llama(dict(CONFIG, **resumed["log"]["config"]))
        model.load_state_dict(resumed["model"])
    elif args.init:
        model = load_model(args.init)
        if args.grow_layers:
            model.grow(args.grow_layers)
        wide = dict(model.c, hidden_size=args.hidden, num_attention_heads=args.heads,
                    num_key_value_heads=args.kv_heads, intermediate_size=args.mlp)
        if any(args_set(args, k) for k in ("hidden", "heads", "kv_heads", "mlp")):
            model = model.widen(wide)
    else:
        model = Llama(dict(CONFIG, embed_std=args.embed_std, hidden_size=args.hidden,
                           num_hidden_layers=args.layers, num_attention_heads=args.heads,
                           num_key_value_heads=args.kv_heads, intermediate_size=args.mlp,
                           rope_theta=args.rope_theta))
    model.to(dev)
    opt = new_optimizer(model, args.lr)
    probe = world.eval_set(args.seed, 25)
    log = {"args": vars(args), "config": {k: model.c[k] for k in CONFIG}, "loss": [], "probe": [],
           "parents": parents(args.init)}
    run = 0.0
    step = 0
    # batches drawn from each generator below: a generator holds rows it has drawn until it
    # has yielded the `group` batches they make, and the run is saved for --resume only
    # where the generators still in use hold none
    drawn = {"copy": 0, "feed": 0}
    # the curriculum: prompts of 1 document at first, 6 from --curriculum of the run on
    # (counted from the end of the copying stage)
    rag0 = 0
    # how far the run is, in steps: the step, or under --seconds the share of the time spent
    # in steps where that is further along
    at = lambda: (max(step, (time.time() - t0) / args.seconds * args.steps)  # noqa: E731
                  if args.seconds else step)
    docs_at = lambda: docs_at_step(args, at(), rag0)  # noqa: E731
    # copying sequences: a third of the batches early in the run, then one in ten
    # first a stage of copying sequences alone (twice the rows: they are short), until the
    # loss of the repeat averages under 1 nat or --copy-steps pass
    copying = not args.init and args.copy_steps > 0
    copy_at = lambda: copy_share(args, step)  # noqa: E731
    copy_feed = batches(tok, rng, 2 * args.batch, 0, args.context_weight, docs_at, lambda: 1.0)
    # then a stage of recall sequences alone (--recall-steps), their gap growing from 0: a
    # key right before its value is learnt first, and a varying distance only from there
    recall0 = None
    recalling = args.recall_steps > 0
    gap_at = lambda: (args.recall_gap if recall0 is None or not recalling else  # noqa: E731
                      min(args.recall_gap,
                          (step - recall0) * (args.recall_gap + 1) // args.recall_steps))
    recall_feed = batches(tok, rng, 2 * args.batch, 0, args.context_weight, docs_at,
                          lambda: 0.0, group=1, recall=1.0, gap_at=gap_at,
                          recall_names=args.recall_names)
    feed = batches(tok, rng, args.batch, args.block_mask, args.context_weight, docs_at, copy_at,
                   hard=args.hard, bind=args.bind, recall=args.recall, gap_at=gap_at,
                   recall_names=args.recall_names)
    first = 1
    if resumed:
        opt.load_state_dict(resumed["opt"])
        rng.setstate(resumed["rng"])
        torch.set_rng_state(resumed["torch_rng"])
        log = resumed["log"]
        log.setdefault("resumed_after", []).append(resumed["state"]["step"])
        step, run, rag0, copying, recall0, recalling, drawn = (resumed["state"][k]
                                                               for k in RESUMABLE)
        first = step + 1
        t0 -= resumed["seconds"]
        print("resumed after step %d" % step, flush=True)
    # SIGTERM or SIGINT stops the run at the next point it can be saved for --resume
    stop = []
    for sig in (signal.SIGTERM, signal.SIGINT):
        signal.signal(sig, lambda *_: stop.append(1))
    save_due = False
    blas_now = None
    for step in range(first, args.steps + 1):
        if args.stop_at and step > args.stop_at:
            stop.append(1)
        if (save_due or stop) and drawn["feed"] % 8 == 0 and (not copying or
                                                              drawn["copy"] % 8 == 0):
            state = dict(zip(RESUMABLE, (step - 1, run, rag0, copying, recall0, recalling,
                                         drawn)))
            save_resume(args.out, model, opt, rng, tok, log, state, time.time() - t0)
            save_due = False
            if stop:
                print("stopped after step %d: --resume goes on from here" % (step - 1),
                      flush=True)
                return
        at_step = at()
        if at_step > args.steps:
            break
        lr = args.lr * min(1.0, step / args.warmup) * lr_shape(args, at_step)
        for g in opt.param_groups:
            g["lr"] = lr
        if copying and (step > args.copy_steps or (step > 50 and run < 1.0)):
            copying = False
            rag0 = at_step - 1
            log["copy_stage_steps"] = step - 1
            print("copy stage done after %d steps" % (step - 1), flush=True)
        if recalling and not copying:
            if recall0 is None:
                recall0 = step - 1
            elif step > recall0 + args.recall_steps:
                recalling = False
                rag0 = at_step - 1
                log["recall_stage"] = {"steps": args.recall_steps,
                                       "gap 0": evaluate_recall(model, tok, 0),
                                       "gap %d" % args.recall_gap:
                                       evaluate_recall(model, tok, args.recall_gap)}
                if args.recall_names:
                    log["recall_stage"]["names, gap %d" % args.recall_gap] = \
                        evaluate_recall(model, tok, args.recall_gap, names=True)
                print("recall stage done:", json.dumps(log["recall_stage"]), flush=True)
        which = "copy" if copying else "recall" if recalling else "feed"
        # OpenBLAS threads pay on the long RAG prompts' products and lose on the short
        # sequences of the first stages (torch's own threads share the same cores)
        want = 1 if copying or recalling else args.blas_threads
        if dev.type == "cpu" and want != blas_now:
            blas_threads(want)
            blas_now = want
        drawn[which] = drawn.get(which, 0) + 1
        ids, m, w = (t.to(dev) for t in next(copy_feed if copying else recall_feed if recalling
                                             else feed))
        # the copying and recall stages stay in float32: a copying stage in bfloat16 (hidden
        # 256) did not leave its plateau in 1,680 steps, where float32 runs leave it after
        # about 1,050 (train/README.md); they are short sequences, cheap either way
        fp32 = copying or recalling
        with torch.autocast(dev.type, dtype=torch.bfloat16, enabled=args.bf16 and not fp32):
            logits = model(ids[:, :-1], m[:, :-1, :-1])
        loss, ans = batch_losses(logits, ids, w)
        take_step(model, opt, loss)
        run = 0.98 * run + 0.02 * float(ans) if step > 1 else float(ans)
        if step % 20 == 0 or step == args.steps:
            log["loss"].append([step, round(float(loss), 4), round(float(ans), 4)])
            print("step %d loss %.4f answer %.4f (avg %.4f) lr %.2e %.0f s" %
                  (step, float(loss), float(ans), run, lr, time.time() - t0), flush=True)
        if step % args.eval_every == 0 or step == args.steps:
            acc = evaluate(model, tok, probe)
            log["probe"].append([step, acc])
            print("step %d held-out %s" % (step, acc), flush=True)
            write_checkpoint(args.out, model, tok, log, args)
            save_due = step < args.steps
    round_bf16_(model)
    exs = world.eval_set(args.seed, args.eval_n)
    log["heldout"] = {"full": evaluate(model, tok, exs)}
    log["heldout"]["strict_mask"] = evaluate(model, tok, exs, "strict")
    log["heldout"]["sys_mask"] = evaluate(model, tok, exs, "sys")
    log["seconds"] = round(time.time() - t0)
    print("held-out:", json.dumps(log["heldout"]), flush=True)
    write_checkpoint(args.out, model, tok, log, args)
    if os.path.exists(os.path.join(args.out, "resume.pt")):
        os.remove(os.path.join(args.out, "resume.pt"))


if __name__ == "__main__":
    main()

#!/usr/bin/python3
"""Independent reference forward pass of Hugging Face causal LMs, in torch, for parity tests.

Reads an HF checkpoint directory (config.json + model.safetensors, or shards named by
model.safetensors.index.json; F32/F16/BF16) and computes next-token log-probabilities with the
semantics of transformers' LlamaForCausalLM (and MistralForCausalLM without a sliding window),
Qwen2ForCausalLM and Qwen3ForCausalLM, in float32
(as transformers computes with an f32 model) or float64. Written from the published formulas:

  h0 = E[ids]
  per layer:  x = rmsnorm(h) * w_in
              q, k, v = x Wq^T (+bq), x Wk^T (+bk), x Wv^T (+bv)     (biases: Qwen2)
              q, k = rmsnorm_per_head(q) * w_qn, rmsnorm_per_head(k) * w_kn  (Qwen3)
              q, k = rope(q), rope(k)        rotate_half pairing (i, i + d/2)
              a = softmax(q k^T / sqrt(d) + causal) v     (KV head j serves query heads
                                                          j*g .. j*g+g-1, g = heads / kv heads)
              h = h + a Wo^T
              x = rmsnorm(h) * w_post
              h = h + (silu(x Wg^T) * (x Wu^T)) Wd^T
  logits = (rmsnorm(h) * w_norm) W_head^T   (W_head = E when tie_word_embeddings)

rmsnorm(x) = x / sqrt(mean(x^2) + eps). RoPE: inv_freq_i = theta^(-2i/d) changed by
rope_scaling: linear (/factor), llama3 (factor, low/high_freq_factor, original context; the
band between is interpolated), yarn (factor, beta_fast 32, beta_slow 1, original context,
attention factor 0.1 ln(factor) + 1 or mscale/mscale_all_dim or attention_factor, multiplied
into cos and sin). dynamic (sequence-length dependent) and other types are refused.

Usage:
  hf_forward.py MODEL_DIR --ids '[1, 2, 3]'   (or --ids-file F, '-' for stdin)
      [--all | --positions 0,5,9] [--top K] [--format json|f32] [--dtype float32|float64] [--pos0 N] [--out F]

Output (JSON): {"n_tokens", "vocab_size", "dtype", "positions": [...], and per position either
"logprobs" (full vectors) or "top" ([[id, logprob], ...] best first with --top K)}.
--format f32 writes the raw little-endian float32 log-probabilities [positions][vocab] instead.
Positions are the last token's only unless --all.
"""

import argparse
import json
import math
import mmap
import os
import struct
import sys

try:
    import numpy as np
    import torch
except ImportError as e:  # the test wrapper turns this into a skip
    sys.stderr.write("hf_forward.py needs torch and numpy (Debian python3-torch): %s\n" % e)
    sys.exit(77)

# MistralForCausalLM without a sliding window computes exactly what LlamaForCausalLM does.
ARCHS = ("LlamaForCausalLM", "MistralForCausalLM", "Qwen2ForCausalLM", "Qwen3ForCausalLM")
ST_DTYPES = {"F32": (torch.float32, 4), "F16": (torch.float16, 2), "BF16": (torch.bfloat16, 2),
             "F64": (torch.float64, 8)}


class ModelError(Exception):
    pass


# ---- safetensors ----

def read_safetensors(path, want):
    """Tensors of one safetensors file as torch tensors of dtype want, by name.
    Format: u64 little-endian header length, JSON header {name: {dtype, shape, data_offsets}},
    then the data section the offsets are relative to."""
    out = {}
    with open(path, "rb") as f:
        size = os.fstat(f.fileno()).st_size
        if size < 8:
            raise ModelError("%s: shorter than the 8-byte header length" % path)
        (hlen,) = struct.unpack("<Q", f.read(8))
        if hlen > size - 8 or hlen > 100 * 1024 * 1024:
            raise ModelError("%s: header length %d exceeds the file" % (path, hlen))
        header = json.loads(f.read(hlen).decode("utf-8"))
        base = 8 + hlen
        mm = mmap.mmap(f.fileno(), 0, access=mmap.ACCESS_COPY)
    for name, info in header.items():
        if name == "__metadata__":
            continue
        dt = info.get("dtype")
        if dt not in ST_DTYPES:
            raise ModelError("%s: tensor %s has dtype %s (F32, F16, BF16 only)" % (path, name, dt))
        tdt, esz = ST_DTYPES[dt]
        shape = [int(d) for d in info["shape"]]
        a, b = (int(x) for x in info["data_offsets"])
        numel = 1
        for d in shape:
            numel *= d
        if a < 0 or b < a or base + b > size or b - a != numel * esz:
            raise ModelError("%s: tensor %s has bad data_offsets %s" % (path, name, (a, b)))
        if numel == 0:
            t = torch.zeros(shape, dtype=tdt)
        else:
            t = torch.frombuffer(mm, dtype=tdt, count=numel, offset=base + a).reshape(shape)
        out[name] = t.to(want)
    return out


def load_weights(model_dir, want):
    single = os.path.join(model_dir, "model.safetensors")
    index = os.path.join(model_dir, "model.safetensors.index.json")
    if os.path.exists(single):
        return read_safetensors(single, want)
    if not os.path.exists(index):
        raise ModelError("%s: neither model.safetensors nor model.safetensors.index.json" % model_dir)
    with open(index) as f:
        wmap = json.load(f)["weight_map"]
    out = {}
    for shard in sorted(set(wmap.values())):
        part = read_safetensors(os.path.join(model_dir, shard), want)
        for name, t in part.items():
            if wmap.get(name) != shard:
                raise ModelError("%s: tensor %s is not mapped to this shard" % (shard, name))
            out[name] = t
    missing = set(wmap) - set(out)
    if missing:
        raise ModelError("index names tensors no shard holds: %s" % sorted(missing)[:5])
    return out


# ---- RoPE ----

def rope_parameters(cfg, head_dim, dt):
    """(inv_freq [head_dim/2], attention_scaling) as transformers computes them."""
    base = float(cfg.get("rope_theta", 10000.0))
    d = head_dim
    inv_freq = 1.0 / (base ** (torch.arange(0, d, 2, dtype=torch.int64).to(dt) / d))
    rs = cfg.get("rope_scaling")
    if not rs:
        return inv_freq, 1.0
    kind = rs.get("rope_type", rs.get("type"))
    if kind in (None, "default"):
        return inv_freq, 1.0
    if kind == "linear":
        return inv_freq / float(rs["factor"]), 1.0
    if kind == "llama3":
        factor = float(rs["factor"])
        lo = float(rs["low_freq_factor"])
        hi = float(rs["high_freq_factor"])
        old_ctx = float(rs["original_max_position_embeddings"])
        lo_wavelen = old_ctx / lo
        hi_wavelen = old_ctx / hi
        wavelen = 2 * math.pi / inv_freq
        out = torch.where(wavelen > lo_wavelen, inv_freq / factor, inv_freq)
        smooth = (old_ctx / wavelen - lo) / (hi - lo)
        smoothed = (1 - smooth) * out / factor + smooth * out
        medium = (wavelen >= hi_wavelen) & (wavelen <= lo_wavelen)
        return torch.where(medium, smoothed, out), 1.0
    if kind == "yarn":
        factor = float(rs["factor"])
        orig = rs.get("original_max_position_embeddings") or cfg["max_position_embeddings"]
        mscale, mscale_all = rs.get("mscale"), rs.get("mscale_all_dim")

        def get_mscale(scale, m=1.0):
            return 1.0 if scale <= 1 else 0.1 * m * math.log(scale) + 1.0

        attn = rs.get("attention_factor")
        if attn is None:
            if mscale and mscale_all:
                attn = get_mscale(factor, mscale) / get_mscale(factor, mscale_all)
            else:
                attn = get_mscale(factor)
        beta_fast = rs.get("beta_fast") or 32
        beta_slow = rs.get("beta_slow") or 1

        def corr_dim(rot):  # the dimension whose wavelength fits `rot` turns into orig
            return (d * math.log(orig / (rot * 2 * math.pi))) / (2 * math.log(base))

        low, high = corr_dim(beta_fast), corr_dim(beta_slow)
        if rs.get("truncate", True):
            low, high = math.floor(low), math.ceil(high)
        low, high = max(low, 0), min(high, d - 1)
        if low == high:
            high += 0.001
        ramp = torch.clamp((torch.arange(d // 2, dtype=dt) - low) / (high - low), 0, 1)
        pos_freqs = base ** (torch.arange(0, d, 2).to(dt) / d)
        extrap = 1.0 / pos_freqs
        interp = 1.0 / (factor * pos_freqs)
        keep = 1 - ramp  # 1: frequency kept (extrapolated), 0: divided by factor
        return interp * (1 - keep) + extrap * keep, float(attn)
    raise ModelError("rope_scaling type %r is not supported (linear, llama3, yarn only)" % kind)


def rotate_half(x):
    h = x.shape[-1] // 2
    return torch.cat((-x[..., h:], x[..., :h]), dim=-1)


# ---- model ----

class Model:
    def __init__(self, model_dir, dtype=torch.float32):
        with open(os.path.join(model_dir, "config.json")) as f:
            cfg = json.load(f)
        arch = (cfg.get("architectures") or [None])[0]
        if arch not in ARCHS:
            raise ModelError("architecture %r is not supported (%s)" % (arch, ", ".join(ARCHS)))
        if cfg.get("use_sliding_window") or (arch == "MistralForCausalLM" and cfg.get("sliding_window")):
            raise ModelError("sliding-window attention is not supported")
        if cfg.get("hidden_act", "silu") != "silu":
            raise ModelError("hidden_act %r is not supported" % cfg.get("hidden_act"))
        self.cfg, self.arch, self.dt = cfg, arch, dtype
        self.D = cfg["hidden_size"]
        self.L = cfg["num_hidden_layers"]
        self.H = cfg["num_attention_heads"]
        self.KV = cfg.get("num_key_value_heads") or self.H
        self.hd = cfg.get("head_dim") or self.D // self.H
        self.eps = float(cfg.get("rms_norm_eps", 1e-6))
        self.V = cfg["vocab_size"]
        if self.H % self.KV:
            raise ModelError("num_key_value_heads must divide num_attention_heads")
        self.inv_freq, self.attn_scaling = rope_parameters(cfg, self.hd, dtype)
        w = load_weights(model_dir, dtype)
        used = set()

        def take(name, shape):
            if name not in w:
                raise ModelError("missing tensor %s" % name)
            t = w[name]
            if list(t.shape) != list(shape):
                raise ModelError("tensor %s has shape %s, expected %s" % (name, list(t.shape), shape))
            used.add(name)
            return t

        qd, kvd = self.H * self.hd, self.KV * self.hd
        self.embed = take("model.embed_tokens.weight", [self.V, self.D])
        bias = arch == "Qwen2ForCausalLM" or bool(cfg.get("attention_bias"))
        self.layers = []
        for i in range(self.L):
            p = "model.layers.%d." % i
            ly = {
                "in": take(p + "input_layernorm.weight", [self.D]),
                "q": take(p + "self_attn.q_proj.weight", [qd, self.D]),
                "k": take(p + "self_attn.k_proj.weight", [kvd, self.D]),
                "v": take(p + "self_attn.v_proj.weight", [kvd, self.D]),
                "o": take(p + "self_attn.o_proj.weight", [self.D, qd]),
                "post": take(p + "post_attention_layernorm.weight", [self.D]),
                "gate": take(p + "mlp.gate_proj.weight", [cfg["intermediate_size"], self.D]),
                "up": take(p + "mlp.up_proj.weight", [cfg["intermediate_size"], self.D]),
                "down": take(p + "mlp.down_proj.weight", [self.D, cfg["intermediate_size"]]),
            }
            if bias:
                ly["bq"] = take(p + "self_attn.q_proj.bias", [qd])
                ly["bk"] = take(p + "self_attn.k_proj.bias", [kvd])
                ly["bv"] = take(p + "self_attn.v_proj.bias", [kvd])
            if arch == "Qwen3ForCausalLM":
                ly["qn"] = take(p + "self_attn.q_norm.weight", [self.hd])
                ly["kn"] = take(p + "self_attn.k_norm.weight", [self.hd])
            self.layers.append(ly)
        self.norm = take("model.norm.weight", [self.D])
        if cfg.get("tie_word_embeddings", False):
            self.head = self.embed
            used.add("lm_head.weight")  # a tied checkpoint may still carry it; HF ignores it
        else:
            self.head = take("lm_head.weight", [self.V, self.D])
        extra = [n for n in w if n not in used and not n.endswith("rotary_emb.inv_freq")]
        if extra:
            raise ModelError("tensors the model does not use: %s" % sorted(extra)[:5])

    def rms(self, x, weight):
        var = x.pow(2).mean(-1, keepdim=True)
        return weight * (x * torch.rsqrt(var + self.eps))

    def forward(self, ids, pos0=0, rows=None):
        """Log-softmax over the vocabulary for every position: [T, V]; with rows (a list of
        positions) only theirs, in that order: [len(rows), V] (the output head is the
        costliest product, so a caller that needs few rows asks for them)."""
        ids = torch.tensor(ids, dtype=torch.int64)
        if ids.numel() == 0:
            raise ModelError("no tokens")
        if int(ids.min()) < 0 or int(ids.max()) >= self.V:
            raise ModelError("token id outside the vocabulary [0, %d)" % self.V)
        T, hd, g = ids.shape[0], self.hd, self.H // self.KV
        pos = torch.arange(pos0, pos0 + T, dtype=torch.int64).to(self.dt)
        freqs = pos[:, None] * self.inv_freq[None, :]
        emb = torch.cat((freqs, freqs), dim=-1)
        cos = (emb.cos() * self.attn_scaling)[:, None, :]  # [T, 1, hd]
        sin = (emb.sin() * self.attn_scaling)[:, None, :]
        mask = torch.full((T, T), float("-inf"), dtype=self.dt).triu(1)
        h = self.embed[ids]
        for ly in self.layers:
            x = self.rms(h, ly["in"])
            q = x @ ly["q"].T
            k = x @ ly["k"].T
            v = x @ ly["v"].T
            if "bq" in ly:
                q, k, v = q + ly["bq"], k + ly["bk"], v + ly["bv"]
            q = q.view(T, self.H, hd)
            k = k.view(T, self.KV, hd)
            v = v.view(T, self.KV, hd)
            if "qn" in ly:
                q = self.rms(q, ly["qn"])
                k = self.rms(k, ly["kn"])
            q = q * cos + rotate_half(q) * sin
            k = k * cos + rotate_half(k) * sin
            k = k.repeat_interleave(g, dim=1)  # query head i reads KV head i // g
            v = v.repeat_interleave(g, dim=1)
            s = torch.einsum("thd,shd->hts", q, k) * (hd ** -0.5) + mask
            a = torch.softmax(s, dim=-1)
            o = torch.einsum("hts,shd->thd", a, v).reshape(T, self.H * hd)
            h = h + o @ ly["o"].T
            x = self.rms(h, ly["post"])
            h = h + (torch.nn.functional.silu(x @ ly["gate"].T) * (x @ ly["up"].T)) @ ly["down"].T
        if rows is not None:
            h = h[torch.tensor(rows, dtype=torch.int64)]
        logits = self.rms(h, self.norm) @ self.head.T
        return torch.log_softmax(logits, dim=-1)


def main(argv=None):
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("model_dir")
    src = ap.add_mutually_exclusive_group(required=True)
    src.add_argument("--ids", help="token ids as a JSON array")
    src.add_argument("--ids-file", help="file holding the JSON array ('-': stdin)")
    ap.add_argument("--all", action="store_true", help="every position, not only the last")
    ap.add_argument("--positions", help="comma-separated positions (overrides --all)")
    ap.add_argument("--top", type=int, default=0, help="only the K best tokens per position")
    ap.add_argument("--format", choices=("json", "f32"), default="json")
    ap.add_argument("--dtype", choices=("float32", "float64"), default="float32")
    ap.add_argument("--pos0", type=int, default=0, help="RoPE position of the first token")
    ap.add_argument("--threads", type=int, default=0, help="torch threads (0: torch's default)")
    ap.add_argument("--out", default="-")
    a = ap.parse_args(argv)
    if a.threads > 0:
        torch.set_num_threads(a.threads)
    if a.ids is not None:
        ids = json.loads(a.ids)
    elif a.ids_file == "-":
        ids = json.load(sys.stdin)
    else:
        with open(a.ids_file) as f:
            ids = json.load(f)
    if not isinstance(ids, list) or not all(isinstance(i, int) for i in ids):
        sys.stderr.write("hf_forward.py: ids must be a JSON array of integers\n")
        return 2
    if a.positions:
        positions = [int(x) for x in a.positions.split(",")]
        if any(p < 0 or p >= len(ids) for p in positions):
            sys.stderr.write("hf_forward.py: --positions outside [0, %d)\n" % len(ids))
            return 2
    else:
        positions = list(range(len(ids))) if a.all else [len(ids) - 1]
    dt = torch.float64 if a.dtype == "float64" else torch.float32
    try:
        m = Model(a.model_dir, dt)
        with torch.no_grad():
            lp = m.forward(ids, a.pos0, rows=positions)
    except (ModelError, KeyError, ValueError) as e:
        sys.stderr.write("hf_forward.py: %s\n" % e)
        return 1
    out = sys.stdout.buffer if a.out == "-" else open(a.out, "wb")
    if a.format == "f32":
        out.write(lp.to(torch.float32).numpy().astype("<f4").tobytes())
    else:
        res = {"n_tokens": len(ids), "vocab_size": m.V, "dtype": a.dtype, "positions": positions}
        if a.top > 0:
            vals, idx = torch.topk(lp, min(a.top, m.V), dim=-1)
            res["top"] = [[[int(i), float(v)] for i, v in zip(ri, rv)]
                          for ri, rv in zip(idx.tolist(), vals.tolist())]
        else:
            res["logprobs"] = lp.tolist()
        out.write((json.dumps(res) + "\n").encode())
    if out is not sys.stdout.buffer:
        out.close()
    return 0


if __name__ == "__main__":
    sys.exit(main())

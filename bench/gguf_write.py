#!/usr/bin/python3
"""Converts an HF checkpoint (the ones `chunkgate-worker generate-model` writes, or a real
Llama / Qwen2 / Qwen3 one) into an f16, Q8_0 or Q4_0 GGUF file that llama.cpp loads, so that
llama.cpp can serve as the speed and logprob baseline on exactly the same weights.

  gguf_write.py [--type f16|q8_0|q4_0] [--meta KEY=TYPE:VALUE]... [--drop-meta KEY]...
                [--alignment N] MODEL_DIR OUT.gguf

--type q8_0 / q4_0 quantise every 2-D weight (embedding and output included, as
chunkgate-worker --quant q8 / q4 does) with llama.cpp's reference quantisers
(quantize_row_q8_0_ref, quantize_row_q4_0_ref): blocks of 32 with an f16 scale.

--meta sets (adds or replaces) a scalar metadata entry, TYPE one of u32, i32, f32, bool, str
("nan" and "inf" are f32 values); --drop-meta leaves an entry out; --alignment writes
general.alignment N and aligns the data to it. They make the files of other converters, and
malformed ones, for tests.

Needs numpy only. Reads config.json, model.safetensors or its shards
(model.safetensors.index.json), tokenizer.json and tokenizer_config.json.

What it writes (GGUF v3, little-endian, 32-byte alignment):
  - general.architecture "llama" (LlamaForCausalLM, MistralForCausalLM), "qwen2" or "qwen3";
    {arch}.context_length, embedding_length, block_count, feed_forward_length,
    attention.head_count(_kv), attention.key_length/value_length (explicit head_dim),
    attention.layer_norm_rms_epsilon, rope.freq_base, rope.dimension_count, vocab_size;
    rope scaling: linear and yarn as rope.scaling.* keys, llama3 as the per-frequency divisor
    tensor rope_freqs.weight (what llama.cpp reads for Llama 3.1); dynamic is refused.
  - 2-D weights as F16, Q8_0 or Q4_0 (--type; for F16, a bf16 value outside f16's range or precision is reported: the
    chunkgate presets hold none), 1-D weights (norms, biases) and rope_freqs as F32.
  - llama's Q and K rows are permuted from HF's half-split RoPE pairing to the adjacent
    pairing llama.cpp's "llama" architecture rotates (qwen2/qwen3 use the NeoX pairing, as HF).
  - tokenizer: byte-level BPE as tokenizer.ggml.model "gpt2" with tokens, token_type, merges
    and pre "llama-bpe" (Llama 3) or "qwen2"; SentencePiece-style BPE (Llama 2) as "llama"
    with scores derived from the merge ranks. Ids the tokenizer does not define are [PADn].
"""

import argparse
import json
import os
import re
import struct
import sys

import numpy as np

GGUF_MAGIC = 0x46554747  # "GGUF" little-endian
GGUF_VERSION = 3
ALIGN = 32

# metadata value types
T_UINT32, T_INT32, T_FLOAT32, T_BOOL, T_STRING, T_ARRAY = 4, 5, 6, 7, 8, 9
# ggml tensor types
GGML_F32, GGML_F16, GGML_Q4_0, GGML_Q8_0 = 0, 1, 2, 8
# --type: (ggml type of 2-D weights, general.file_type)
TYPES = {"f16": (GGML_F16, 1), "q4_0": (GGML_Q4_0, 2), "q8_0": (GGML_Q8_0, 7)}
# token types
TOK_NORMAL, TOK_UNKNOWN, TOK_CONTROL, TOK_USER_DEFINED, TOK_UNUSED, TOK_BYTE = 1, 2, 3, 4, 5, 6

ARCH = {"LlamaForCausalLM": "llama", "MistralForCausalLM": "llama", "Qwen2ForCausalLM": "qwen2",
        "Qwen3ForCausalLM": "qwen3"}


class ConvertError(Exception):
    pass


# ---- safetensors (numpy) ----

def st_tensors(model_dir):
    """{name: (path, dtype, shape, absolute offset, nbytes)} over the file or the shards."""
    single = os.path.join(model_dir, "model.safetensors")
    if os.path.exists(single):
        files = [single]
    else:
        with open(os.path.join(model_dir, "model.safetensors.index.json")) as f:
            files = [os.path.join(model_dir, s) for s in sorted(set(json.load(f)["weight_map"].values()))]
    out = {}
    for path in files:
        with open(path, "rb") as f:
            (hlen,) = struct.unpack("<Q", f.read(8))
            header = json.loads(f.read(hlen))
        for name, info in header.items():
            if name == "__metadata__":
                continue
            a, b = info["data_offsets"]
            out[name] = (path, info["dtype"], [int(d) for d in info["shape"]], 8 + hlen + a, b - a)
    return out


def st_load_f32(entry):
    path, dtype, shape, off, nbytes = entry
    with open(path, "rb") as f:
        f.seek(off)
        raw = f.read(nbytes)
    if dtype == "F32":
        x = np.frombuffer(raw, dtype="<f4")
    elif dtype == "F16":
        x = np.frombuffer(raw, dtype="<f2").astype(np.float32)
    elif dtype == "BF16":
        x = (np.frombuffer(raw, dtype="<u2").astype(np.uint32) << 16).view(np.float32)
    else:
        raise ConvertError("dtype %s is not supported" % dtype)
    return x.reshape(shape)


def permute_rope(w, n_head):
    """HF q/k rows (per head: first half, second half) -> llama.cpp's adjacent pairs."""
    return (w.reshape(n_head, 2, w.shape[0] // n_head // 2, *w.shape[1:])
            .swapaxes(1, 2).reshape(w.shape))


# ---- GGUF encoding ----

def enc_str(s):
    b = s.encode("utf-8") if isinstance(s, str) else s
    return struct.pack("<Q", len(b)) + b


def enc_value(vtype, v):
    if vtype == T_UINT32:
        return struct.pack("<I", v)
    if vtype == T_INT32:
        return struct.pack("<i", v)
    if vtype == T_FLOAT32:
        return struct.pack("<f", v)
    if vtype == T_BOOL:
        return struct.pack("<?", bool(v))
    if vtype == T_STRING:
        return enc_str(v)
    raise ValueError(vtype)


class Writer:
    def __init__(self):
        self.kv = {}       # key: encoded key/value record, in the order added
        self.tensors = []  # (name, ggml type, shape numpy order, producer)
        self.align = ALIGN

    def add(self, key, vtype, v):
        self.kv[key] = enc_str(key) + struct.pack("<I", vtype) + enc_value(vtype, v)

    def add_array(self, key, etype, values):
        if etype == T_STRING:
            body = b"".join(enc_str(x) for x in values)
        elif etype == T_INT32:
            body = np.asarray(values, dtype="<i4").tobytes()
        elif etype == T_FLOAT32:
            body = np.asarray(values, dtype="<f4").tobytes()
        else:
            raise ValueError(etype)
        self.kv[key] = enc_str(key) + struct.pack("<I", T_ARRAY) + struct.pack("<IQ", etype, len(values)) + body

    def add_tensor(self, name, gtype, shape, producer):
        self.tensors.append((name, gtype, list(shape), producer))

    @staticmethod
    def nbytes(gtype, n):
        return {GGML_F32: 4 * n, GGML_F16: 2 * n, GGML_Q8_0: n // 32 * 34,
                GGML_Q4_0: n // 32 * 18}[gtype]

    def write(self, path):
        align = self.align
        if align != ALIGN:
            self.add("general.alignment", T_UINT32, align)
        infos, offset = [], 0
        for name, gtype, shape, _ in self.tensors:
            n = int(np.prod(shape))
            nbytes = self.nbytes(gtype, n)
            dims = list(reversed(shape))  # ne[0] is the fastest-moving dimension
            infos.append(enc_str(name) + struct.pack("<I", len(dims)) +
                         struct.pack("<%dQ" % len(dims), *dims) + struct.pack("<IQ", gtype, offset))
            offset += (nbytes + align - 1) // align * align
        tmp = path + ".tmp"
        with open(tmp, "wb") as f:
            f.write(struct.pack("<IIQQ", GGUF_MAGIC, GGUF_VERSION, len(self.tensors), len(self.kv)))
            for rec in self.kv.values():
                f.write(rec)
            for rec in infos:
                f.write(rec)
            f.write(b"\0" * (-f.tell() % align))
            for name, gtype, shape, producer in self.tensors:
                data = producer()
                if gtype in (GGML_Q8_0, GGML_Q4_0):
                    if data.dtype != np.uint8 or data.size != self.nbytes(gtype, int(np.prod(shape))):
                        raise ConvertError("tensor %s: produced %s %s" % (name, data.dtype, data.shape))
                    f.write(data.tobytes())
                    f.write(b"\0" * (-f.tell() % align))
                    continue
                want = np.float32 if gtype == GGML_F32 else np.float16
                if list(data.shape) != shape or data.dtype != want:
                    raise ConvertError("tensor %s: produced %s %s" % (name, data.dtype, data.shape))
                f.write(np.ascontiguousarray(data).astype("<" + data.dtype.str[1:]).tobytes())
                f.write(b"\0" * (-f.tell() % align))
        os.replace(tmp, path)


# ---- llama.cpp's reference quantisers (ggml-quants.c) ----

def quant_q8_0(x):
    """quantize_row_q8_0_ref: d = amax / 127, q = roundf(x / d); blocks of f16 d + 32 int8."""
    b = x.reshape(-1, 32).astype(np.float32)
    d = np.abs(b).max(axis=1) / np.float32(127)
    idv = np.where(d != 0, np.float32(1) / np.where(d != 0, d, 1), 0).astype(np.float32)
    v = b * idv[:, None]
    q = (np.sign(v) * np.floor(np.abs(v) + np.float32(0.5))).astype(np.int8)  # roundf
    out = np.empty((b.shape[0], 34), np.uint8)
    out[:, :2] = d.astype("<f2").view(np.uint8).reshape(-1, 2)
    out[:, 2:] = q.view(np.uint8)
    return out.reshape(-1)


def quant_q4_0(x):
    """quantize_row_q4_0_ref: d = m / -8 for the element m of largest |m|, n = min(15,
    (int8)(x / d + 8.5)); blocks of f16 d + 16 bytes (element j low, j + 16 high)."""
    b = x.reshape(-1, 32).astype(np.float32)
    m = b[np.arange(b.shape[0]), np.abs(b).argmax(axis=1)]
    d = m / np.float32(-8)
    idv = np.where(d != 0, np.float32(1) / np.where(d != 0, d, 1), 0).astype(np.float32)
    v = b * idv[:, None] + np.float32(8.5)
    n = np.minimum(15, np.trunc(v).astype(np.int32)).astype(np.uint8)
    out = np.empty((b.shape[0], 18), np.uint8)
    out[:, :2] = d.astype("<f2").view(np.uint8).reshape(-1, 2)
    out[:, 2:] = n[:, :16] | (n[:, 16:] << 4)
    return out.reshape(-1)


# ---- tokenizer ----

def special_text(tc, key):
    v = tc.get(key)
    if isinstance(v, dict):
        return v.get("content")
    return v if isinstance(v, str) else None


def add_bos_default(tok):
    """HF adds BOS when the post-processor's single template starts with a special token."""
    pp = tok.get("post_processor") or {}
    procs = pp.get("processors", []) if pp.get("type") == "Sequence" else [pp]
    for p in procs:
        if p and p.get("type") == "TemplateProcessing":
            single = p.get("single") or []
            return bool(single) and "SpecialToken" in single[0]
    return False


def add_tokenizer(w, model_dir, cfg, arch):
    with open(os.path.join(model_dir, "tokenizer.json"), encoding="utf-8") as f:
        tok = json.load(f)
    tc = {}
    tc_path = os.path.join(model_dir, "tokenizer_config.json")
    if os.path.exists(tc_path):
        with open(tc_path, encoding="utf-8") as f:
            tc = json.load(f)
    model = tok["model"]
    if model.get("type") != "BPE":
        raise ConvertError("tokenizer model %s is not supported (BPE only)" % model.get("type"))
    V = cfg["vocab_size"]
    by_id = {i: t for t, i in model["vocab"].items()}
    added = {a["id"]: a for a in tok.get("added_tokens", [])}
    for i, a in added.items():
        by_id[i] = a["content"]
    if max(by_id) >= V:
        raise ConvertError("tokenizer id %d outside vocab_size %d" % (max(by_id), V))
    merges = [m if isinstance(m, str) else " ".join(m) for m in model.get("merges", [])]
    ids = {t: i for i, t in by_id.items()}
    spm = bool(model.get("byte_fallback")) or (tok.get("pre_tokenizer") is None and "\u2581" in json.dumps(tok.get("normalizer")))

    tokens, types, scores = [], [], []
    if spm:
        rank = {}
        for r, m in enumerate(merges):
            t = m.replace(" ", "")
            rank.setdefault(t, r)
    for i in range(V):
        if i not in by_id:
            tokens.append("[PAD%d]" % i)
            types.append(TOK_UNUSED)
            scores.append(0.0)
            continue
        t = by_id[i]
        tokens.append(t)
        if i in added:
            a = added[i]
            looks = t.startswith("<|") and t.endswith("|>")
            if spm and t == model.get("unk_token"):
                types.append(TOK_UNKNOWN)
            else:
                types.append(TOK_CONTROL if a.get("special") or looks else TOK_USER_DEFINED)
        elif spm and re.fullmatch(r"<0x[0-9A-Fa-f]{2}>", t):
            types.append(TOK_BYTE)
        else:
            types.append(TOK_NORMAL)
        scores.append(-float(rank.get(t, 0)) if spm else 0.0)

    if spm:
        w.add("tokenizer.ggml.model", T_STRING, "llama")
        w.add_array("tokenizer.ggml.tokens", T_STRING, tokens)
        w.add_array("tokenizer.ggml.scores", T_FLOAT32, scores)
        w.add_array("tokenizer.ggml.token_type", T_INT32, types)
        if model.get("unk_token") in ids:
            w.add("tokenizer.ggml.unknown_token_id", T_UINT32, ids[model["unk_token"]])
    else:
        pre = "qwen2" if arch in ("qwen2", "qwen3") else "llama-bpe"
        w.add("tokenizer.ggml.model", T_STRING, "gpt2")
        w.add("tokenizer.ggml.pre", T_STRING, pre)
        w.add_array("tokenizer.ggml.tokens", T_STRING, tokens)
        w.add_array("tokenizer.ggml.token_type", T_INT32, types)
        w.add_array("tokenizer.ggml.merges", T_STRING, merges)

    bos = special_text(tc, "bos_token")
    bos_id = ids.get(bos) if bos else cfg.get("bos_token_id")
    eos = special_text(tc, "eos_token")
    eos_cfg = cfg.get("eos_token_id")
    eos_id = ids.get(eos) if eos else (eos_cfg[0] if isinstance(eos_cfg, list) else eos_cfg)
    pad = special_text(tc, "pad_token")
    if bos_id is not None:
        w.add("tokenizer.ggml.bos_token_id", T_UINT32, int(bos_id))
    if eos_id is not None:
        w.add("tokenizer.ggml.eos_token_id", T_UINT32, int(eos_id))
    if pad in ids:
        w.add("tokenizer.ggml.padding_token_id", T_UINT32, ids[pad])
    add_bos = tc.get("add_bos_token")
    if add_bos is None:
        add_bos = add_bos_default(tok)
    w.add("tokenizer.ggml.add_bos_token", T_BOOL, bool(add_bos))
    w.add("tokenizer.ggml.add_eos_token", T_BOOL, bool(tc.get("add_eos_token", False)))
    if isinstance(tc.get("chat_template"), str):
        w.add("tokenizer.chat_template", T_STRING, tc["chat_template"])


# ---- model ----

def llama3_rope_factors(cfg, head_dim):
    """Per-frequency divisors of the llama3 rule (llama.cpp divides theta_i by them)."""
    rs = cfg["rope_scaling"]
    base = float(cfg.get("rope_theta", 10000.0))
    factor, lo, hi = float(rs["factor"]), float(rs["low_freq_factor"]), float(rs["high_freq_factor"])
    old = float(rs["original_max_position_embeddings"])
    out = []
    for i in range(0, head_dim, 2):
        freq = 1.0 / base ** (i / head_dim)
        wavelen = 2 * np.pi / freq
        if wavelen < old / hi:
            out.append(1.0)
        elif wavelen > old / lo:
            out.append(factor)
        else:
            smooth = (old / wavelen - lo) / (hi - lo)
            out.append(1.0 / ((1 - smooth) / factor + smooth))
    return np.asarray(out, dtype=np.float32)


def convert(model_dir, out_path, wtype="f16", meta=(), drop=(), align=ALIGN):
    with open(os.path.join(model_dir, "config.json")) as f:
        cfg = json.load(f)
    hf_arch = (cfg.get("architectures") or [None])[0]
    if hf_arch not in ARCH:
        raise ConvertError("architecture %r is not supported" % hf_arch)
    arch = ARCH[hf_arch]
    D, L, H = cfg["hidden_size"], cfg["num_hidden_layers"], cfg["num_attention_heads"]
    KV = cfg.get("num_key_value_heads") or H
    hd = cfg.get("head_dim") or D // H
    w = Writer()
    w.add("general.architecture", T_STRING, arch)
    w.add("general.name", T_STRING, cfg.get("_name_or_path") or os.path.basename(model_dir.rstrip("/")))
    gtype2d, file_type = TYPES[wtype]
    w.add("general.file_type", T_UINT32, file_type)
    w.add(arch + ".context_length", T_UINT32, cfg["max_position_embeddings"])
    w.add(arch + ".embedding_length", T_UINT32, D)
    w.add(arch + ".block_count", T_UINT32, L)
    w.add(arch + ".feed_forward_length", T_UINT32, cfg["intermediate_size"])
    w.add(arch + ".attention.head_count", T_UINT32, H)
    w.add(arch + ".attention.head_count_kv", T_UINT32, KV)
    if cfg.get("head_dim"):
        w.add(arch + ".attention.key_length", T_UINT32, hd)
        w.add(arch + ".attention.value_length", T_UINT32, hd)
    w.add(arch + ".attention.layer_norm_rms_epsilon", T_FLOAT32, float(cfg.get("rms_norm_eps", 1e-6)))
    w.add(arch + ".rope.freq_base", T_FLOAT32, float(cfg.get("rope_theta", 10000.0)))
    w.add(arch + ".rope.dimension_count", T_UINT32, hd)
    w.add(arch + ".vocab_size", T_UINT32, cfg["vocab_size"])
    rs = cfg.get("rope_scaling") or {}
    kind = rs.get("rope_type", rs.get("type")) if rs else None
    if kind == "linear":
        w.add(arch + ".rope.scaling.type", T_STRING, "linear")
        w.add(arch + ".rope.scaling.factor", T_FLOAT32, float(rs["factor"]))
    elif kind == "yarn":
        if rs.get("attention_factor") is not None or rs.get("mscale") or rs.get("beta_fast") or rs.get("beta_slow"):
            raise ConvertError("yarn with non-default attention_factor/mscale/beta is not converted")
        w.add(arch + ".rope.scaling.type", T_STRING, "yarn")
        w.add(arch + ".rope.scaling.factor", T_FLOAT32, float(rs["factor"]))
        w.add(arch + ".rope.scaling.original_context_length", T_UINT32,
              int(rs.get("original_max_position_embeddings") or cfg["max_position_embeddings"]))
    elif kind not in (None, "default", "llama3"):
        raise ConvertError("rope_scaling %r is not supported" % kind)
    add_tokenizer(w, model_dir, cfg, arch)

    st = st_tensors(model_dir)
    used = set()
    inexact = [0]

    def f16(name, permute_heads=0):
        used.add(name)

        def produce():
            x = st_load_f32(st[name])
            if permute_heads:
                x = permute_rope(x, permute_heads)
            if gtype2d == GGML_Q8_0:
                return quant_q8_0(x)
            if gtype2d == GGML_Q4_0:
                return quant_q4_0(x)
            y = x.astype(np.float16)
            inexact[0] += int(np.count_nonzero(y.astype(np.float32) != x))
            return y
        return produce

    def f32(name):
        used.add(name)
        return lambda: st_load_f32(st[name]).astype(np.float32)

    def add(gg_name, hf_name, two_d=True, permute_heads=0):
        if hf_name not in st:
            raise ConvertError("missing tensor %s" % hf_name)
        shape = st[hf_name][2]
        if two_d:
            if gtype2d != GGML_F16 and shape[-1] % 32:
                raise ConvertError("tensor %s: %d columns are not a multiple of 32" % (hf_name, shape[-1]))
            w.add_tensor(gg_name, gtype2d, shape, f16(hf_name, permute_heads))
        else:
            w.add_tensor(gg_name, GGML_F32, shape, f32(hf_name))

    perm = arch == "llama"
    add("token_embd.weight", "model.embed_tokens.weight")
    for i in range(L):
        p, b = "model.layers.%d." % i, "blk.%d." % i
        add(b + "attn_norm.weight", p + "input_layernorm.weight", False)
        add(b + "attn_q.weight", p + "self_attn.q_proj.weight", permute_heads=H if perm else 0)
        add(b + "attn_k.weight", p + "self_attn.k_proj.weight", permute_heads=KV if perm else 0)
        add(b + "attn_v.weight", p + "self_attn.v_proj.weight")
        add(b + "attn_output.weight", p + "self_attn.o_proj.weight")
        for proj in ("q", "k", "v"):
            if p + "self_attn.%s_proj.bias" % proj in st:
                if perm and proj != "v":
                    raise ConvertError("llama q/k biases are not converted")
                add(b + "attn_%s.bias" % proj, p + "self_attn.%s_proj.bias" % proj, False)
        if arch == "qwen3":
            add(b + "attn_q_norm.weight", p + "self_attn.q_norm.weight", False)
            add(b + "attn_k_norm.weight", p + "self_attn.k_norm.weight", False)
        add(b + "ffn_norm.weight", p + "post_attention_layernorm.weight", False)
        add(b + "ffn_gate.weight", p + "mlp.gate_proj.weight")
        add(b + "ffn_up.weight", p + "mlp.up_proj.weight")
        add(b + "ffn_down.weight", p + "mlp.down_proj.weight")
    add("output_norm.weight", "model.norm.weight", False)
    if not cfg.get("tie_word_embeddings", False):
        add("output.weight", "lm_head.weight")
    elif "lm_head.weight" in st:
        used.add("lm_head.weight")
    if kind == "llama3":
        factors = llama3_rope_factors(cfg, hd)
        w.add_tensor("rope_freqs.weight", GGML_F32, [hd // 2], lambda: factors)
    extra = sorted(n for n in st if n not in used and not n.endswith("rotary_emb.inv_freq"))
    if extra:
        raise ConvertError("tensors not converted: %s" % extra[:5])
    for key, vtype, v in meta:
        w.add(key, vtype, v)
    for key in drop:
        w.kv.pop(key, None)
    w.align = align
    w.write(out_path)
    return inexact[0]


META_TYPES = {"u32": (T_UINT32, int), "i32": (T_INT32, int), "f32": (T_FLOAT32, float),
              "bool": (T_BOOL, lambda v: {"true": True, "false": False}[v]), "str": (T_STRING, str)}


def meta_entry(text):
    """KEY=TYPE:VALUE as (key, value type, value)."""
    try:
        key, rest = text.split("=", 1)
        tname, v = rest.split(":", 1)
        vtype, parse = META_TYPES[tname]
        return key, vtype, parse(v)
    except (ValueError, KeyError):
        raise argparse.ArgumentTypeError("%r is not KEY=TYPE:VALUE with TYPE one of %s"
                                         % (text, ", ".join(META_TYPES)))


def alignment(text):
    n = int(text)
    if n < 1 or n & (n - 1):
        raise argparse.ArgumentTypeError("%s is not a power of two" % text)
    return n


def main(argv):
    ap = argparse.ArgumentParser(prog="gguf_write.py", description="HF checkpoint to GGUF")
    ap.add_argument("--type", choices=sorted(TYPES), default="f16")
    ap.add_argument("--meta", type=meta_entry, action="append", default=[],
                    metavar="KEY=TYPE:VALUE", help="set a scalar metadata entry")
    ap.add_argument("--drop-meta", action="append", default=[], metavar="KEY",
                    help="leave a metadata entry out")
    ap.add_argument("--alignment", type=alignment, default=ALIGN, metavar="N")
    ap.add_argument("model_dir")
    ap.add_argument("out")
    a = ap.parse_args(argv[1:])
    try:
        n = convert(a.model_dir, a.out, a.type, a.meta, a.drop_meta, a.alignment)
    except (ConvertError, KeyError, OSError) as e:
        sys.stderr.write("gguf_write.py: %s\n" % e)
        return 1
    size = os.path.getsize(a.out)
    msg = "wrote %s (%.1f MiB)" % (a.out, size / 2**20)
    if n:
        msg += "; %d weights were not exact in f16 (rounded)" % n
    print(msg)
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv))

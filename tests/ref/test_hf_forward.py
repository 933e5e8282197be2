#!/usr/bin/python3
"""Self-test of tests/ref/hf_forward.py (run by ctest as ref_hf_forward; exit 77 = skipped when
/usr/bin/python3 lacks torch or numpy).

Invariants any correct implementation satisfies, checked in float64 on small random
checkpoints written here: causality, RoPE depends only on relative positions (for every
scaling type), grouped-query attention equals multi-head attention with duplicated KV heads,
tied equals untied with a copied head, sharded equals single-file, bf16 equals f32 for
bf16-exact values, a closed form when attention and MLP are zero, Qwen3's per-head q/k norm
makes the output invariant to the scale of q_proj, the llama3 and yarn frequency tables
against the published piecewise formulas, and refusals. With CHUNKGATE_WORKER_BIN set, the
generate-model presets are also loaded: their next-token distributions must be neither flat
nor one-hot and identical across storage dtypes.
"""

import json
import math
import os
import random
import shutil
import struct
import subprocess
import sys
import tempfile
import unittest

try:
    import numpy as np
    import torch
except ImportError as e:
    print("SKIP: /usr/bin/python3 lacks torch or numpy (Debian python3-torch): %s" % e)
    sys.exit(77)

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
import hf_forward as H  # noqa: E402

F64 = torch.float64


def bf16_exact(x):
    """Rounds float32 values to bf16 (round to nearest even) and back."""
    u = np.asarray(x, dtype=np.float32).view(np.uint32).astype(np.uint64)
    u = ((u + 0x7FFF + ((u >> 16) & 1)) >> 16) << 16
    return u.astype(np.uint32).view(np.float32)


def write_st(path, tensors, dtype="F32"):
    header, blobs, off = {}, [], 0
    for name, arr in tensors.items():
        a = np.asarray(arr, dtype=np.float32)
        if dtype == "BF16":
            raw = (a.view(np.uint32) >> 16).astype("<u2").tobytes()
        else:
            raw = a.astype("<f4").tobytes()
        header[name] = {"dtype": dtype, "shape": list(a.shape), "data_offsets": [off, off + len(raw)]}
        blobs.append(raw)
        off += len(raw)
    h = json.dumps(header).encode()
    h += b" " * (-len(h) % 8)
    with open(path, "wb") as f:
        f.write(struct.pack("<Q", len(h)) + h)
        for b in blobs:
            f.write(b)


def make_model(d, arch="LlamaForCausalLM", L=2, D=32, Hq=4, KV=2, hd=None, inter=48, V=96,
               tied=False, scaling=None, theta=10000.0, seed=0, zero_blocks=False, dtype="F32",
               shards=0, max_pos=4096, edit=None):
    rng = np.random.default_rng(seed)
    hd = hd or D // Hq

    def w(*shape, std=1.0):
        return bf16_exact(rng.standard_normal(shape).astype(np.float32) * std)

    t = {"model.embed_tokens.weight": w(V, D, std=0.5)}
    for i in range(L):
        p = "model.layers.%d." % i
        z = 0.0 if zero_blocks else 1.0
        t[p + "input_layernorm.weight"] = 1 + w(D, std=0.1)
        t[p + "self_attn.q_proj.weight"] = w(Hq * hd, D, std=2 / math.sqrt(D)) * z
        t[p + "self_attn.k_proj.weight"] = w(KV * hd, D, std=2 / math.sqrt(D)) * z
        t[p + "self_attn.v_proj.weight"] = w(KV * hd, D, std=1 / math.sqrt(D)) * z
        t[p + "self_attn.o_proj.weight"] = w(D, Hq * hd, std=1 / math.sqrt(Hq * hd)) * z
        if arch == "Qwen2ForCausalLM":
            t[p + "self_attn.q_proj.bias"] = w(Hq * hd, std=0.3) * z
            t[p + "self_attn.k_proj.bias"] = w(KV * hd, std=0.3) * z
            t[p + "self_attn.v_proj.bias"] = w(KV * hd, std=0.3) * z
        if arch == "Qwen3ForCausalLM":
            t[p + "self_attn.q_norm.weight"] = 1 + w(hd, std=0.1)
            t[p + "self_attn.k_norm.weight"] = 1 + w(hd, std=0.1)
        t[p + "post_attention_layernorm.weight"] = 1 + w(D, std=0.1)
        t[p + "mlp.gate_proj.weight"] = w(inter, D, std=1 / math.sqrt(D)) * z
        t[p + "mlp.up_proj.weight"] = w(inter, D, std=1 / math.sqrt(D)) * z
        t[p + "mlp.down_proj.weight"] = w(D, inter, std=1 / math.sqrt(inter)) * z
    t["model.norm.weight"] = 1 + w(D, std=0.1)
    if not tied:
        t["lm_head.weight"] = w(V, D, std=3 / math.sqrt(D))
    if edit:
        edit(t)
    t = {n: bf16_exact(v) for n, v in t.items()}
    cfg = {"architectures": [arch], "hidden_size": D, "num_hidden_layers": L,
           "num_attention_heads": Hq, "num_key_value_heads": KV, "intermediate_size": inter,
           "vocab_size": V, "rms_norm_eps": 1e-6, "rope_theta": theta, "tie_word_embeddings": tied,
           "max_position_embeddings": max_pos, "rope_scaling": scaling, "hidden_act": "silu"}
    if hd != D // Hq:
        cfg["head_dim"] = hd
    os.makedirs(d, exist_ok=True)
    with open(os.path.join(d, "config.json"), "w") as f:
        json.dump(cfg, f)
    if shards:
        names = list(t)
        wmap = {}
        for k in range(shards):
            part = names[k::shards]
            fn = "model-%05d-of-%05d.safetensors" % (k + 1, shards)
            write_st(os.path.join(d, fn), {n: t[n] for n in part}, dtype)
            wmap.update({n: fn for n in part})
        with open(os.path.join(d, "model.safetensors.index.json"), "w") as f:
            json.dump({"metadata": {}, "weight_map": wmap}, f)
    else:
        write_st(os.path.join(d, "model.safetensors"), t, dtype)
    return t, cfg


def run(d, ids, pos0=0, dtype=F64):
    with torch.no_grad():
        return H.Model(d, dtype).forward(ids, pos0)


class Base(unittest.TestCase):
    def setUp(self):
        self.tmp = tempfile.mkdtemp(prefix="cg_hf_forward_")

    def tearDown(self):
        shutil.rmtree(self.tmp, ignore_errors=True)

    def path(self, name):
        return os.path.join(self.tmp, name)

    def close(self, a, b, tol):
        diff = float((a - b).abs().max())
        self.assertLess(diff, tol, "max |diff| %g" % diff)
        return diff


IDS = [5, 17, 3, 88, 42, 42, 7, 60, 1, 95, 33, 12, 70, 4, 18, 26, 59, 81, 9, 2]
SCALINGS = [None, {"rope_type": "linear", "factor": 4.0},
            {"rope_type": "llama3", "factor": 8.0, "low_freq_factor": 1.0, "high_freq_factor": 4.0,
             "original_max_position_embeddings": 64},
            {"rope_type": "yarn", "factor": 4.0, "original_max_position_embeddings": 64},
            {"type": "yarn", "factor": 2.0, "beta_fast": 16.0, "beta_slow": 2.0}]


class Invariants(Base):
    def test_causal(self):
        for arch in ("LlamaForCausalLM", "Qwen2ForCausalLM", "Qwen3ForCausalLM"):
            d = self.path(arch)
            make_model(d, arch)
            full = run(d, IDS)
            for k in (1, 7, 19):
                self.close(full[:k], run(d, IDS[:k]), 1e-12)
            changed = IDS[:10] + [(i + 1) % 96 for i in IDS[10:]]
            other = run(d, changed)
            self.close(full[:10], other[:10], 1e-12)
            self.assertGreater(float((full[10:] - other[10:]).abs().max()), 1e-3)
            self.close(full.exp().sum(-1), torch.ones(len(IDS), dtype=F64), 1e-12)

    def test_rows(self):
        """rows= picks positions of the same forward (the head is applied to those only)."""
        d = self.path("rows")
        make_model(d, "Qwen2ForCausalLM")
        full = run(d, IDS)
        with torch.no_grad():
            part = H.Model(d, F64).forward(IDS, rows=[19, 0, 7])
        self.close(part, full[[19, 0, 7]], 1e-12)

    def test_rope_relative(self):
        """Shifting every position by the same amount changes nothing: RoPE (also scaled)
        rotates q and k by angles whose difference depends only on the distance."""
        for i, sc in enumerate(SCALINGS):
            for arch in ("LlamaForCausalLM", "Qwen3ForCausalLM"):
                d = self.path("%s-%d" % (arch, i))
                make_model(d, arch, scaling=sc, hd=16 if arch == "Qwen3ForCausalLM" else None)
                a = run(d, IDS)
                b = run(d, IDS, pos0=1000)
                self.close(a, b, 1e-9)

    def test_rope_matters(self):
        """... but the distance does: the same tokens in another order give other numbers, and
        a model that ignored position would not."""
        d = self.path("m")
        make_model(d)
        a = run(d, [1, 2, 3, 4])
        b = run(d, [2, 1, 3, 4])
        self.assertGreater(float((a[-1] - b[-1]).abs().max()), 1e-4)

    def test_rotate_half_pairing(self):
        """HF pairs dimension i with i + d/2: a unit vector in dimension i turns towards i + d/2."""
        d = 8
        x = torch.zeros(d, dtype=F64)
        x[1] = 1.0
        inv = 1.0 / (10000.0 ** (torch.arange(0, d, 2, dtype=F64) / d))
        p = 5.0
        emb = torch.cat((p * inv, p * inv))
        y = x * emb.cos() + H.rotate_half(x) * emb.sin()
        want = torch.zeros(d, dtype=F64)
        want[1] = math.cos(p * float(inv[1]))
        want[5] = math.sin(p * float(inv[1]))
        self.close(y, want, 1e-15)

    def test_gqa_equals_duplicated_mha(self):
        """KV head j serves query heads j*g .. j*g+g-1."""
        t, cfg = make_model(self.path("gqa"), KV=2)
        g = 2
        hd = cfg["hidden_size"] // cfg["num_attention_heads"]

        def dup(tt):
            tt.clear()
            tt.update(t)
            for i in range(cfg["num_hidden_layers"]):
                for k in ("k", "v"):
                    n = "model.layers.%d.self_attn.%s_proj.weight" % (i, k)
                    w = t[n].reshape(2, hd, -1)
                    tt[n] = np.repeat(w, g, axis=0).reshape(4 * hd, -1)

        make_model(self.path("mha"), KV=4, edit=dup)
        self.close(run(self.path("gqa"), IDS), run(self.path("mha"), IDS), 1e-12)

    def test_tied_equals_copied_head(self):
        t, _ = make_model(self.path("tied"), tied=True)

        def copy_head(tt):
            tt["lm_head.weight"] = t["model.embed_tokens.weight"].copy()

        make_model(self.path("untied"), tied=False, edit=copy_head)
        self.close(run(self.path("tied"), IDS), run(self.path("untied"), IDS), 1e-12)

    def test_sharded_and_bf16(self):
        make_model(self.path("one"), "Qwen2ForCausalLM")
        make_model(self.path("three"), "Qwen2ForCausalLM", shards=3)
        make_model(self.path("bf16"), "Qwen2ForCausalLM", dtype="BF16")
        a = run(self.path("one"), IDS)
        self.assertTrue(torch.equal(a, run(self.path("three"), IDS)))
        self.assertTrue(torch.equal(a, run(self.path("bf16"), IDS)))

    def test_closed_form_without_blocks(self):
        """Zero attention and MLP: logits = (rmsnorm(E[t]) * w) W_head^T."""
        t, cfg = make_model(self.path("z"), zero_blocks=True)
        e = t["model.embed_tokens.weight"].astype(np.float64)[IDS]
        x = e / np.sqrt((e * e).mean(-1, keepdims=True) + cfg["rms_norm_eps"])
        logits = (x * t["model.norm.weight"]) @ t["lm_head.weight"].astype(np.float64).T
        lp = logits - np.log(np.exp(logits - logits.max(-1, keepdims=True)).sum(-1, keepdims=True)) \
            - logits.max(-1, keepdims=True)
        self.close(run(self.path("z"), IDS), torch.from_numpy(lp), 1e-10)

    def test_qwen3_qk_norm_per_head(self):
        """q and k are RMS-normalised per head before RoPE, so scaling q_proj changes nothing,
        while scaling q_norm's weight does."""
        base, _ = make_model(self.path("a"), "Qwen3ForCausalLM", hd=16)

        def scale_q(tt):
            for i in range(2):
                tt["model.layers.%d.self_attn.q_proj.weight" % i] = base["model.layers.%d.self_attn.q_proj.weight" % i] * 8

        def scale_qn(tt):
            tt["model.layers.0.self_attn.q_norm.weight"] = base["model.layers.0.self_attn.q_norm.weight"] * 3

        make_model(self.path("b"), "Qwen3ForCausalLM", hd=16, edit=scale_q)
        make_model(self.path("c"), "Qwen3ForCausalLM", hd=16, edit=scale_qn)
        a = run(self.path("a"), IDS)
        self.close(a, run(self.path("b"), IDS), 1e-4)  # not exact: eps inside the norm
        self.assertGreater(float((a - run(self.path("c"), IDS)).abs().max()), 1e-3)

    def test_qwen2_biases_used(self):
        base, _ = make_model(self.path("a"), "Qwen2ForCausalLM")

        def zero_vb(tt):
            tt["model.layers.1.self_attn.v_proj.bias"] = np.zeros_like(base["model.layers.1.self_attn.v_proj.bias"])

        make_model(self.path("b"), "Qwen2ForCausalLM", edit=zero_vb)
        self.assertGreater(float((run(self.path("a"), IDS) - run(self.path("b"), IDS)).abs().max()), 1e-3)

    def test_f32_close_to_f64(self):
        make_model(self.path("m"), "Qwen2ForCausalLM")
        self.close(run(self.path("m"), IDS, dtype=torch.float32).to(F64), run(self.path("m"), IDS), 1e-4)


class RopeTables(unittest.TestCase):
    def test_llama3(self):
        cfg = {"rope_theta": 500000.0, "rope_scaling": {"rope_type": "llama3", "factor": 8.0, "low_freq_factor": 1.0,
                                                        "high_freq_factor": 4.0, "original_max_position_embeddings": 8192}}
        d = 64
        inv, att = H.rope_parameters(cfg, d, F64)
        self.assertEqual(att, 1.0)
        bands = set()
        for i in range(d // 2):
            f = 500000.0 ** (-2 * i / d)
            wl = 2 * math.pi / f
            if wl < 8192 / 4:
                want, band = f, "high"
            elif wl > 8192 / 1:
                want, band = f / 8, "low"
            else:
                s = (8192 / wl - 1) / (4 - 1)
                want, band = (1 - s) * f / 8 + s * f, "mid"
            bands.add(band)
            self.assertAlmostEqual(float(inv[i]) / want, 1.0, places=12)
        self.assertEqual(bands, {"high", "mid", "low"})

    def test_yarn(self):
        d, base, factor, orig = 64, 10000.0, 4.0, 2048
        cfg = {"rope_theta": base, "max_position_embeddings": orig * 4,
               "rope_scaling": {"rope_type": "yarn", "factor": factor, "original_max_position_embeddings": orig}}
        inv, att = H.rope_parameters(cfg, d, F64)
        self.assertAlmostEqual(att, 0.1 * math.log(factor) + 1, places=12)

        def dim_of(rot):  # dimension index whose wavelength makes `rot` turns over orig
            return d * math.log(orig / (rot * 2 * math.pi)) / (2 * math.log(base))

        lo, hi = max(math.floor(dim_of(32)), 0), min(math.ceil(dim_of(1)), d - 1)
        for i in range(d // 2):
            f = base ** (-2 * i / d)
            ramp = min(1.0, max(0.0, (i - lo) / (hi - lo)))  # 0: keep f, 1: f / factor
            want = f * (1 - ramp) + f / factor * ramp
            self.assertAlmostEqual(float(inv[i]) / want, 1.0, places=12)
        self.assertAlmostEqual(float(inv[0]), 1.0, places=12)
        self.assertAlmostEqual(float(inv[-1]) * factor / base ** (-(d - 2) / d), 1.0, places=12)
        # explicit attention_factor, and DeepSeek's mscale / mscale_all_dim ratio
        cfg["rope_scaling"]["attention_factor"] = 0.5
        self.assertEqual(H.rope_parameters(cfg, d, F64)[1], 0.5)
        del cfg["rope_scaling"]["attention_factor"]
        cfg["rope_scaling"].update(mscale=1.0, mscale_all_dim=0.5)
        m = H.rope_parameters(cfg, d, F64)[1]
        self.assertAlmostEqual(m, (0.1 * math.log(4) + 1) / (0.05 * math.log(4) + 1), places=12)

    def test_linear(self):
        cfg = {"rope_theta": 10000.0, "rope_scaling": {"type": "linear", "factor": 2.0}}
        inv, _ = H.rope_parameters(cfg, 8, F64)
        self.assertAlmostEqual(float(inv[1]), 10000.0 ** (-2 / 8) / 2, places=14)


class Refusals(Base):
    def expect_error(self, d, needle):
        with self.assertRaises(H.ModelError) as cm:
            H.Model(d, F64)
        self.assertIn(needle, str(cm.exception))

    def test_refusals(self):
        make_model(self.path("dyn"), scaling={"rope_type": "dynamic", "factor": 2.0})
        self.expect_error(self.path("dyn"), "dynamic")
        make_model(self.path("arch"), "GPTNeoXForCausalLM")
        self.expect_error(self.path("arch"), "architecture")
        make_model(self.path("mistral"), "MistralForCausalLM")
        self.assertEqual(H.Model(self.path("mistral"), F64).arch, "MistralForCausalLM")
        d = self.path("mistral")
        with open(os.path.join(d, "config.json")) as f:
            c = json.load(f)
        c["sliding_window"] = 4096
        with open(os.path.join(d, "config.json"), "w") as f:
            json.dump(c, f)
        self.expect_error(d, "sliding")
        make_model(self.path("miss"), edit=lambda t: t.pop("model.norm.weight"))
        self.expect_error(self.path("miss"), "missing tensor model.norm.weight")
        make_model(self.path("extra"), edit=lambda t: t.__setitem__("model.extra.weight", np.ones(3, np.float32)))
        self.expect_error(self.path("extra"), "does not use")
        make_model(self.path("shape"), edit=lambda t: t.__setitem__("model.norm.weight", np.ones(5, np.float32)))
        self.expect_error(self.path("shape"), "shape")
        d = self.path("sw")
        make_model(d, "Qwen2ForCausalLM")
        with open(os.path.join(d, "config.json")) as f:
            c = json.load(f)
        c["use_sliding_window"] = True
        with open(os.path.join(d, "config.json"), "w") as f:
            json.dump(c, f)
        self.expect_error(d, "sliding")
        with open(os.path.join(d, "model.safetensors"), "r+b") as f:
            f.truncate(100)
        c["use_sliding_window"] = False
        with open(os.path.join(d, "config.json"), "w") as f:
            json.dump(c, f)
        self.expect_error(d, "")

    def test_cli(self):
        d = self.path("m")
        make_model(d)
        me = os.path.join(os.path.dirname(os.path.abspath(__file__)), "hf_forward.py")
        out = subprocess.run([sys.executable, me, d, "--ids", json.dumps(IDS), "--top", "3", "--all"],
                             check=True, capture_output=True, text=True).stdout
        res = json.loads(out)
        self.assertEqual(res["positions"], list(range(len(IDS))))
        self.assertEqual(len(res["top"][0]), 3)
        lp = run(d, IDS, dtype=torch.float32)
        self.assertEqual(res["top"][-1][0][0], int(lp[-1].argmax()))
        raw = subprocess.run([sys.executable, me, d, "--ids", json.dumps(IDS), "--format", "f32",
                              "--positions", "0,19"], check=True, capture_output=True).stdout
        self.assertEqual(len(raw), 2 * 96 * 4)
        bad = subprocess.run([sys.executable, me, d, "--ids", "[1, 500]"], capture_output=True, text=True)
        self.assertEqual(bad.returncode, 1)
        self.assertIn("vocabulary", bad.stderr)


@unittest.skipUnless(os.environ.get("CHUNKGATE_WORKER_BIN"), "CHUNKGATE_WORKER_BIN not set")
class Presets(Base):
    def gen(self, preset, name, *extra):
        d = self.path(name)
        subprocess.run([os.environ["CHUNKGATE_WORKER_BIN"], "generate-model", "--preset", preset,
                        "--out", d, *extra], check=True, capture_output=True)
        return d

    def test_presets_non_degenerate(self):
        rnd = random.Random(3)
        ids = [rnd.randrange(1000, 30000) for _ in range(64)]
        for preset in ("llama3", "llama2", "qwen2", "qwen3"):
            d = self.gen(preset, preset)
            lp = run(d, ids, dtype=torch.float32)
            p1 = lp.max(-1).values.exp()
            ent = -(lp.exp() * lp).sum(-1)
            self.assertTrue(0.03 < float(p1.median()) < 0.6, "%s median top-1 %g" % (preset, p1.median()))
            self.assertTrue(1.0 < float(ent.median()) < 9.0, "%s median entropy %g" % (preset, ent.median()))
            self.assertGreater(len(set(lp.argmax(-1).tolist())), 48, preset)

    def test_dtypes_identical(self):
        ids = list(range(2000, 2040))
        a = run(self.gen("qwen3", "bf16"), ids, dtype=torch.float32)
        b = run(self.gen("qwen3", "f32", "--dtype", "f32"), ids, dtype=torch.float32)
        c = run(self.gen("qwen3", "f16", "--dtype", "f16", "--shards", "2"), ids, dtype=torch.float32)
        self.assertTrue(torch.equal(a, b))
        self.assertTrue(torch.equal(a, c))

    def test_yarn_and_linear_presets(self):
        ids = list(range(3000, 3030))
        for spec in ("yarn:4", "linear:2", "llama3"):
            d = self.gen("qwen2", spec.replace(":", "-"), "--rope-scaling", spec)
            a = run(d, ids)
            self.close(a, run(d, ids, pos0=777), 1e-9)


if __name__ == "__main__":
    torch.set_num_threads(2)
    prog = unittest.main(exit=False, verbosity=2)
    sys.exit(0 if prog.result.wasSuccessful() else 1)

#!/usr/bin/python3
"""Compares next-token log-probabilities of the torch reference (tests/ref/hf_forward.py) on an
HF checkpoint with llama.cpp (llamacpp.mjs) on its f16 GGUF, on the same token ids.

  crosscheck.py MODEL_DIR MODEL.gguf [--tokens 512] [--positions 8] [--top 20] [--seed 1]
                [--id-min 1000] [--id-max 30000] [--threads 2] [--dtype float32|float64]

The prompt is --tokens pseudo-random ids (llamacpp.mjs's xorshift32 rule), the BOS id of
config.json first when the tokenizer adds one. Compared at --positions positions spread evenly
over the prompt (the last included): top-1 agreement, max |delta logprob| over the
reference's top-k, and KL(reference || llama.cpp) over the whole vocabulary.
Prints one JSON object; exits 1 if a top-1 differs where the reference's top-2 gap is at least
twice the largest |delta| seen at that position (a closer near-tie may flip under f16), or a
--max-dlogprob / --max-kl limit is exceeded.
"""

import argparse
import json
import os
import subprocess
import sys
import tempfile

import numpy as np

HERE = os.path.dirname(os.path.abspath(__file__))
REF = os.path.join(HERE, "..", "..", "tests", "ref", "hf_forward.py")


def xorshift_ids(n, seed, lo, hi):
    x = (seed & 0xFFFFFFFF) or 1
    out = []
    for _ in range(n):
        x ^= (x << 13) & 0xFFFFFFFF
        x ^= x >> 17
        x ^= (x << 5) & 0xFFFFFFFF
        out.append(lo + x % (hi - lo))
    return out


def add_probe_args(ap, positions):
    """The options of the probe prompt that probe_ids reads: --tokens, --positions (default
    positions), --seed, --id-min, --id-max."""
    ap.add_argument("--tokens", type=int, default=512)
    ap.add_argument("--positions", type=int, default=positions)
    ap.add_argument("--seed", type=int, default=1)
    ap.add_argument("--id-min", type=int, default=1000)
    ap.add_argument("--id-max", type=int, default=30000)


def probe_ids(model_dir, cfg, tokens, seed, lo, hi, positions):
    """The probe prompt of a cross-check: `tokens` pseudo-random ids in [lo, hi) from seed,
    led by BOS where the model's tokenizer adds one, and `positions` evenly spaced positions
    whose logits are compared. Returns (ids, positions)."""
    ids = xorshift_ids(tokens, seed, lo, hi)
    tc_path = os.path.join(model_dir, "tokenizer_config.json")
    add_bos = cfg.get("model_type") == "llama"
    if os.path.exists(tc_path):
        with open(tc_path) as f:
            add_bos = json.load(f).get("add_bos_token", add_bos)
    if add_bos and cfg.get("bos_token_id") is not None:
        ids[0] = cfg["bos_token_id"]
    n = len(ids)
    return ids, sorted(set(round(i * (n - 1) / max(1, positions - 1)) for i in range(positions)))


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("model_dir")
    ap.add_argument("gguf")
    add_probe_args(ap, positions=8)
    ap.add_argument("--top", type=int, default=20)
    ap.add_argument("--threads", type=int, default=2)
    ap.add_argument("--dtype", default="float32")
    ap.add_argument("--max-dlogprob", type=float, default=0.0,
                    help="fail when max |delta logprob| over the top-k exceeds this (0: no limit)")
    ap.add_argument("--max-kl", type=float, default=0.0, help="fail when a KL exceeds this (0: no limit)")
    a = ap.parse_args()
    with open(os.path.join(a.model_dir, "config.json")) as f:
        cfg = json.load(f)
    ids, pos = probe_ids(a.model_dir, cfg, a.tokens, a.seed, a.id_min, a.id_max, a.positions)
    V = cfg["vocab_size"]
    with tempfile.TemporaryDirectory() as tmp:
        ids_file = os.path.join(tmp, "ids.json")
        with open(ids_file, "w") as f:
            json.dump(ids, f)
        ref_out = os.path.join(tmp, "ref.f32")
        lc_out = os.path.join(tmp, "lc.f32")
        plist = ",".join(map(str, pos))
        subprocess.run(["/usr/bin/python3", REF, a.model_dir, "--ids-file", ids_file,
                        "--positions", plist, "--format", "f32", "--dtype", a.dtype,
                        "--threads", str(a.threads), "--out", ref_out], check=True)
        env = dict(os.environ, NODE_LLAMA_CPP_SKIP_DOWNLOAD="true")
        lc = subprocess.run(["node", os.path.join(HERE, "llamacpp.mjs"), "logprobs", "--model", a.gguf,
                             "--ids-file", ids_file, "--positions", plist, "--top", "1",
                             "--full", lc_out, "--threads", str(a.threads)],
                            env=env, capture_output=True, text=True)
        if lc.returncode != 0:
            sys.stderr.write(lc.stderr)
            return 2
        lc_meta = json.loads(lc.stdout)
        ref = np.fromfile(ref_out, dtype="<f4").astype(np.float64).reshape(len(pos), V)
        got = np.fromfile(lc_out, dtype="<f4").astype(np.float64).reshape(len(pos), V)
    rows, top1_ok = [], True
    for i, p in enumerate(pos):
        r, g = ref[i], got[i]
        order = np.argsort(-r)[: a.top]
        pr = np.exp(r)
        kl = float(np.sum(pr * (r - g)))
        same = int(np.argmax(r)) == int(np.argmax(g))
        dmax = float(np.max(np.abs(r[order] - g[order])))
        gap = float(r[order[0]] - r[order[1]])
        # A different argmax is a failure unless the reference's top two are closer than
        # twice the deviation measured at that position (a near-tie f16 rounding can flip).
        top1_ok &= same or gap < 2 * dmax
        rows.append({"position": p, "top1_ref": int(order[0]), "top1_llamacpp": int(np.argmax(g)),
                     "top1_logprob_ref": float(r[order[0]]), "top2_gap_ref": gap,
                     "max_abs_dlogprob_topk": dmax, "kl": kl})
    res = {"model": a.model_dir, "gguf": a.gguf, "tokens": len(ids), "top": a.top, "dtype": a.dtype,
           "llama_cpp_release": lc_meta.get("llama_cpp_release"),
           "top1_agree": f"{sum(r['top1_ref'] == r['top1_llamacpp'] for r in rows)}/{len(rows)}",
           "max_abs_dlogprob_topk": max(r["max_abs_dlogprob_topk"] for r in rows),
           "max_kl": max(r["kl"] for r in rows),
           "positions": rows}
    print(json.dumps(res))
    ok = top1_ok
    if a.max_dlogprob > 0 and res["max_abs_dlogprob_topk"] > a.max_dlogprob:
        ok = False
    if a.max_kl > 0 and res["max_kl"] > a.max_kl:
        ok = False
    return 0 if ok else 1


if __name__ == "__main__":
    sys.exit(main())

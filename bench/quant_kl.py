#!/usr/bin/python3
"""Quality of --quant q8 / q4 against llama.cpp's Q8_0 / Q4_0 on the same weights: KL of the
next-token distributions against the 16-bit ones, on the same token ids.

  quant_kl.py MODEL_DIR WORK_DIR [--tokens 512] [--positions 32] [--seed 1]
              [--id-min 1000] [--id-max 30000] [--threads 2] [--build build]

WORK_DIR receives the GGUFs (bench/gguf_write.py --type f16, q8_0, q4_0; kept when present)
and the log-probability rows. chunkgate: build/bench/bench_quant (one process per setting,
prefill kernels, pieces of 256 rows); llama.cpp: bench/llamacpp/llamacpp.mjs logprobs --full.
Reported, over --positions positions spread evenly over --tokens xorshift32 ids (BOS first when
the tokenizer adds one): mean and max KL(P || Q) in nats and top-1 agreement, for
  P = chunkgate 16-bit: Q = chunkgate q8, q4, llama.cpp F16, Q8_0, Q4_0;
  P = llama.cpp F16:    Q = llama.cpp Q8_0, Q4_0 (llama.cpp's own loss, as llama-perplexity
                        --kl-divergence measures it).
Prints a table and one JSON object.
"""

import argparse
import json
import os
import subprocess
import sys

import numpy as np

HERE = os.path.dirname(os.path.abspath(__file__))
sys.path.insert(0, os.path.join(HERE, "llamacpp"))
from crosscheck import probe_ids  # noqa: E402


def kl_stats(p, q):
    kl = np.sum(np.exp(p) * (p - q), axis=1)
    agree = int(np.sum(np.argmax(p, axis=1) == np.argmax(q, axis=1)))
    return {"kl_mean": float(kl.mean()), "kl_max": float(kl.max()), "top1": "%d/%d" % (agree, len(kl))}


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("model_dir")
    ap.add_argument("work")
    ap.add_argument("--tokens", type=int, default=512)
    ap.add_argument("--positions", type=int, default=32)
    ap.add_argument("--seed", type=int, default=1)
    ap.add_argument("--id-min", type=int, default=1000)
    ap.add_argument("--id-max", type=int, default=30000)
    ap.add_argument("--threads", type=int, default=2)
    ap.add_argument("--build", default="build")
    a = ap.parse_args()
    os.makedirs(a.work, exist_ok=True)
    with open(os.path.join(a.model_dir, "config.json")) as f:
        cfg = json.load(f)
    V = cfg["vocab_size"]
    ids, pos = probe_ids(a.model_dir, cfg, a.tokens, a.seed, a.id_min, min(a.id_max, V),
                         a.positions)
    plist = ",".join(map(str, pos))
    ids_file = os.path.join(a.work, "ids.json")
    with open(ids_file, "w") as f:
        json.dump(ids, f)

    rows = {}
    meta = []
    out = subprocess.run([os.path.join(a.build, "bench", "bench_quant"), a.model_dir, ids_file,
                          plist, os.path.join(a.work, "cg")],
                         env=dict(os.environ, OMP_NUM_THREADS=str(a.threads)),
                         check=True, capture_output=True, text=True)
    for line in out.stdout.splitlines():
        m = json.loads(line)
        meta.append(m)
        rows["cg_" + m["quant"]] = np.fromfile(os.path.join(a.work, "cg.%s.f32" % m["quant"]),
                                               dtype="<f4").astype(np.float64).reshape(len(pos), V)
    env = dict(os.environ, NODE_LLAMA_CPP_SKIP_DOWNLOAD="true")
    llama_release = None
    for t in ("f16", "q8_0", "q4_0"):
        gguf = os.path.join(a.work, "model-%s.gguf" % t)
        if not os.path.exists(gguf):
            subprocess.run(["/usr/bin/python3", os.path.join(HERE, "gguf_write.py"), "--type", t,
                            a.model_dir, gguf], check=True, stdout=sys.stderr)
        full = os.path.join(a.work, "llama.%s.f32" % t)
        lc = subprocess.run(["node", os.path.join(HERE, "llamacpp", "llamacpp.mjs"), "logprobs",
                             "--model", gguf, "--ids-file", ids_file, "--positions", plist,
                             "--top", "1", "--full", full, "--threads", str(a.threads)],
                            env=env, capture_output=True, text=True)
        if lc.returncode != 0:
            sys.stderr.write(lc.stderr)
            return 2
        llama_release = json.loads(lc.stdout).get("llama_cpp_release")
        rows["llama_" + t] = np.fromfile(full, dtype="<f4").astype(np.float64).reshape(len(pos), V)

    res = {"model": a.model_dir, "tokens": len(ids), "positions": len(pos), "seed": a.seed,
           "llama_cpp_release": llama_release, "chunkgate": meta, "kl": {}}
    ref = rows["cg_none"]
    for q in ("cg_q8", "cg_q4", "llama_f16", "llama_q8_0", "llama_q4_0"):
        res["kl"]["cg_f16||" + q] = kl_stats(ref, rows[q])
    for q in ("llama_q8_0", "llama_q4_0"):
        res["kl"]["llama_f16||" + q] = kl_stats(rows["llama_f16"], rows[q])
    sys.stderr.write("%-32s %12s %12s %8s\n" % ("KL(P || Q)", "mean", "max", "top-1"))
    for k, v in res["kl"].items():
        sys.stderr.write("%-32s %12.3e %12.3e %8s\n" % (k, v["kl_mean"], v["kl_max"], v["top1"]))
    print(json.dumps(res))
    return 0


if __name__ == "__main__":
    sys.exit(main())

#!/usr/bin/python3
"""Quality of --quant q8 / q4 against llama.cpp's Q8_0 / Q4_0 on the same weights: KL of the
next-token distributions against the 16-bit ones, on the same token ids.

  quant_kl.py MODEL_DIR WORK_DIR [--tokens 512] [--positions 32] [--seed 1]
              [--id-min 1000] [--id-max 30000] [--rag N] [--threads 2] [--build build]

WORK_DIR receives the GGUFs (bench/gguf_write.py --type f16, q8_0, q4_0; kept when present)
and the log-probability rows. chunkgate: build/bench/bench_quant (one process per setting,
prefill kernels, pieces of 256 rows); llama.cpp: bench/llamacpp/llamacpp.mjs logprobs --full.
Reported, over --positions positions spread evenly over --tokens xorshift32 ids (BOS first when
the tokenizer adds one), or with --rag N (a checkpoint trained by train/train.py) over the
held-out RAG questions of train/world.py (4-6 documents each, rendered as the trainer does,
one prompt after another, at most N and at most 2048 tokens) at every position and, as
"answer", at the positions whose next token is an answer token, where the distribution
decides what a user reads: mean and max KL(P || Q) in nats and top-1 agreement, for
  P = chunkgate 16-bit: Q = chunkgate q8, q4, llama.cpp F16, Q8_0, Q4_0;
  P = llama.cpp F16:    Q = llama.cpp Q8_0, Q4_0 (llama.cpp's own loss, as llama-perplexity
                        --kl-divergence measures it);
  P = llama.cpp Q8_0 / Q4_0: Q = chunkgate serving the same GGUF file (--model FILE.gguf: the
                        file's blocks, repacked at load), so what remains is the two engines'
                        arithmetic, not the weights.
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
from crosscheck import add_probe_args, probe_ids  # noqa: E402


def kl_stats(p, q):
    kl = np.sum(np.exp(p) * (p - q), axis=1)
    agree = int(np.sum(np.argmax(p, axis=1) == np.argmax(q, axis=1)))
    return {"kl_mean": float(kl.mean()), "kl_max": float(kl.max()), "top1": "%d/%d" % (agree, len(kl))}


def rag_ids(model_dir, n, seed, max_len):
    """Held-out RAG prompts with their answers, one after another (each a new chat, as a
    client would send it) in one sequence of at most max_len ids; every position; and the
    indices of the positions whose next token is an answer token. At most n questions, the
    four kinds in turn."""
    sys.path.insert(0, os.path.join(os.path.dirname(HERE), "train"))
    import bpe
    import train
    import world
    tok = bpe.load(os.path.join(model_dir, "tokenizer.json"))
    per = (n + len(world.KINDS) - 1) // len(world.KINDS)
    exs = world.eval_set(seed, per)
    exs = [exs[k * per + i] for i in range(per) for k in range(len(world.KINDS))]
    ids, ans_at = [], []
    for ex in exs[:n]:
        x, _, ans = train.encode(tok, ex)
        if len(ids) + len(x) + len(ans) > max_len:
            break
        ans_at += range(len(ids) + len(x) - 1, len(ids) + len(x) + len(ans) - 1)
        ids += x + ans
    return ids, list(range(len(ids))), ans_at


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("model_dir")
    ap.add_argument("work")
    add_probe_args(ap, positions=32)
    ap.add_argument("--rag", type=int, default=0,
                    help="answer positions of this many held-out RAG questions instead of random ids")
    ap.add_argument("--threads", type=int, default=2)
    ap.add_argument("--build", default="build")
    a = ap.parse_args()
    os.makedirs(a.work, exist_ok=True)
    with open(os.path.join(a.model_dir, "config.json")) as f:
        cfg = json.load(f)
    V = cfg["vocab_size"]
    if a.rag:
        ids, pos, ans_at = rag_ids(a.model_dir, a.rag, a.seed,
                                   min(2048, cfg.get("max_position_embeddings", 2048)))
    else:
        ans_at = None
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
        if t != "f16":
            # chunkgate serving the same quantised file (its blocks, repacked at load)
            out = subprocess.run([os.path.join(a.build, "bench", "bench_quant"), gguf, ids_file,
                                  plist, os.path.join(a.work, "cg_gguf_" + t), "none"],
                                 env=dict(os.environ, OMP_NUM_THREADS=str(a.threads)),
                                 capture_output=True, text=True)
            if out.returncode == 0:
                rows["cg_gguf_" + t] = np.fromfile(os.path.join(a.work, "cg_gguf_%s.none.f32" % t),
                                                   dtype="<f4").astype(np.float64).reshape(len(pos), V)
            else:
                sys.stderr.write("chunkgate on %s: %s" % (gguf, out.stderr))

    res = {"model": a.model_dir, "tokens": len(ids), "positions": len(pos), "seed": a.seed,
           "llama_cpp_release": llama_release, "chunkgate": meta, "kl": {}}
    ref = rows["cg_none"]
    for q in ("cg_q8", "cg_q4", "llama_f16", "llama_q8_0", "llama_q4_0"):
        res["kl"]["cg_f16||" + q] = kl_stats(ref, rows[q])
    for q in ("llama_q8_0", "llama_q4_0"):
        res["kl"]["llama_f16||" + q] = kl_stats(rows["llama_f16"], rows[q])
    for t in ("q8_0", "q4_0"):
        if "cg_gguf_" + t in rows:
            res["kl"]["cg_f16||cg_gguf_" + t] = kl_stats(ref, rows["cg_gguf_" + t])
            res["kl"]["llama_%s||cg_gguf_%s" % (t, t)] = kl_stats(rows["llama_" + t], rows["cg_gguf_" + t])
    if ans_at:
        res["answer_positions"] = len(ans_at)
        for q in ("cg_q8", "cg_q4", "llama_q8_0", "llama_q4_0"):
            res["kl"]["answer: cg_f16||" + q] = kl_stats(ref[ans_at], rows[q][ans_at])
    sys.stderr.write("%-32s %12s %12s %8s\n" % ("KL(P || Q)", "mean", "max", "top-1"))
    for k, v in res["kl"].items():
        sys.stderr.write("%-32s %12.3e %12.3e %8s\n" % (k, v["kl_mean"], v["kl_max"], v["top1"]))
    print(json.dumps(res))
    return 0


if __name__ == "__main__":
    sys.exit(main())

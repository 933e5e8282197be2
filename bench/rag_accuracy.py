#!/usr/bin/python3
"""Accuracy of chunk reuse on the trained RAG model, through the real gateway and worker.

Starts chunkgate-worker on the model and the gateway in front of it (loopback, free ports),
builds held-out questions over a fixed fictional world (train/world.py Corpus: entities never
seen in training, 4-6 documents per request drawn from one pool, so documents recur in other
orders and under other system prompts), and sends them as chat requests with `documents`
under each reuse setting. For every setting it reports exact-match accuracy per question kind,
warm time to first token (TTFT, streamed, p50 and mean), the share of chunk tokens recomputed,
and the quality probe's KL and top-1 agreement (`quality_probe: true`, computed after the
answer, so TTFT does not include it).

The baseline ("full") goes through the same gateway and worker path with
recompute_prefix_tokens past every chunk, which recomputes every chunk token with full causal
context: a plain causal prefill of exactly the same tokens (DESIGN section 5). The same token ids
sent straight to the worker's /v1/completions are a second baseline and must give the same
answers. Every reuse setting is measured warm: one pass per isolation mode stores the chunks
first.

The canary is validated on the same answers: across settings, Spearman's rank correlation of
mean KL (and of 1 - top-1 agreement) with the accuracy loss; per request, the ROC AUC of the
probe's KL for separating answers reuse turned wrong (right under full prefill, wrong under
reuse) from answers it left right. Two more figures say how far the first one can be trusted:
Spearman of mean KL with the share of answers each setting turned wrong (the loss without the
answers reuse happened to turn right), and a 90% interval of Spearman(KL, accuracy loss) over
the requests drawn again with replacement. The JSON keeps every answer, right or not, and its KL.

    /usr/bin/python3 bench/rag_accuracy.py --model models/chunkgate-rag \\
        [--n 600] [--out bench/results/rag_accuracy.json] [--svg bench/results/rag_accuracy.svg]
"""

import argparse
import http.client
import json
import math
import os
import random
import re
import signal
import socket
import subprocess
import sys
import tempfile
import time

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
sys.path.insert(0, os.path.join(ROOT, "train"))
import world  # noqa: E402

# (label, chunk_mode, recompute_prefix_tokens, recompute_ratio[, recompute_select]), the
# selection "deviation" when left out ("q" in a label: "question"). The baseline "full" recomputes
# every chunk token with full causal context, which DESIGN §5 makes equal to a plain causal
# forward of the whole prompt; it goes through the same gateway and worker path.
FULL_K = 100000
SETTINGS = [("strict", "strict", 0, 0.0), ("sys", "sys", 0, 0.0),
            ("strict k=4", "strict", 4, 0.0), ("strict k=16", "strict", 16, 0.0),
            ("strict k=32", "strict", 32, 0.0),
            ("strict r=0.05", "strict", 0, 0.05), ("strict r=0.15", "strict", 0, 0.15),
            ("strict r=0.3", "strict", 0, 0.3), ("strict r=0.5", "strict", 0, 0.5),
            ("sys k=4", "sys", 4, 0.0), ("sys r=0.15", "sys", 0, 0.15),
            ("strict k=4 r=0.15", "strict", 4, 0.15), ("sys k=4 r=0.15", "sys", 4, 0.15),
            ("strict r=0.05 q", "strict", 0, 0.05, "question"),
            ("strict r=0.15 q", "strict", 0, 0.15, "question"),
            ("strict r=0.3 q", "strict", 0, 0.3, "question"),
            ("sys r=0.15 q", "sys", 0, 0.15, "question"),
            ("strict k=4 r=0.15 q", "strict", 4, 0.15, "question")]


def free_port():
    s = socket.socket()
    s.bind(("127.0.0.1", 0))
    p = s.getsockname()[1]
    s.close()
    return p


def call(port, method, path, body=None, timeout=120):
    c = http.client.HTTPConnection("127.0.0.1", port, timeout=timeout)
    c.request(method, path, json.dumps(body) if body is not None else None,
              {"Content-Type": "application/json"})
    r = c.getresponse()
    data = r.read()
    c.close()
    if r.status != 200:
        raise RuntimeError("%s %s: %d %s" % (method, path, r.status, data[:300]))
    return json.loads(data)


def stream(port, path, body):
    """POSTs a streamed request; returns (text, seconds to the first content, last event's
    chunk_cache or None, quality or None)."""
    c = http.client.HTTPConnection("127.0.0.1", port, timeout=120)
    t0 = time.perf_counter()
    c.request("POST", path, json.dumps(body), {"Content-Type": "application/json"})
    r = c.getresponse()
    if r.status != 200:
        raise RuntimeError("%s: %d %s" % (path, r.status, r.read()[:300]))
    text, ttft, cc = [], None, None
    for line in r:
        line = line.strip()
        if not line.startswith(b"data: ") or line == b"data: [DONE]":
            continue
        ev = json.loads(line[6:])
        for ch in ev.get("choices", []):
            piece = ch.get("text") if "text" in ch else (ch.get("delta") or {}).get("content")
            if piece:
                if ttft is None:
                    ttft = time.perf_counter() - t0
                text.append(piece)
        if ev.get("chunk_cache"):
            cc = ev["chunk_cache"]
    c.close()
    if ttft is None:
        ttft = time.perf_counter() - t0
    return "".join(text), ttft, cc


def start(cmd, log):
    return subprocess.Popen(cmd, stdout=log, stderr=subprocess.STDOUT, start_new_session=True)


def wait_ready(port, path, proc, what):
    for _ in range(300):
        if proc.poll() is not None:
            raise RuntimeError("%s exited (%d)" % (what, proc.returncode))
        try:
            c = http.client.HTTPConnection("127.0.0.1", port, timeout=2)
            c.request("GET", path)
            if c.getresponse().status == 200:
                return
        except OSError:
            pass
        time.sleep(0.1)
    raise RuntimeError("%s did not become ready" % what)


def spearman(xs, ys):
    def ranks(v):
        order = sorted(range(len(v)), key=lambda i: v[i])
        r = [0.0] * len(v)
        i = 0
        while i < len(v):
            j = i
            while j + 1 < len(v) and v[order[j + 1]] == v[order[i]]:
                j += 1
            for k in range(i, j + 1):
                r[order[k]] = (i + j) / 2.0
            i = j + 1
        return r
    a, b = ranks(xs), ranks(ys)
    ma, mb = sum(a) / len(a), sum(b) / len(b)
    cov = sum((x - ma) * (y - mb) for x, y in zip(a, b))
    va = math.sqrt(sum((x - ma) ** 2 for x in a))
    vb = math.sqrt(sum((y - mb) ** 2 for y in b))
    return cov / (va * vb) if va and vb else float("nan")


def roc_auc(pos, neg):
    """P(score of a positive > score of a negative), ties counting one half."""
    if not pos or not neg:
        return float("nan")
    allv = sorted([(v, 1) for v in pos] + [(v, 0) for v in neg])
    rank_sum, i = 0.0, 0
    while i < len(allv):
        j = i
        while j + 1 < len(allv) and allv[j + 1][0] == allv[i][0]:
            j += 1
        avg = (i + j) / 2.0 + 1
        rank_sum += avg * sum(1 for k in range(i, j + 1) if allv[k][1])
        i = j + 1
    n1, n0 = len(pos), len(neg)
    return (rank_sum - n1 * (n1 + 1) / 2.0) / (n1 * n0)


def pct(v, q):
    v = sorted(v)
    return v[min(len(v) - 1, int(q * len(v)))]


def svg_plot(rows, path):
    """Accuracy (mean over kinds) against warm TTFT p50, one labelled point per setting."""
    W, H, L, B = 760, 460, 70, 50
    xs = [r["ttft_p50_ms"] for r in rows]
    ys = [r["accuracy_mean"] * 100 for r in rows]
    x0, x1 = 0.0, max(xs) * 1.1
    y0, y1 = math.floor(min(ys) / 5) * 5 - 5, 100.0
    X = lambda v: L + (v - x0) / (x1 - x0) * (W - L - 20)  # noqa: E731
    Y = lambda v: H - B - (v - y0) / (y1 - y0) * (H - B - 20)  # noqa: E731
    out = ['<svg xmlns="http://www.w3.org/2000/svg" width="%d" height="%d" '
           'font-family="sans-serif" font-size="11">' % (W, H),
           '<rect width="100%" height="100%" fill="white"/>',
           '<line x1="%d" y1="%d" x2="%d" y2="%d" stroke="black"/>' % (L, H - B, W - 20, H - B),
           '<line x1="%d" y1="%d" x2="%d" y2="20" stroke="black"/>' % (L, H - B, L)]
    for i in range(6):
        v = x0 + (x1 - x0) * i / 5
        out.append('<text x="%.0f" y="%d" text-anchor="middle">%.1f</text>' % (X(v), H - B + 16, v))
    for v in range(int(y0), 101, 5):
        out.append('<text x="%d" y="%.0f" text-anchor="end">%d</text>' % (L - 6, Y(v) + 4, v))
        out.append('<line x1="%d" y1="%.0f" x2="%d" y2="%.0f" stroke="#eee"/>' % (L, Y(v), W - 20, Y(v)))
    out.append('<text x="%d" y="%d" text-anchor="middle">warm TTFT p50 (ms), through the gateway</text>'
               % ((W + L) / 2, H - 12))
    out.append('<text x="16" y="%d" transform="rotate(-90 16 %d)" text-anchor="middle">'
               'exact-match accuracy, mean over kinds (%%)</text>' % (H / 2, H / 2))
    for r, x, y in zip(rows, xs, ys):
        col = "#c00" if r["setting"] == "full" else "#036"
        out.append('<circle cx="%.1f" cy="%.1f" r="4" fill="%s"/>' % (X(x), Y(y), col))
        out.append('<text x="%.1f" y="%.1f">%s</text>' % (X(x) + 6, Y(y) - 4, r["setting"]))
    out.append("</svg>")
    with open(path, "w") as f:
        f.write("\n".join(out) + "\n")


def main():
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--model", default=os.path.join(ROOT, "models", "chunkgate-rag"))
    ap.add_argument("--worker-bin", default=os.path.join(ROOT, "build", "worker", "chunkgate-worker"))
    ap.add_argument("--gateway-bin", default=os.path.join(ROOT, "build", "server", "chunkgate"))
    ap.add_argument("--n", type=int, default=600, help="questions, split evenly over the kinds")
    ap.add_argument("--seed", type=int, default=1)
    ap.add_argument("--settings", default="all", help="all, or labels separated by ';'")
    ap.add_argument("--worker-arg", action="append", default=[],
                    help="extra chunkgate-worker serve argument (repeatable), e.g. --quant=q8")
    ap.add_argument("--out", help="write the results as JSON here")
    ap.add_argument("--svg", help="write the accuracy / TTFT plot here")
    args = ap.parse_args()

    settings = SETTINGS if args.settings == "all" else \
        [s for s in SETTINGS if s[0] in args.settings.split(";")]
    corpus = world.Corpus(args.seed)
    per = args.n // len(world.KINDS)
    qs = [corpus.ask(k) for k in world.KINDS for _ in range(per)]
    random.Random(args.seed).shuffle(qs)

    tmp = tempfile.mkdtemp(prefix="rag-accuracy-")
    wport, gport = free_port(), free_port()
    wlog = open(os.path.join(tmp, "worker.log"), "w")
    glog = open(os.path.join(tmp, "gateway.log"), "w")
    procs = []
    try:
        w = start([args.worker_bin, "serve", "--model", args.model, "--listen",
                   "127.0.0.1:%d" % wport, "--data-dir", os.path.join(tmp, "w"),
                   "--pool-mb", "512", "--canary-rate", "0"] + args.worker_arg, wlog)
        procs.append(w)
        wait_ready(wport, "/healthz", w, "worker")
        g = start([args.gateway_bin, "--listen", "127.0.0.1:%d" % gport, "--worker",
                   "http://127.0.0.1:%d" % wport, "--data-dir", os.path.join(tmp, "g")], glog)
        procs.append(g)
        wait_ready(gport, "/readyz", g, "gateway")
        model = call(wport, "GET", "/v1/info")["model"]
        results = run(args, model, qs, settings, gport, wport)
    finally:
        for p in procs:
            try:
                os.killpg(p.pid, signal.SIGTERM)
                p.wait(10)
            except (OSError, subprocess.TimeoutExpired):
                os.killpg(p.pid, signal.SIGKILL)
    print_table(results)
    if args.out:
        os.makedirs(os.path.dirname(os.path.abspath(args.out)), exist_ok=True)
        with open(args.out, "w") as f:
            json.dump(results, f, indent=1)
    if args.svg:
        svg_plot(results["settings"], args.svg)


def run(args, model, qs, settings, gport, wport):
    def chat(ex, extra):
        body = {"model": model, "max_tokens": 24, "temperature": 0, "stream": True,
                "messages": [{"role": "system", "content": ex["system"]},
                             {"role": "user", "content": ex["question"]}],
                "documents": ex["documents"]}
        body.update(extra)
        return body

    # the baseline: the same segments' tokens as one plain prompt
    ids = []
    for ex in qs:
        t = []
        for s in world.segments(ex):
            t += call(wport, "POST", "/tokenize", {"model": model, "prompt": s,
                                                   "add_special_tokens": False})["tokens"]
        ids.append(t)
    rows, answers = [], {}

    def record(label, outs, extra=None):
        acc = kind_accuracy([ex["kind"] for ex in qs], [o["right"] for o in outs])
        ttft = [o["ttft"] * 1000 for o in outs]
        row = {"setting": label, "accuracy": acc,
               "accuracy_mean": sum(acc.values()) / len(acc),
               "ttft_p50_ms": pct(ttft, 0.5), "ttft_mean_ms": sum(ttft) / len(ttft)}
        row.update(extra or {})
        rows.append(row)
        answers[label] = outs
        print("%-20s %s ttft p50 %.2f ms" % (label, " ".join("%s %.3f" % kv for kv in acc.items()),
                                             row["ttft_p50_ms"]), flush=True)

    # full prefill, direct to the worker: the same tokens as one plain prompt
    outs = []
    for ex, t in zip(qs, ids):
        text, ttft, _ = stream(wport, "/v1/completions",
                               {"model": model, "prompt": t, "max_tokens": 24,
                                "temperature": 0, "stream": True})
        outs.append({"answer": text.strip(), "right": text.strip() == ex["answer"], "ttft": ttft})
    direct = outs
    warmed = set()
    for label, mode, k, r, *sel in [("full", "strict", FULL_K, 0.0)] + settings:
        select = sel[0] if sel else "deviation"
        extra = {"chunk_mode": mode, "recompute_prefix_tokens": k, "recompute_ratio": r,
                 "recompute_select": select}
        if mode not in warmed:  # store every chunk of this mode once
            for ex in qs:
                stream(gport, "/v1/chat/completions", chat(ex, {"chunk_mode": mode, "max_tokens": 1}))
            warmed.add(mode)
        outs, rec, chunk_tok, hits, segs = [], 0, 0, 0, 0
        for ex in qs:
            text, ttft, cc = stream(gport, "/v1/chat/completions",
                                    chat(ex, dict(extra, quality_probe=True)))
            q = (cc or {}).get("quality") or {}
            outs.append({"answer": text.strip(), "right": text.strip() == ex["answer"],
                         "ttft": ttft, "kl": q.get("kl"), "top1": q.get("top1_agree")})
            rec += (cc or {}).get("recomputed_tokens") or 0
            for s in (cc or {}).get("segments", []):
                if s.get("role") == "chunk":
                    chunk_tok += s.get("tokens", 0)
                    hits += bool(s.get("hit"))
                    segs += 1
        kls = [o["kl"] for o in outs if o["kl"] is not None]
        t1 = [o["top1"] for o in outs if o["top1"] is not None]
        record(label, outs, {"chunk_mode": mode, "recompute_prefix_tokens": k,
                             "recompute_ratio": r, "recompute_select": select,
                             "recomputed_share": rec / chunk_tok if chunk_tok else None,
                             "chunk_hit_rate": hits / segs if segs else None,
                             "kl_mean": sum(kls) / len(kls) if kls else None,
                             "top1_agree_mean": sum(t1) / len(t1) if t1 else None})
    same = sum(a["answer"] == b["answer"] for a, b in zip(answers["full"], direct))
    record("full, direct to worker", direct, {"recomputed_share": 1.0,
                                               "same_answers_as_full": same / len(qs)})
    return validate(qs, rows, answers)


def validate(qs, rows, answers):
    base = rows[0]
    for r in rows:
        r["accuracy_kept"] = {k: (r["accuracy"][k] / base["accuracy"][k]
                                  if base["accuracy"][k] else None) for k in world.KINDS}
        kept = [v for v in r["accuracy_kept"].values() if v is not None]
        r["accuracy_kept_min"] = min(kept) if kept else None
        r["ttft_speedup"] = base["ttft_p50_ms"] / r["ttft_p50_ms"]
    reuse = [r for r in rows if r.get("kl_mean") is not None and r["setting"] != "full"]
    loss = [base["accuracy_mean"] - r["accuracy_mean"] for r in reuse]
    canary = {
        "spearman_kl_vs_loss": spearman([r["kl_mean"] for r in reuse], loss),
        "spearman_top1_vs_loss": spearman([1 - r["top1_agree_mean"] for r in reuse], loss),
    }
    pos, neg = [], []
    full = answers["full"]
    for r in reuse:
        outs = answers[r["setting"]]
        wrong = [f["right"] and not o["right"] for f, o in zip(full, outs)]
        r["turned_wrong_share"] = sum(wrong) / len(qs)
        r["changed_share"] = sum(f["answer"] != o["answer"] for f, o in zip(full, outs)) / len(qs)
        for f, o in zip(full, outs):
            if not f["right"] or o["kl"] is None:
                continue
            (neg if o["right"] else pos).append(o["kl"])
    canary["roc_auc_kl_turned_wrong"] = roc_auc(pos, neg)
    canary["turned_wrong"], canary["kept_right"] = len(pos), len(neg)
    # the answers reuse turned wrong, without those it turned right: the loss the canary warns of
    canary["spearman_kl_vs_turned_wrong"] = spearman([r["kl_mean"] for r in reuse],
                                                     [r["turned_wrong_share"] for r in reuse])
    canary["spearman_kl_vs_loss_ci90"] = bootstrap_spearman(qs, reuse, answers)
    return {"n": len(qs), "per_kind": {k: sum(1 for q in qs if q["kind"] == k) for k in world.KINDS},
            "settings": rows, "canary": canary,
            # per request and setting: 1 if right, the probe's KL, the answer (for re-analysis)
            "kinds": [q["kind"] for q in qs],
            "answers": {label: [[int(o["right"]), o.get("kl"), o["answer"]] for o in outs]
                        for label, outs in answers.items()}}


def kind_accuracy(kinds, rights):
    """Exact match per question kind, over parallel lists of kinds and outcomes (kinds no
    question has are left out)."""
    tot = {k: [0, 0] for k in world.KINDS}
    for k, r in zip(kinds, rights):
        tot[k][0] += r
        tot[k][1] += 1
    return {k: a / n for k, (a, n) in tot.items() if n}


def bootstrap_spearman(qs, reuse, answers, rounds=400, seed=1):
    """The 5th and 95th percentile of Spearman(mean KL, accuracy loss) over the settings when the
    requests are drawn again with replacement (the same draw for every setting): how much of the
    figure is the sampling of a few hundred questions."""
    rnd = random.Random(seed)
    n = len(qs)
    kinds = [q["kind"] for q in qs]
    full = answers["full"]
    vals = []
    for _ in range(rounds):
        pick = [rnd.randrange(n) for _ in range(n)]

        def acc(outs):  # mean over kinds, as accuracy_mean
            per = kind_accuracy([kinds[i] for i in pick], [outs[i]["right"] for i in pick])
            return sum(per.values()) / len(per)
        base = acc(full)
        kl, loss = [], []
        for r in reuse:
            outs = answers[r["setting"]]
            k = [outs[i]["kl"] for i in pick if outs[i]["kl"] is not None]
            kl.append(sum(k) / len(k) if k else 0.0)
            loss.append(base - acc(outs))
        v = spearman(kl, loss)
        if v == v:
            vals.append(v)
    vals.sort()
    if not vals:
        return None
    return [vals[int(0.05 * (len(vals) - 1))], vals[int(0.95 * (len(vals) - 1))]]


def print_table(res):
    print("\n| setting | " + " | ".join(world.KINDS) + " | kept (min) | recomputed | warm TTFT p50 | "
          "vs full | probe KL | top-1 |")
    print("|---" * (len(world.KINDS) + 7) + "|")
    for r in res["settings"]:
        f = lambda v, s="%.3f": "-" if v is None else s % v  # noqa: E731
        print("| %s | %s | %s | %s | %.2f ms | %.1fx | %s | %s |" % (
            r["setting"], " | ".join("%.1f%%" % (100 * r["accuracy"][k]) for k in world.KINDS),
            f(r["accuracy_kept_min"] * 100 if r["accuracy_kept_min"] is not None else None, "%.1f%%"),
            f(r.get("recomputed_share", None) and 100 * r["recomputed_share"], "%.1f%%"),
            r["ttft_p50_ms"], r["ttft_speedup"], f(r.get("kl_mean"), "%.4f"),
            f(r.get("top1_agree_mean"), "%.3f")))
    c = res["canary"]
    ci = c.get("spearman_kl_vs_loss_ci90") or [float("nan")] * 2
    print("\ncanary: Spearman(KL, accuracy loss) %.2f (90%% of resampled requests: %.2f to %.2f), "
          "Spearman(1 - top-1, loss) %.2f, Spearman(KL, share turned wrong) %.2f, "
          "ROC AUC of KL for answers turned wrong %.2f (%d turned wrong, %d kept right)" % (
              c["spearman_kl_vs_loss"], ci[0], ci[1], c["spearman_top1_vs_loss"],
              c["spearman_kl_vs_turned_wrong"],
              c["roc_auc_kl_turned_wrong"], c["turned_wrong"], c["kept_right"]))


if __name__ == "__main__":
    main()

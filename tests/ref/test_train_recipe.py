#!/usr/bin/python3
"""ctest ref_train_recipe: the training recipe (train/) end to end on a few steps.

Trains for three steps (tokenizer, model, BF16 safetensors, config, chat template, model card)
into a temporary directory, then checks what the worker makes of it:
- it loads in chunkgate-worker, which reports the architecture and the chat template;
- the worker's /tokenize equals the recipe's own encoder (train/bpe.py) on RAG segments of the
  held-out world and on other ASCII text, and so does @lenml/tokenizers (the reference port of
  the Hugging Face tokenizers, loading the same tokenizer.json) when tests/ref is installed;
- the worker's prompt log-probabilities of a 300-token RAG prompt agree with the independent
  torch reference (tests/ref/hf_forward.py, float64) and with the trainer's own model as saved
  within 1e-2 at every position;
- the recall sequences of the recipe's recall stage answer each query from its fact, and a
  fine-tune with the stage logs its accuracy;
- a run stopped (--stop-at) and resumed (--resume) writes the same weights and losses as the
  same run without a stop, and --resume refuses other options; a --schedule wsd run resumed
  before its decay under a larger --steps equals a run started with it, and a --steps that would
  change the steps already made is refused;
- a fine-tune's log and model card carry the run it went on from (the whole recipe).

Exit 77 (skipped, with the reason) without torch or CHUNKGATE_WORKER_BIN.
"""

import json
import os
import shutil
import subprocess
import sys
import tempfile

HERE = os.path.dirname(os.path.abspath(__file__))
ROOT = os.path.dirname(os.path.dirname(HERE))

sys.path.insert(0, HERE)
sys.path.insert(0, os.path.join(ROOT, "train"))
import test_worker_parity as P  # noqa: E402  (exits 77 with the reason without torch or numpy)
import torch  # noqa: E402
import bpe  # noqa: E402
import hf_forward as H  # noqa: E402
import recall_probe  # noqa: E402
import train  # noqa: E402
import world  # noqa: E402

TOL = 1e-2


def rag_prompt(model_dir, n):
    """Token ids of held-out RAG requests (train/world.py), each segment tokenized on its own as
    the worker does, until n tokens."""
    tok = bpe.load(os.path.join(model_dir, "tokenizer.json"))
    corpus, ids = world.Corpus(7), []
    while len(ids) < n:
        ex = corpus.ask(world.KINDS[len(ids) % len(world.KINDS)])
        for seg in world.segments(ex):
            ids += tok.encode(seg)
        ids += tok.encode(ex["answer"] + "<|im_end|>\n")
    return ids[:n]


def lenml_ids(model_dir, texts):
    """@lenml/tokenizers' ids of texts, or None when node or the package is missing."""
    if not shutil.which("node") or not os.path.isdir(os.path.join(HERE, "node_modules", "@lenml")):
        return None
    script = """
import fs from 'node:fs';
const lib = await import('@lenml/tokenizers');
const [dir, file] = process.argv.slice(1);
const read = (f) => JSON.parse(fs.readFileSync(dir + '/' + f, 'utf8'));
const tok = lib.TokenizerLoader.fromPreTrained({tokenizerJSON: read('tokenizer.json'),
                                                tokenizerConfig: read('tokenizer_config.json')});
const texts = JSON.parse(fs.readFileSync(file, 'utf8'));
console.log(JSON.stringify(texts.map((t) => tok.encode(t, {add_special_tokens: false}))));
"""
    with tempfile.NamedTemporaryFile("w", suffix=".json", delete=False) as f:
        json.dump(texts, f)
    try:
        out = subprocess.run(["node", "--input-type=module", "-e", script, model_dir, f.name],
                             cwd=HERE, capture_output=True, text=True, timeout=120)
    finally:
        os.unlink(f.name)
    if out.returncode != 0:
        raise RuntimeError("@lenml/tokenizers: %s" % out.stderr[-500:])
    return json.loads(out.stdout)


def check_model(binary, d, tmp, errors, answers=0):
    """The worker's view of checkpoint d: architecture and chat template, /tokenize against the
    recipe's encoder and @lenml/tokenizers, prompt logprobs against the torch reference and the
    trainer's own model; with answers > 0, that many held-out single-hop questions asked through
    the worker's chat API (greedy), whose share answered right is returned."""
    name = os.path.basename(os.path.normpath(d))
    tok = bpe.load(os.path.join(d, "tokenizer.json"))
    corpus = world.Corpus(3)
    texts = []
    for k in world.KINDS:
        ex = corpus.ask(k)
        texts += world.segments(ex) + [ex["answer"]]
    texts += ["Plain text, numbers 1234 and 56, it's here; don't stop!\n\n  spaced  out  ",
              "<|im_start|>user\nHello<|im_end|>\n<|im_start|>assistant\n"]
    wdir = tempfile.mkdtemp(prefix="w_", dir=tmp)
    w = P.Worker(binary, d, wdir, 64)
    right = 0
    try:
        info = w.call("GET", "/v1/info")
        if info["architecture"] != "LlamaForCausalLM" or not info.get("chat_template"):
            errors.append("%s: /v1/info: %s, chat template %r" % (name, info["architecture"],
                                                                  info.get("chat_template")))
        mine = [tok.encode(t) for t in texts]
        theirs = [w.call("POST", "/tokenize", {"prompt": t, "add_special_tokens": False})["tokens"]
                  for t in texts]
        for t, a, b in zip(texts, mine, theirs):
            if a != b:
                errors.append("%s: tokens of %r: recipe %s, worker %s" % (name, t[:40], a[:12],
                                                                          b[:12]))
        ref = lenml_ids(d, texts)
        if ref is None:
            print("@lenml/tokenizers is not installed (npm ci in tests/ref): compared with "
                  "the recipe's encoder only")
        else:
            for t, a, b in zip(texts, mine, ref):
                if a != b:
                    errors.append("%s: tokens of %r: recipe %s, @lenml/tokenizers %s"
                                  % (name, t[:40], a[:12], b[:12]))
        ids = rag_prompt(d, P.PROMPT_TOKENS)
        res = w.call("POST", "/v1/completions",
                     {"prompt": ids, "echo": True, "logprobs": 1, "max_tokens": 1,
                      "temperature": 0, "return_tokens_as_token_ids": True})
        got = res["choices"][0]["logprobs"]["token_logprobs"][1:len(ids)]
        qs = world.Corpus(11)
        for _ in range(answers):
            ex = qs.ask("single")
            body = {"messages": [{"role": "system", "content": ex["system"]},
                                 {"role": "user", "content": ex["question"]}],
                    "documents": ex["documents"],
                    "max_tokens": 24, "temperature": 0}
            out = w.call("POST", "/v1/chat/completions", body)
            right += out["choices"][0]["message"]["content"].strip() == ex["answer"]
    finally:
        rc = w.stop()
    if rc != 0:
        errors.append("%s: the worker exited with %d" % (name, rc))
    x = torch.tensor(ids)
    with torch.no_grad():
        ref = H.Model(d, torch.float64).forward(ids)
        m = train.load_model(d)
        own = torch.log_softmax(m(x[None], train.masks([0] * len(ids), len(ids), None)[None])[0]
                                .double(), -1)
    worst_ref = max(abs(g - float(ref[i, ids[i + 1]])) for i, g in enumerate(got))
    worst_own = max(abs(g - float(own[i, ids[i + 1]])) for i, g in enumerate(got))
    print("%s: %d prompt tokens: max |Δ logprob| worker vs reference %.2e, vs the trainer's "
          "model %.2e" % (name, len(ids), worst_ref, worst_own))
    if worst_ref > TOL or worst_own > TOL:
        errors.append("%s: logprobs differ: %.3g vs the reference, %.3g vs the trainer's model"
                      % (name, worst_ref, worst_own))
    return right / answers if answers else None


def check_widen(d, errors):
    """train.Llama.widen: the model in a wider geometry (hidden, head dim, KV heads, MLP) computes
    what it computed, on a held-out RAG prompt."""
    m = train.load_model(d)
    cfg = m.c
    torch.manual_seed(0)
    w = m.widen(dict(m.c, hidden_size=2 * cfg["hidden_size"],
                     num_key_value_heads=cfg["num_attention_heads"],
                     intermediate_size=2 * cfg["intermediate_size"]))
    ids = rag_prompt(d, 200)
    x = torch.tensor(ids)[None]
    mask = train.masks([0] * len(ids), len(ids), None)[None]
    with torch.no_grad():
        a, b = m(x, mask), w(x, mask)
    worst = float((a - b).abs().max() / a.abs().max())
    print("widened %d -> %d: max |Δ logit| %.2e of the largest" % (cfg["hidden_size"],
                                                                   w.c["hidden_size"], worst))
    if worst > 1e-3:  # float32 sums in another order; a misplaced RoPE pair moves them ~0.7
        errors.append("widen: logits moved by %.3g of the largest" % worst)
    if sum(p.numel() for p in w.parameters()) <= sum(p.numel() for p in m.parameters()):
        errors.append("widen: the widened model is no larger")


def check_recall(d, tmp, errors):
    """The recall sequences (train.recall_row) are what they claim: every key is unique, every
    query's answer is the value stated after its key, the noise stays within the gap. Then a
    fine-tune with a recall stage runs and logs the stage's accuracy."""
    import random
    tok = bpe.load(os.path.join(d, "tokenizer.json"))
    dot, eq, ask = tok.encode(".")[0], tok.encode("=")[0], tok.encode("?")[0]
    rng = random.Random(5)
    for gap, fixed in ((0, False), (3, False), (2, True)):
        for _ in range(50):
            ids, _, spans = train.recall_row(tok, rng, gap, fixed=fixed)
            body = ids[1:ids.index(ask)]
            facts = {}
            start = 0
            for i, t in enumerate(body):
                if t == dot:
                    fact = body[start:i]
                    k = tuple(fact[:2])
                    if k in facts:
                        errors.append("recall: key %s stated twice" % (k,))
                    noise = fact.index(eq) - 2
                    if not (noise == gap if fixed else 0 <= noise <= gap):
                        errors.append("recall: %d noise tokens, gap %d%s" %
                                      (noise, gap, " (fixed)" if fixed else ""))
                    facts[k] = fact[fact.index(eq) + 1:]
                    start = i + 1
            for a0, a1 in spans:
                key = tuple(ids[a0 - 3:a0 - 1])
                if ids[a0 - 4] != ask or ids[a0 - 1] != eq or facts.get(key) != ids[a0:a1 - 1]:
                    errors.append("recall: the query %s is not answered by its fact" % (key,))
                    return
    # the probe's gather sequences ask for each fact's own key after its `=`
    for _ in range(50):
        ids, _, spans = recall_probe.gather_row(tok, rng, 3)
        for a0, a1 in spans:
            start = max(i for i in range(a0) if ids[i] in (dot, tok.id("<|im_start|>"))) + 1
            if ids[a0 - 1] != eq or ids[a0:a1] != ids[start:start + 2]:
                errors.append("recall_probe: a gather answer is not its fact's key")
                return
    recall_probe.main(["--init", d, "--steps", "2", "--batch", "2", "--grow", "1",
                       "--gather", "0.5"])
    out = os.path.join(tmp, "recall")
    train.main(["--init", d, "--out", out, "--steps", "4", "--batch", "2", "--recall-steps", "2",
                "--recall", "0.5", "--eval-n", "1", "--eval-every", "1000", "--threads", "1"])
    with open(os.path.join(out, "train_log.json")) as f:
        stage = json.load(f).get("recall_stage", {})
    if stage.get("steps") != 2 or not all(0 <= stage.get(k, -1) <= 1 for k in ("gap 0", "gap 3")):
        errors.append("recall: the recall stage logged %s" % stage)


def weights_and_losses(*outs):
    """[weights bytes, losses] of each run directory in turn, flat, and the last one's log."""
    got = []
    for out in outs:
        with open(os.path.join(out, "model.safetensors"), "rb") as f:
            got.append(f.read())
        with open(os.path.join(out, "train_log.json")) as f:
            log = json.load(f)
        got.append(log["loss"])
    return got, log


def check_resume(d, tmp, errors):
    """A fine-tune of d stopped after its 3rd step (it stops at the 8th, where its batches are
    all used) and resumed ends with the bytes of the same fine-tune run without a stop."""
    run = ["--init", d, "--steps", "12", "--batch", "2", "--recall", "0.3", "--eval-n", "1",
           "--eval-every", "1000", "--threads", "1"]
    whole, parts = os.path.join(tmp, "whole"), os.path.join(tmp, "parts")
    train.main(run + ["--out", whole])
    train.main(run + ["--out", parts, "--stop-at", "3"])
    if not os.path.isfile(os.path.join(parts, "resume.pt")):
        errors.append("resume: a run stopped by --stop-at wrote no resume.pt")
        return
    try:
        train.main(run + ["--out", parts, "--resume", "--lr", "1e-3"])
        errors.append("resume: --resume took a run with another --lr")
    except SystemExit as e:
        if "--lr" not in str(e):
            errors.append("resume: --resume with another --lr exited with %r" % str(e))
    train.main(run + ["--out", parts, "--resume"])
    logs, log = weights_and_losses(whole, parts)
    if logs[0] != logs[2]:
        errors.append("resume: the stopped and resumed run's weights differ from the whole run's")
    if logs[1] != logs[3]:
        errors.append("resume: the losses differ: %s vs %s" % (logs[3], logs[1]))
    if log.get("resumed_after") != [8]:
        errors.append("resume: the log says it resumed after %s, not step 8"
                      % log.get("resumed_after"))
    if os.path.exists(os.path.join(parts, "resume.pt")):
        errors.append("resume: the finished run left its resume.pt")
    # a fine-tune's log and card carry the run it went on from
    if [p["args"]["out"] for p in log.get("parents", [])] != [d]:
        errors.append("resume: the fine-tune's log names %s as its parents, not %s"
                      % ([p["args"]["out"] for p in log.get("parents", [])], d))
    with open(os.path.join(parts, "README.md")) as f:
        card = f.read()
    if "2 runs, each from the one before" not in card or card.count("train/train.py --out") != 2:
        errors.append("resume: the fine-tune's model card does not give both runs' commands")


def check_resume_steps(d, tmp, errors):
    """A --schedule wsd run stopped before its decay goes on under a larger --steps and ends with
    the bytes of a run started with that --steps; where its steps made so far would change (the
    decay of the new count starts before the stop), the other --steps is refused."""
    run = ["--init", d, "--batch", "2", "--schedule", "wsd", "--decay", "0.25", "--curriculum",
           "0", "--eval-n", "1", "--eval-every", "1000", "--threads", "1"]
    whole, parts = os.path.join(tmp, "whole_steps"), os.path.join(tmp, "parts_steps")
    train.main(run + ["--out", whole, "--steps", "20"])
    train.main(run + ["--out", parts, "--steps", "12", "--stop-at", "3"])  # stops after step 8
    try:  # 10 steps decay from step 7.5 on: step 8 would have run at another learning rate
        train.main(run + ["--out", parts, "--steps", "10", "--resume"])
        errors.append("resume steps: --steps 10 was taken after step 8 of a run of 12")
    except SystemExit as e:
        if "--steps 10" not in str(e):
            errors.append("resume steps: the refusal of --steps 10 says %r" % str(e))
    train.main(run + ["--out", parts, "--steps", "20", "--resume"])
    got, log = weights_and_losses(whole, parts)
    if got[0] != got[2] or got[1] != got[3]:
        errors.append("resume steps: the run lengthened from 12 to 20 steps differs from a run "
                      "of 20")
    if log.get("steps_changed") != [{"after_step": 8, "from": 12, "to": 20}] \
            or log["args"]["steps"] != 20:
        errors.append("resume steps: the log does not record the change: %s, steps %s"
                      % (log.get("steps_changed"), log["args"]["steps"]))


def check_bf16_gate(tmp, errors):
    """--bf16 is refused on a CPU without AVX-512 (its bfloat16 products run 10x slower than
    float32 there), with the reason, and taken on one with AVX-512 or AVX512-BF16."""
    flags = os.path.join(tmp, "cpuinfo")
    with open(flags, "w") as f:
        f.write("processor\t: 0\nflags\t\t: fpu sse2 avx avx2 fma f16c\n\n"
                "processor\t: 1\nflags\t\t: fpu sse2 avx avx2 fma f16c avx512bw\n")
    if train.cpu_flags(flags) != {"fpu", "sse2", "avx", "avx2", "fma", "f16c"}:
        errors.append("bf16: cpu_flags read %s from the first processor" % train.cpu_flags(flags))
    if not train.slow_bf16(train.cpu_flags(flags)):
        errors.append("bf16: an AVX2-only CPU was not found slow for --bf16")
    for fast in ({"avx2", "avx512bw"}, {"avx2", "avx512_bf16"}, {"amx_bf16"}):
        if train.slow_bf16(fast):
            errors.append("bf16: a CPU with %s was found slow for --bf16" % sorted(fast))
    if train.cpu_flags(os.path.join(tmp, "absent")) != set():
        errors.append("bf16: cpu_flags of a missing file is not empty")
    # main() reads the flags through cpu_flags: given an AVX2-only CPU's, on any machine
    real = train.cpu_flags
    train.cpu_flags = lambda path="/proc/cpuinfo": real(flags)
    try:
        train.main(["--out", os.path.join(tmp, "bf16"), "--bf16", "--steps", "1", "--batch", "2",
                    "--eval-n", "1", "--threads", "1"])
        errors.append("bf16: --bf16 was taken on a CPU without AVX-512")
    except SystemExit as e:
        if "--bf16" not in str(e) or "AVX-512" not in str(e):
            errors.append("bf16: the refusal gives no reason: %r" % str(e))
    finally:
        train.cpu_flags = real


# the committed checkpoints (train/README.md) and the least share of held-out single-hop
# questions (4-6 documents each) each must answer right through the worker. They answer 3 and 4
# of these 20 (train/README.md: the models are not yet competent on several documents); the bar
# catches a serving path that breaks them (a random model answers none), not a quality goal.
COMMITTED = (("chunkgate-rag", 0.1), ("chunkgate-rag-block", 0.1))
ANSWERS = 20


def main():
    binary = os.environ.get("CHUNKGATE_WORKER_BIN")
    if not binary:
        P.skip("CHUNKGATE_WORKER_BIN is not set (ctest passes the built chunkgate-worker)")
    torch.set_num_threads(int(os.environ.get("OMP_NUM_THREADS", "2")))
    tmp = tempfile.mkdtemp(prefix="cg_train_recipe_")
    errors = []
    try:
        d = os.path.join(tmp, "model")
        train.main(["--out", d, "--steps", "3", "--batch", "4", "--eval-n", "1",
                    "--eval-every", "1000", "--threads", "1"])
        for f in ("config.json", "model.safetensors", "tokenizer.json", "tokenizer_config.json",
                  "generation_config.json", "README.md", "train_log.json", "loss.svg"):
            if not os.path.isfile(os.path.join(d, f)):
                errors.append("the recipe wrote no %s" % f)
        check_model(binary, d, tmp, errors)
        check_widen(d, errors)
        check_recall(d, tmp, errors)
        check_resume(d, tmp, errors)
        check_resume_steps(d, tmp, errors)
        check_bf16_gate(tmp, errors)
        for name, least in COMMITTED:
            cd = os.path.join(ROOT, "models", name)
            if not os.path.isfile(os.path.join(cd, "model.safetensors")):
                print("models/%s is not committed: not checked" % name)
                continue
            acc = check_model(binary, cd, tmp, errors, ANSWERS)
            print("models/%s: %d of %d held-out single-hop questions answered right through the "
                  "worker" % (name, round(acc * ANSWERS), ANSWERS))
            if acc < least:
                errors.append("models/%s answers %.0f%% of single-hop questions, under %.0f%%"
                              % (name, 100 * acc, 100 * least))
    finally:
        shutil.rmtree(tmp, ignore_errors=True)
    for e in errors:
        print("FAIL: " + e)
    print("%d passed, %d failed" % (0 if errors else 1, 1 if errors else 0))
    return 1 if errors else 0


if __name__ == "__main__":
    sys.exit(main())

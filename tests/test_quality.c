/* Check suite for the quality of reuse (DESIGN §15) on the generated tiny model, in process:
 * selective recompute (recompute_ratio) equals a plain causal forward at r = 1 and brings the
 * answer closer to it as r grows on a reordered RAG prompt; its token set is the union with
 * recompute_prefix_tokens; recompute_select "question" ranks by the question's attention (its
 * own token set, deterministic, r = 1 causal, deviation without a question); the forward's
 * ranking exit, captured queries and full-distribution rows are exact;
 * the quality probe compares a decoded request with a teacher-forced causal forward; the
 * scheduler's background queue yields to live work and can be stopped. The HTTP side (worker
 * options, canary metrics, chunk_cache.quality, gateway pass-through) is in
 * test_quality_http.c. */
#include <check.h>
#include <dirent.h>
#include <math.h>
#include <pthread.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <unistd.h>

#include "base/base.h"
#include "tests/harness/harness.h"
#include "tests/harness/prompt.h"
#include "worker/serve/engine.h"

#define ERRLEN 512
#define GREEDY 24
#define PROBE_N 16

static char model_dir[64];
static cg_model *model;

static const char *SYS = "You are a careful assistant. Answer from the documents only.";
static const char *DOC[4] = {
    "Document A. The harbour town of Lindqvist exported dried cod and tar throughout the "
    "eighteenth century. In 1761 a fire destroyed the customs house, and the merchants moved "
    "their ledgers to the church vault.",
    "Document B. Annual rainfall in the valley averaged 812 millimetres between 1990 and 2020. "
    "In 2024 the regional authority replaced the two oldest gauges, which had drifted.",
    "Document C. The cooperative's bylaws were amended in March: members may now vote by post, "
    "and the quorum fell from one half to one third. The amendment passed 214 to 9.",
    "Document D. To recalibrate the sensor, hold the mode button for five seconds until the LED "
    "blinks amber, place the unit on a level surface, and wait for a steady green light.",
};
static const char *QUESTION = "Question: what changed in 2024, and who voted?";

static const float RATIOS[] = {0.0f, 0.05f, 0.15f, 0.3f, 0.5f, 1.0f};

/* ---- helpers ---- */

static cg_engine *new_engine(void)
{
    cg_engine *e = NULL;
    ck_assert_int_eq(cg_engine_open(model, cg_engine_default_params(), &e), CG_OK);
    return e;
}

/* System, the documents in the order given, the question (NULL: none). */
static th_prompt make_req(const int *docs, size_t n_docs, const char *q)
{
    return th_prompt_of(SYS, DOC, docs, n_docs, q);
}

typedef struct opts {
    cg_mode mode;
    cg_engine_path path;
    uint32_t k;
    float r;
    cg_select sel; /* how r ranks the tokens (deviation when left out) */
} opts;

/* One assembly decoded greedily, with its last prompt logits and, when probed, its probe. */
typedef struct run {
    cg_assembly_info info;
    float *logits;
    int32_t toks[GREEDY];
    size_t n_toks;
    cg_probe *probe;
} run;

static void run_free(run *r)
{
    cg_assembly_info_free(&r->info);
    free(r->logits);
    cg_probe_free(&r->probe);
}

static run do_run(cg_engine *e, const th_prompt *rq, opts o, uint32_t probe)
{
    run r;
    memset(&r, 0, sizeof r);
    int vocab = cg_model_cfg(model)->vocab_size;
    r.logits = cg_malloc((size_t)vocab * sizeof(float));
    cg_assemble_req ar = {.segs = rq->segs,
                          .n_segs = rq->n,
                          .mode = o.mode,
                          .recompute_prefix_tokens = o.k,
                          .recompute_ratio = o.r,
                          .recompute_select = o.sel,
                          .reserve_tokens = -1,
                          .path = o.path,
                          .logits_out = r.logits};
    char err[ERRLEN];
    cg_status st = cg_engine_assemble(e, &ar, 1000, &r.info, err, sizeof err);
    ck_assert_msg(st == CG_OK, "assemble: %s (%s)", cg_status_name(st), err);
    cg_complete_req cr = {
        .assembly_id = r.info.id, .max_tokens = GREEDY, .probe = probe > 0, .probe_tokens = probe};
    cg_complete_result res;
    st = cg_engine_complete(e, &cr, 1000, &res, err, sizeof err);
    ck_assert_msg(st == CG_OK, "complete: %s (%s)", cg_status_name(st), err);
    ck_assert_uint_eq(res.recomputed_tokens, r.info.recomputed_tokens);
    r.n_toks = res.n_tokens;
    memcpy(r.toks, res.tokens, res.n_tokens * sizeof(int32_t));
    r.probe = res.probe;
    res.probe = NULL;
    cg_complete_result_free(&res);
    return r;
}

/* KL(p || q) of two logit rows, in nats. */
static double kl_logits(const float *p, const float *q, int n)
{
    double mp = -INFINITY, mq = -INFINITY, sp = 0, sq = 0, kl = 0;
    for (int i = 0; i < n; i++) {
        mp = fmax(mp, p[i]);
        mq = fmax(mq, q[i]);
    }
    for (int i = 0; i < n; i++) {
        sp += exp(p[i] - mp);
        sq += exp(q[i] - mq);
    }
    for (int i = 0; i < n; i++) {
        double lp = p[i] - mp - log(sp), lq = q[i] - mq - log(sq);
        kl += exp(lp) * (lp - lq);
    }
    return kl;
}

static uint32_t chunk_tokens(const run *r)
{
    uint32_t n = 0;
    for (size_t i = 0; i < r->info.n_segs; i++)
        if (r->info.segs[i].role == CG_ROLE_CHUNK) n += r->info.segs[i].n_tokens;
    return n;
}

static void assert_same_tokens(const run *a, const run *b, const char *what)
{
    ck_assert_msg(a->n_toks == b->n_toks, "%s: %zu vs %zu tokens", what, a->n_toks, b->n_toks);
    for (size_t i = 0; i < a->n_toks; i++)
        ck_assert_msg(a->toks[i] == b->toks[i], "%s: greedy token %zu differs", what, i);
}

static const opts CAUSAL = {CG_MODE_STRICT, CG_PATH_CAUSAL, 0, 0, 0};

/* ---- r = 1 is a plain causal forward ---- */

static void ratio_one(cg_mode mode, const char *q)
{
    cg_engine *e = new_engine();
    int vocab = cg_model_cfg(model)->vocab_size;
    int order1[] = {0, 1, 2, 3}, order2[] = {2, 0, 3, 1};
    th_prompt r1 = make_req(order1, 4, q), r2 = make_req(order2, 4, q);
    opts full = {mode, CG_PATH_CACHED, 0, 1.0f, 0};
    run miss = do_run(e, &r1, full, PROBE_N); /* chunks computed, stored */
    run ref1 = do_run(e, &r1, CAUSAL, 0);
    double kl = kl_logits(ref1.logits, miss.logits, vocab);
    ck_assert_msg(kl <= 1e-6, "r=1 on misses: KL %g > 1e-6", kl);
    assert_same_tokens(&miss, &ref1, "r=1 on misses");
    ck_assert_uint_eq(miss.info.recomputed_tokens, chunk_tokens(&miss));

    run hit = do_run(e, &r2, full, PROBE_N); /* reordered: every chunk a hit, remapped */
    for (size_t i = 1; i <= 4; i++)
        ck_assert_int_eq(hit.info.segs[i].hit, 1);
    run ref2 = do_run(e, &r2, CAUSAL, 0);
    kl = kl_logits(ref2.logits, hit.logits, vocab);
    ck_assert_msg(kl <= 1e-6, "r=1 on reordered hits: KL %g > 1e-6", kl);
    assert_same_tokens(&hit, &ref2, "r=1 on reordered hits");
    ck_assert_uint_eq(hit.info.recomputed_tokens, chunk_tokens(&hit));

    /* The probe sees the same: the reused path is the causal one. */
    cg_quality qa;
    ck_assert_int_eq(cg_engine_probe_compare(e, hit.probe, &qa), CG_OK);
    ck_assert_uint_eq(qa.tokens_compared, PROBE_N + 1);
    ck_assert_msg(qa.kl_max <= 1e-6, "probe at r=1: max KL %g", qa.kl_max);
    ck_assert_uint_eq(qa.top1_agreed, qa.tokens_compared);

    /* Without recompute the reordered prompt is not the causal one (the test can fail). */
    run plain = do_run(e, &r2, (opts){mode, CG_PATH_CACHED, 0, 0, 0}, 0);
    ck_assert_msg(kl_logits(ref2.logits, plain.logits, vocab) > 1e-4,
                  "r=0 is as close to causal as r=1: the comparison cannot discriminate");
    run *all[] = {&miss, &ref1, &hit, &ref2, &plain};
    for (size_t i = 0; i < CG_ARRAY_LEN(all); i++)
        run_free(all[i]);
    cg_engine_close(&e);
}

START_TEST(test_ratio_one_strict)
{
    ratio_one(CG_MODE_STRICT, QUESTION);
}
END_TEST

START_TEST(test_ratio_one_sys)
{
    ratio_one(CG_MODE_SYS, QUESTION);
}
END_TEST

/* A prompt ending in a chunk: its last token is recomputed too, and gives the logits. */
START_TEST(test_ratio_one_no_question)
{
    ratio_one(CG_MODE_STRICT, NULL);
}
END_TEST

/* ---- KL falls as r grows ---- */

START_TEST(test_kl_falls_with_ratio)
{
    const cg_mode modes[] = {CG_MODE_STRICT, CG_MODE_SYS};
    int vocab = cg_model_cfg(model)->vocab_size;
    for (size_t mi = 0; mi < CG_ARRAY_LEN(modes); mi++) {
        cg_engine *e = new_engine();
        int order1[] = {0, 1, 2, 3}, order2[] = {3, 1, 0, 2};
        th_prompt r1 = make_req(order1, 4, QUESTION), r2 = make_req(order2, 4, QUESTION);
        run warm = do_run(e, &r1, (opts){modes[mi], CG_PATH_CACHED, 0, 0, 0}, 0);
        run_free(&warm);
        run ref = do_run(e, &r2, CAUSAL, 0);
        double prev_end = INFINITY, prev_mean = INFINITY;
        uint32_t prev_n = 0;
        for (size_t i = 0; i < CG_ARRAY_LEN(RATIOS); i++) {
            run x = do_run(e, &r2, (opts){modes[mi], CG_PATH_CACHED, 0, RATIOS[i], 0}, PROBE_N);
            for (size_t s = 1; s <= 4; s++)
                ck_assert_int_eq(x.info.segs[s].hit, 1);
            double end = kl_logits(ref.logits, x.logits, vocab);
            cg_quality q;
            ck_assert_int_eq(cg_engine_probe_compare(e, x.probe, &q), CG_OK);
            /* the probe's first position is the prompt's end computed here */
            ck_assert_msg(fabs(q.kl_first - end) <= 1e-6 + 1e-3 * end,
                          "probe's prompt-end KL %g vs %g", q.kl_first, end);
            if (i == 0) {
                ck_assert_msg(end > 1e-4, "%s r=0: KL %g is not > 0", cg_mode_name(modes[mi]), end);
                ck_assert_uint_eq(x.info.recomputed_tokens, 0);
            }
            uint32_t want = (uint32_t)floor(RATIOS[i] * chunk_tokens(&x) + 0.5);
            ck_assert_uint_eq(x.info.recomputed_tokens, want);
            ck_assert_uint_ge(x.info.recomputed_tokens, prev_n);
            /* Nested token sets: more of the prompt sees its true context. Allow rounding. */
            ck_assert_msg(end <= prev_end * (1 + 1e-3) + 1e-7,
                          "%s: KL at the prompt's end rose from %g to %g at r=%g",
                          cg_mode_name(modes[mi]), prev_end, end, RATIOS[i]);
            ck_assert_msg(q.kl <= prev_mean * (1 + 1e-3) + 1e-7,
                          "%s: mean KL over %u positions rose from %g to %g at r=%g",
                          cg_mode_name(modes[mi]), q.tokens_compared, prev_mean, q.kl, RATIOS[i]);
            fprintf(stderr, "%s r=%.2f recomputed %u: KL end %.3e, mean %.3e, top-1 %u/%u\n",
                    cg_mode_name(modes[mi]), RATIOS[i], x.info.recomputed_tokens, end, q.kl,
                    q.top1_agreed, q.tokens_compared);
            prev_end = end;
            prev_mean = q.kl;
            prev_n = x.info.recomputed_tokens;
            run_free(&x);
        }
        ck_assert_msg(prev_end <= 1e-6, "r=1: KL %g", prev_end);
        run_free(&ref);
        cg_engine_close(&e);
    }
}
END_TEST

/* ---- one token set with recompute_prefix_tokens ---- */

START_TEST(test_union_with_prefix)
{
    cg_engine *e = new_engine();
    int vocab = cg_model_cfg(model)->vocab_size;
    int order1[] = {0, 1, 2}, order2[] = {2, 0, 1};
    th_prompt r1 = make_req(order1, 3, QUESTION), r2 = make_req(order2, 3, QUESTION);
    run warm = do_run(e, &r1, (opts){CG_MODE_STRICT, CG_PATH_CACHED, 0, 0, 0}, 0);
    run ref = do_run(e, &r2, CAUSAL, 0);
    const uint32_t k = 16;
    run pre = do_run(e, &r2, (opts){CG_MODE_STRICT, CG_PATH_CACHED, k, 0, 0}, 0);
    uint32_t n = chunk_tokens(&pre), nk = 0;
    for (size_t i = 1; i <= 3; i++)
        nk += CG_MIN(k, pre.info.segs[i].n_tokens);
    ck_assert_uint_eq(pre.info.recomputed_tokens, nk);
    run rat = do_run(e, &r2, (opts){CG_MODE_STRICT, CG_PATH_CACHED, 0, 0.15f, 0}, 0);
    uint32_t nr = (uint32_t)floor(0.15 * n + 0.5);
    ck_assert_uint_eq(rat.info.recomputed_tokens, nr);
    run both = do_run(e, &r2, (opts){CG_MODE_STRICT, CG_PATH_CACHED, k, 0.15f, 0}, 0);
    /* the union: at least each set, at most both, and strictly more than the ratio's alone
     * unless the ranking chose every prefix token */
    ck_assert_uint_ge(both.info.recomputed_tokens, CG_MAX(nk, nr));
    ck_assert_uint_le(both.info.recomputed_tokens, nk + nr);
    /* the union is a different token set from each part: other logits */
    ck_assert(kl_logits(both.logits, rat.logits, vocab) > 0 || both.info.recomputed_tokens == nr);
    /* k covering every chunk makes any ratio a plain causal forward */
    run all_k = do_run(e, &r2, (opts){CG_MODE_STRICT, CG_PATH_CACHED, 100000, 0.05f, 0}, 0);
    ck_assert_uint_eq(all_k.info.recomputed_tokens, n);
    double kl = kl_logits(ref.logits, all_k.logits, vocab);
    ck_assert_msg(kl <= 1e-6, "k >= chunk lengths with r=0.05: KL %g", kl);
    assert_same_tokens(&all_k, &ref, "k >= chunk lengths with r=0.05");
    /* r = 0 and k = 0 recompute nothing: the answer is the masked forward of DESIGN §5 */
    run none = do_run(e, &r2, (opts){CG_MODE_STRICT, CG_PATH_CACHED, 0, 0, 0}, 0);
    run masked = do_run(e, &r2, (opts){CG_MODE_STRICT, CG_PATH_REFERENCE, 0, 0, 0}, 0);
    ck_assert_uint_eq(none.info.recomputed_tokens, 0);
    double md = 0, mr = 0;
    for (int i = 0; i < vocab; i++) {
        md = fmax(md, fabs((double)none.logits[i] - masked.logits[i]));
        mr = fmax(mr, fabs((double)masked.logits[i]));
    }
    ck_assert_msg(md <= 1e-4 * mr, "r=0, k=0 differs from the masked forward by %g", md / mr);
    assert_same_tokens(&none, &masked, "r=0, k=0 vs the masked forward");
    run *runs[] = {&warm, &ref, &pre, &rat, &both, &all_k, &none, &masked};
    for (size_t i = 0; i < CG_ARRAY_LEN(runs); i++)
        run_free(runs[i]);
    cg_engine_close(&e);
}
END_TEST

/* ---- recompute_select "question" ---- */

START_TEST(test_select_question)
{
    cg_engine *e = new_engine();
    int vocab = cg_model_cfg(model)->vocab_size;
    int order1[] = {0, 1, 2, 3}, order2[] = {3, 1, 0, 2};
    th_prompt r1 = make_req(order1, 4, QUESTION), r2 = make_req(order2, 4, QUESTION);
    run warm = do_run(e, &r1, (opts){CG_MODE_STRICT, CG_PATH_CACHED, 0, 0, 0}, 0);
    run_free(&warm);
    run ref = do_run(e, &r2, CAUSAL, 0);
    int differs = 0;
    const float rs[] = {0.15f, 0.5f};
    for (size_t i = 0; i < CG_ARRAY_LEN(rs); i++) {
        run dev = do_run(e, &r2, (opts){CG_MODE_STRICT, CG_PATH_CACHED, 0, rs[i], 0}, 0);
        run q1 =
            do_run(e, &r2, (opts){CG_MODE_STRICT, CG_PATH_CACHED, 0, rs[i], CG_SELECT_QUESTION}, 0);
        run q2 =
            do_run(e, &r2, (opts){CG_MODE_STRICT, CG_PATH_CACHED, 0, rs[i], CG_SELECT_QUESTION}, 0);
        uint32_t want = (uint32_t)floor(rs[i] * chunk_tokens(&q1) + 0.5);
        ck_assert_uint_eq(q1.info.recomputed_tokens, want);
        ck_assert_uint_eq(dev.info.recomputed_tokens, want);
        ck_assert_int_eq(memcmp(q1.logits, q2.logits, (size_t)vocab * sizeof(float)), 0);
        assert_same_tokens(&q1, &q2, "question selection run twice");
        differs += kl_logits(dev.logits, q1.logits, vocab) > 0;
        fprintf(stderr, "r=%.2f: KL to causal, deviation %.3e, question %.3e\n", rs[i],
                kl_logits(ref.logits, dev.logits, vocab), kl_logits(ref.logits, q1.logits, vocab));
        run_free(&dev);
        run_free(&q1);
        run_free(&q2);
    }
    ck_assert_msg(differs, "the question's ranking chose the deviation's tokens at every r");
    /* r = 1 is every chunk token whatever the ranking: a plain causal forward */
    run all =
        do_run(e, &r2, (opts){CG_MODE_STRICT, CG_PATH_CACHED, 0, 1.0f, CG_SELECT_QUESTION}, 0);
    double kl = kl_logits(ref.logits, all.logits, vocab);
    ck_assert_msg(kl <= 1e-6, "question, r=1: KL %g", kl);
    /* a prompt that ends in a chunk has no question to rank by: the deviation ranking */
    th_prompt nq = make_req(order2, 4, NULL);
    run dn = do_run(e, &nq, (opts){CG_MODE_STRICT, CG_PATH_CACHED, 0, 0.3f, 0}, 0);
    run qn = do_run(e, &nq, (opts){CG_MODE_STRICT, CG_PATH_CACHED, 0, 0.3f, CG_SELECT_QUESTION}, 0);
    ck_assert_int_eq(memcmp(dn.logits, qn.logits, (size_t)vocab * sizeof(float)), 0);
    run *runs[] = {&ref, &all, &dn, &qn};
    for (size_t i = 0; i < CG_ARRAY_LEN(runs); i++)
        run_free(runs[i]);
    cg_engine_close(&e);
}
END_TEST

START_TEST(test_ratio_refused)
{
    cg_engine *e = new_engine();
    int d[] = {0};
    th_prompt r = make_req(d, 1, QUESTION);
    const float bad[] = {-0.01f, 1.01f, NAN};
    for (size_t i = 0; i < CG_ARRAY_LEN(bad); i++) {
        cg_assemble_req ar = {
            .segs = r.segs, .n_segs = r.n, .recompute_ratio = bad[i], .reserve_tokens = -1};
        cg_assembly_info info;
        char err[ERRLEN];
        ck_assert_int_eq(cg_engine_assemble(e, &ar, 1000, &info, err, sizeof err), CG_E_VALUE);
        ck_assert_ptr_nonnull(strstr(err, "recompute_ratio"));
    }
    cg_assemble_req ar = {
        .segs = r.segs, .n_segs = r.n, .recompute_select = (cg_select)7, .reserve_tokens = -1};
    cg_assembly_info info;
    char err[ERRLEN];
    ck_assert_int_eq(cg_engine_assemble(e, &ar, 1000, &info, err, sizeof err), CG_E_VALUE);
    ck_assert_ptr_nonnull(strstr(err, "recompute_select"));
    cg_engine_close(&e);
}
END_TEST

/* ---- the forward's ranking exit and full-distribution rows ---- */

/* The prefill of toks[0, n) into kv under one attention span; the caller adds what it reads
 * back. */
static cg_fwd_seq prefill_of(cg_kv *kv, const int32_t *toks, uint32_t n, const cg_attn_span *span)
{
    return (cg_fwd_seq){.kv = kv, .tokens = toks, .n = n, .spans = span, .n_spans = 1};
}

START_TEST(test_forward_stop_and_rows)
{
    const cg_model_config *c = cg_model_cfg(model);
    const size_t hd = (size_t)c->head_dim, kvd = (size_t)c->n_kv_heads * hd;
    const size_t V = (size_t)c->vocab_size;
    int32_t toks[300];
    uint32_t n = th_tok_into(model, DOC[0], strlen(DOC[0]), 1, toks);
    ck_assert_uint_gt(n, 100);
    cg_kv *a = cg_kv_new(model, n), *b = cg_kv_new(model, n);
    cg_attn_span span = {0, n, 0, 0};
    const uint32_t from = n - 20;
    float *rows = cg_malloc(20 * V * sizeof(float)), *last = cg_malloc(V * sizeof(float));
    cg_fwd_seq q = prefill_of(a, toks, n, &span);
    q.logits = last;
    q.row_logits = rows;
    q.row_logits_from = from;
    ck_assert_int_eq(cg_model_forward_batch(model, &q, 1, CG_FWD_PREFILL, NULL), CG_OK);
    /* the last full row is the last row's logits */
    ck_assert_int_eq(memcmp(rows + 19 * V, last, V * sizeof(float)), 0);
    /* row from - 1 + i predicts token from + i: a causal forward of the first from + i + 1
     * tokens gives the same logits */
    float *ref = cg_malloc(V * sizeof(float));
    cg_attn_span sp2 = {0, from + 5, 0, 0};
    ck_assert_int_eq(cg_model_forward(model, b, toks, from + 5, 0, 0, &sp2, 1, ref), CG_OK);
    double md = 0, mr = 0;
    for (size_t i = 0; i < V; i++) {
        md = fmax(md, fabs((double)rows[4 * V + i] - ref[i]));
        mr = fmax(mr, fabs((double)ref[i]));
    }
    ck_assert_msg(md <= 1e-4 * mr, "row logits differ by %g (max %g)", md, mr);

    /* The ranking exit, cut in pieces the way the scheduler cuts it: layer 1's K/V equal
     * what the full forward wrote there, and layer 0 is written. */
    float *sk = cg_malloc(n * kvd * sizeof(float)), *sv = cg_malloc(n * kvd * sizeof(float));
    cg_kv *z = cg_kv_new(model, n);
    cg_fwd_seq s = prefill_of(z, toks, n, &span);
    s.stop_layer = 1;
    s.stop_k = sk;
    s.stop_v = sv;
    cg_attn_span piece_spans[1];
    for (uint32_t r0 = 0; r0 < n; r0 += 37) {
        cg_fwd_seq piece = cg_fwd_seq_slice(&s, r0, CG_MIN(37, n - r0), piece_spans);
        ck_assert_int_eq(cg_model_forward_batch(model, &piece, 1, CG_FWD_PREFILL, NULL), CG_OK);
    }
    md = mr = 0;
    for (int h = 0; h < c->n_kv_heads; h++)
        for (uint32_t t = 0; t < n; t++)
            for (size_t i = 0; i < hd; i++) {
                double wk = cg_kv_k(a, 1, h)[t * hd + i], wv = cg_kv_v(a, 1, h)[t * hd + i];
                md = fmax(md, fabs(sk[t * kvd + h * hd + i] - wk));
                md = fmax(md, fabs(sv[t * kvd + h * hd + i] - wv));
                mr = fmax(mr, fmax(fabs(wk), fabs(wv)));
                md = fmax(md, fabs(cg_kv_k(z, 0, h)[t * hd + i] - cg_kv_k(a, 0, h)[t * hd + i]));
            }
    ck_assert_msg(md <= 1e-4 * mr, "ranking exit K/V differ by %g (max %g)", md, mr);
    /* capture_q: every layer's queries, the same when the scheduler cuts the rows in pieces as
     * in one call; a token's layer-0 query has the same norm per head wherever it stands
     * (RoPE turns it, and nothing before layer 0's attention depends on other tokens) */
    const size_t QD = (size_t)c->n_heads * hd, NL = (size_t)c->n_layers;
    float *qa = cg_calloc(n * NL * QD, sizeof(float)), *qb = cg_calloc(n * NL * QD, sizeof(float));
    cg_kv *y1 = cg_kv_new(model, n), *y2 = cg_kv_new(model, n);
    cg_fwd_seq cq = prefill_of(y1, toks, n, &span);
    cq.capture_q = qa;
    ck_assert_int_eq(cg_model_forward_batch(model, &cq, 1, CG_FWD_PREFILL, NULL), CG_OK);
    cq = prefill_of(y2, toks, n, &span);
    cq.capture_q = qb;
    for (uint32_t r0 = 0; r0 < n; r0 += 37) {
        cg_fwd_seq piece = cg_fwd_seq_slice(&cq, r0, CG_MIN(37, n - r0), piece_spans);
        ck_assert_int_eq(cg_model_forward_batch(model, &piece, 1, CG_FWD_PREFILL, NULL), CG_OK);
    }
    md = mr = 0;
    for (size_t i = 0; i < n * NL * QD; i++) {
        md = fmax(md, fabs((double)qa[i] - qb[i]));
        mr = fmax(mr, fabs((double)qa[i]));
    }
    ck_assert_msg(mr > 0 && md <= 1e-4 * mr, "captured queries differ by %g (max %g)", md, mr);
    int pairs = 0;
    for (uint32_t t1 = 1; t1 < n && pairs < 8; t1++)
        for (uint32_t t2 = t1 + 1; t2 < n && pairs < 8; t2++) {
            if (toks[t1] != toks[t2]) continue;
            pairs++;
            for (int h = 0; h < c->n_heads; h++) {
                double n1 = 0, n2 = 0, dd = 0;
                for (size_t i = 0; i < hd; i++) {
                    double x1 = qa[(size_t)t1 * NL * QD + (size_t)h * hd + i];
                    double x2 = qa[(size_t)t2 * NL * QD + (size_t)h * hd + i];
                    n1 += x1 * x1, n2 += x2 * x2, dd += (x1 - x2) * (x1 - x2);
                }
                ck_assert_msg(fabs(sqrt(n1) - sqrt(n2)) <= 1e-4 * sqrt(n1),
                              "token %d: head %d's query norm %g at %u, %g at %u", toks[t1], h,
                              sqrt(n1), t1, sqrt(n2), t2);
                ck_assert_msg(dd > 0, "the query at %u is not rotated to its position", t2);
            }
        }
    ck_assert_int_gt(pairs, 0);
    cg_kv_free(&y1);
    cg_kv_free(&y2);
    free(qa);
    free(qb);
    /* a stop call holds one sequence; the layer must exist */
    cg_fwd_seq two[2] = {s, s};
    ck_assert_int_eq(cg_model_forward_batch(model, two, 2, CG_FWD_PREFILL, NULL), CG_E_VALUE);
    s.stop_layer = c->n_layers;
    ck_assert_int_eq(cg_model_forward_batch(model, &s, 1, CG_FWD_PREFILL, NULL), CG_E_VALUE);
    cg_kv_free(&a);
    cg_kv_free(&b);
    cg_kv_free(&z);
    free(rows);
    free(last);
    free(ref);
    free(sk);
    free(sv);
}
END_TEST

/* An interrupted forward stops before its next layer; run again, it gives what an
 * uninterrupted one gives. */
START_TEST(test_forward_interrupt)
{
    const cg_model_config *c = cg_model_cfg(model);
    const size_t V = (size_t)c->vocab_size;
    int32_t toks[300];
    uint32_t n = th_tok_into(model, DOC[1], strlen(DOC[1]), 1, toks);
    cg_kv *a = cg_kv_new(model, n), *b = cg_kv_new(model, n);
    float *la = cg_malloc(V * sizeof(float)), *lb = cg_malloc(V * sizeof(float));
    cg_attn_span span = {0, n, 0, 0};
    int flag = 1;
    cg_fwd_seq q = prefill_of(a, toks, n, &span);
    q.logits = la;
    q.interrupt = &flag;
    memset(la, 0, V * sizeof(float));
    ck_assert_int_eq(cg_model_forward_batch(model, &q, 1, CG_FWD_PREFILL, NULL), CG_E_UNAVAILABLE);
    for (size_t i = 0; i < V; i++)
        ck_assert(la[i] == 0); /* no logits: it stopped */
    flag = 0;
    ck_assert_int_eq(cg_model_forward_batch(model, &q, 1, CG_FWD_PREFILL, NULL), CG_OK);
    ck_assert_int_eq(cg_model_forward(model, b, toks, n, 0, 0, &span, 1, lb), CG_OK);
    ck_assert_int_eq(memcmp(la, lb, V * sizeof(float)), 0);
    cg_kv_free(&a);
    cg_kv_free(&b);
    free(la);
    free(lb);
}
END_TEST

/* ---- probes ---- */

START_TEST(test_probe_capture)
{
    cg_engine *e = new_engine();
    int vocab = cg_model_cfg(model)->vocab_size;
    int d[] = {1, 0};
    th_prompt r = make_req(d, 2, QUESTION);
    /* No probe unless asked, none for a plain prompt. */
    run x = do_run(e, &r, (opts){CG_MODE_STRICT, CG_PATH_CACHED, 0, 0, 0}, 0);
    ck_assert_ptr_null(x.probe);
    run_free(&x);
    char err[ERRLEN];
    cg_complete_req plain = {
        .prompt = "hello there", .prompt_len = 11, .max_tokens = 4, .probe = 1, .probe_tokens = 4};
    cg_complete_result res;
    ck_assert_int_eq(cg_engine_complete(e, &plain, 1000, &res, err, sizeof err), CG_OK);
    ck_assert_ptr_null(res.probe);
    cg_complete_result_free(&res);

    /* max_tokens 0: the prompt's end alone; its logits are the assembly's. */
    float *lg = cg_malloc((size_t)vocab * sizeof(float));
    cg_assemble_req ar = {.segs = r.segs, .n_segs = r.n, .reserve_tokens = -1, .logits_out = lg};
    cg_assembly_info info;
    ck_assert_int_eq(cg_engine_assemble(e, &ar, 1000, &info, err, sizeof err), CG_OK);
    cg_complete_req cr = {.assembly_id = info.id, .max_tokens = 0, .probe = 1, .probe_tokens = 8};
    ck_assert_int_eq(cg_engine_complete(e, &cr, 1000, &res, err, sizeof err), CG_OK);
    ck_assert_ptr_nonnull(res.probe);
    ck_assert_uint_eq(res.probe->n_rows, 1);
    ck_assert_uint_eq(res.probe->n_prompt, info.n_tokens);
    ck_assert_int_eq(memcmp(res.probe->logits, lg, (size_t)vocab * sizeof(float)), 0);
    cg_quality q;
    ck_assert_int_eq(cg_engine_probe_compare(e, res.probe, &q), CG_OK);
    ck_assert_uint_eq(q.tokens_compared, 1);
    ck_assert(q.kl > 0 && q.kl == q.kl_first && q.kl == q.kl_max);
    cg_complete_result_free(&res);
    cg_assembly_info_free(&info);

    /* Fewer tokens than asked: the rows follow what was sampled (max_tokens 5 -> 5 rows:
     * the prompt's end and after 4 generated tokens). The labels come from the assembly. */
    ar.mode = CG_MODE_SYS;
    ar.recompute_ratio = 0.3f;
    ar.recompute_prefix_tokens = 4;
    ck_assert_int_eq(cg_engine_assemble(e, &ar, 1000, &info, err, sizeof err), CG_OK);
    cg_complete_req c5 = {.assembly_id = info.id, .max_tokens = 5, .probe = 1, .probe_tokens = 16};
    ck_assert_int_eq(cg_engine_complete(e, &c5, 1000, &res, err, sizeof err), CG_OK);
    ck_assert_uint_eq(res.n_tokens, 5);
    ck_assert_uint_eq(res.probe->n_rows, 5);
    ck_assert_int_eq(
        memcmp(res.probe->tokens + res.probe->n_prompt, res.tokens, 4 * sizeof(int32_t)), 0);
    ck_assert_int_eq(res.probe->mode, CG_MODE_SYS);
    ck_assert(res.probe->recompute_ratio == 0.3f);
    ck_assert_uint_eq(res.probe->recompute_prefix_tokens, 4);
    ck_assert_uint_eq(res.probe->recomputed_tokens, info.recomputed_tokens);
    ck_assert_int_eq(cg_engine_probe_compare(e, res.probe, &q), CG_OK);
    ck_assert_uint_eq(q.tokens_compared, 5);
    ck_assert_uint_le(q.top1_agreed, 5);
    cg_complete_result_free(&res);
    cg_assembly_info_free(&info);
    free(lg);
    cg_engine_close(&e);
}
END_TEST

/* ---- the background queue ---- */

typedef struct bg {
    cg_engine *e;
    cg_probe *p;
    cg_status st;
    int done;
    cg_quality q;
} bg;

static void *bg_main(void *arg)
{
    bg *b = arg;
    b->st = cg_engine_probe_compare(b->e, b->p, &b->q);
    __atomic_store_n(&b->done, 1, __ATOMIC_RELEASE);
    return NULL;
}

typedef struct fg {
    cg_engine *e;
    const char *id;
    cg_status st;
    size_t n;
} fg;

static int stop_after(void *ud, const cg_tok_rec *rec, const char *b, size_t n)
{
    (void)rec, (void)b, (void)n;
    return __atomic_load_n((int *)ud, __ATOMIC_ACQUIRE);
}

static int stop_flag;

static void *fg_main(void *arg)
{
    fg *f = arg;
    char err[ERRLEN];
    cg_complete_req cr = {.prompt = "a long answer",
                          .prompt_len = 13,
                          .max_tokens = 30000,
                          .on_token = stop_after,
                          .ud = &stop_flag};
    cg_complete_result res;
    f->st = cg_engine_complete(f->e, &cr, 1000, &res, err, sizeof err);
    f->n = res.n_tokens;
    if (f->st == CG_OK) cg_complete_result_free(&res);
    return NULL;
}

START_TEST(test_background_yields)
{
    cg_engine *e = new_engine();
    int d[] = {0, 1, 2, 3};
    th_prompt r = make_req(d, 4, QUESTION);
    run x = do_run(e, &r, (opts){CG_MODE_STRICT, CG_PATH_CACHED, 0, 0, 0}, PROBE_N);
    ck_assert_ptr_nonnull(x.probe);

    /* A sequence decodes; the comparison waits behind it, without running a piece. */
    stop_flag = 0;
    fg f = {.e = e};
    pthread_t ft, bt;
    ck_assert_int_eq(pthread_create(&ft, NULL, fg_main, &f), 0);
    for (int i = 0; i < 2000 && cg_engine_sched_stats(e).running == 0; i++)
        usleep(1000);
    ck_assert_uint_eq(cg_engine_sched_stats(e).running, 1);
    bg b = {.e = e, .p = x.probe};
    ck_assert_int_eq(pthread_create(&bt, NULL, bg_main, &b), 0);
    for (int i = 0; i < 2000 && cg_engine_sched_stats(e).idle_waiting == 0; i++)
        usleep(1000);
    usleep(200 * 1000);
    cg_sched_stats st = cg_engine_sched_stats(e);
    ck_assert_uint_eq(st.idle_waiting, 1);
    ck_assert_uint_eq(st.running, 1); /* still decoding: the check above meant something */
    ck_assert_uint_eq(st.idle_pieces, 0);
    ck_assert(!__atomic_load_n(&b.done, __ATOMIC_ACQUIRE));
    /* The decode ends: the background job runs to completion. */
    __atomic_store_n(&stop_flag, 1, __ATOMIC_RELEASE);
    pthread_join(ft, NULL);
    ck_assert_int_eq(f.st, CG_OK);
    pthread_join(bt, NULL);
    ck_assert_int_eq(b.st, CG_OK);
    ck_assert_uint_eq(b.q.tokens_compared, PROBE_N + 1);
    st = cg_engine_sched_stats(e);
    ck_assert_uint_gt(st.idle_pieces, 1);
    ck_assert_uint_eq(st.idle_waiting, 0);

    /* An admitted request holds it back too, even while it computes nothing (between its
     * phases); a piece running when it is admitted stops at the next layer. */
    ck_assert_int_eq(cg_engine_admit(e, 0), CG_OK);
    b.done = 0;
    ck_assert_int_eq(pthread_create(&bt, NULL, bg_main, &b), 0);
    for (int i = 0; i < 2000 && cg_engine_sched_stats(e).idle_waiting == 0; i++)
        usleep(1000);
    uint64_t pieces = cg_engine_sched_stats(e).idle_pieces;
    usleep(200 * 1000);
    ck_assert_uint_eq(cg_engine_sched_stats(e).idle_pieces, pieces);
    ck_assert(!__atomic_load_n(&b.done, __ATOMIC_ACQUIRE));
    cg_engine_leave(e);
    for (int i = 0; i < 200 && cg_engine_sched_stats(e).idle_pieces < pieces + 3; i++)
        usleep(1000);
    ck_assert_int_eq(cg_engine_admit(e, 0), CG_OK); /* mid-job */
    usleep(50 * 1000);
    pieces = cg_engine_sched_stats(e).idle_pieces;
    usleep(200 * 1000);
    ck_assert_uint_le(cg_engine_sched_stats(e).idle_pieces, pieces + 1);
    cg_engine_leave(e);
    pthread_join(bt, NULL);
    ck_assert_int_eq(b.st, CG_OK);
    ck_assert_uint_eq(b.q.tokens_compared, PROBE_N + 1);

    /* Stopped: queued work fails at once, new work too. */
    stop_flag = 0;
    ck_assert_int_eq(pthread_create(&ft, NULL, fg_main, &f), 0);
    for (int i = 0; i < 2000 && cg_engine_sched_stats(e).running == 0; i++)
        usleep(1000);
    b.done = 0;
    ck_assert_int_eq(pthread_create(&bt, NULL, bg_main, &b), 0);
    for (int i = 0; i < 2000 && cg_engine_sched_stats(e).idle_waiting == 0; i++)
        usleep(1000);
    cg_engine_stop_background(e);
    pthread_join(bt, NULL);
    ck_assert_int_eq(b.st, CG_E_UNAVAILABLE);
    ck_assert_uint_eq(cg_engine_sched_stats(e).running, 1); /* failed while decoding */
    cg_quality q;
    ck_assert_int_eq(cg_engine_probe_compare(e, x.probe, &q), CG_E_UNAVAILABLE);
    __atomic_store_n(&stop_flag, 1, __ATOMIC_RELEASE);
    pthread_join(ft, NULL);
    run_free(&x);
    cg_engine_close(&e);
}
END_TEST

int main(int argc, char **argv)
{
    (void)argc;
    th_omp_passive(argv);
    cg_log_init("test_quality", CG_LOG_WARN);
    snprintf(model_dir, sizeof model_dir, "/tmp/cg_test_quality_XXXXXX");
    if (!mkdtemp(model_dir)) abort();
    char err[ERRLEN];
    cg_model_gen_params gp = cg_model_gen_default_params();
    gp.seed = 7;
    if (cg_model_generate(model_dir, gp, err, sizeof err) != CG_OK ||
        cg_model_open(model_dir, &model, err, sizeof err) != CG_OK) {
        fprintf(stderr, "model: %s\n", err);
        return EXIT_FAILURE;
    }
    int failed =
        th_run_tests("quality", "recompute", 300,
                     TH_TESTS(test_ratio_one_strict, test_ratio_one_sys, test_ratio_one_no_question,
                              test_kl_falls_with_ratio, test_union_with_prefix,
                              test_select_question, test_ratio_refused, test_forward_stop_and_rows,
                              test_forward_interrupt, test_probe_capture, test_background_yields));
    cg_model_close(&model);
    th_rmrf(model_dir);
    return failed ? EXIT_FAILURE : EXIT_SUCCESS;
}

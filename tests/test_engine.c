/* Check suite for the assembly engine: the fidelity proofs of issue 3. The cached path (chunks
 * computed alone, stored, remapped to new offsets) must equal one forward over the whole
 * prompt under the same mask; sys mode must equal its two-stage computation without the
 * cache; full prefix recompute must equal a plain causal forward; a small pool must not change
 * answers nor evict chunks that live assemblies use; keys must match texts. Both RoPE styles.
 * The disk tier: spills and restores change no bit of the answers, a corrupt record is a miss,
 * a flushed tier serves every chunk after a reopen; adopted KV decodes like its source. */
#include <check.h>
#include <dirent.h>
#include <fcntl.h>
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <unistd.h>

#include "worker/serve/engine.h"
#include "worker/serve/live.h"
#include "worker/store/tiers.h"
#include "base/base.h"
#include "tests/harness/harness.h"
#include "tests/harness/prompt.h"

#define ERRLEN 512
#define GREEDY 32

static char *dir_half, *dir_inter;
static cg_model *m_half, *m_inter;

/* Documents of a few hundred bytes, so the suite stays fast on two cores. */
static const char *SYS1 = "You are a careful assistant. Answer from the documents only, and say "
                          "which document supports each claim.";
static const char *SYS2 = "System: terse mode. Cite sources.";
static const char *DOC[5] = {
    "Document A. The harbour town of Lindqvist exported dried cod and tar throughout the "
    "eighteenth century. In 1761 a fire destroyed the customs house, and the merchants moved "
    "their ledgers to the church vault, where they were found again in 1902 by a schoolteacher "
    "cataloguing the parish archive.",
    "Document B. Annual rainfall in the valley averaged 812 millimetres between 1990 and 2020. "
    "The wettest month is October. In 2024 the regional authority replaced the two oldest "
    "gauges, which had drifted by up to four percent, and revised the published series.",
    "Document C. The cooperative's bylaws were amended in March: members may now vote by post, "
    "the quorum fell from one half to one third, and the treasurer's term was extended from two "
    "years to three. The amendment passed with 214 votes in favour and 9 against.",
    "Document D. To recalibrate the sensor, hold the mode button for five seconds until the LED "
    "blinks amber, place the unit on a level surface, and wait for a steady green light. Do not "
    "move the unit during the ninety seconds of calibration or the offsets will be discarded.",
    "Document E. The 2023 survey counted 1,140 breeding pairs of terns on the outer islands, up "
    "from 870 in 2018. Observers attribute the rise to the fox eradication programme and to the "
    "closure of the northern beach during the nesting season from May to July.",
};
static const char *Q1 = "Question: what changed in 2024?";
static const char *Q2 = "Which document mentions a vote, and what was the result?";

/* ---- helpers ---- */

static cg_model *make_model(cg_rope_style style, char **dir_out)
{
    char *d = th_mkdtemp("test_engine");
    char err[ERRLEN];
    cg_model_gen_params gp = cg_model_gen_default_params();
    gp.rope_style = style;
    gp.seed = 7;
    cg_model *m = NULL;
    if (cg_model_generate(d, gp, err, sizeof err) != CG_OK ||
        cg_model_open(d, &m, err, sizeof err) != CG_OK) {
        fprintf(stderr, "model: %s\n", err);
        abort();
    }
    *dir_out = d;
    return m;
}

static cg_engine *new_engine(cg_model *m, size_t pool_bytes)
{
    cg_engine_params p = cg_engine_default_params();
    if (pool_bytes) p.pool_bytes = pool_bytes;
    cg_engine *e = NULL;
    ck_assert_int_eq(cg_engine_open(m, p, &e), CG_OK);
    return e;
}

/* The bytes of one pool block (the default 16 tokens) of m's KV. */
static size_t block_bytes(const cg_model *m)
{
    const cg_model_config *c = cg_model_cfg(m);
    cg_pool_params pp = cg_pool_default_params();
    pp.n_layers = c->n_layers;
    pp.n_kv_heads = c->n_kv_heads;
    pp.head_dim = c->head_dim;
    return cg_pool_block_bytes(&pp);
}

/* Segments: system (optional, NULL = none), chunks by document index, question. */
static th_prompt make_req(const char *sys, const int *docs, size_t n_docs, const char *q)
{
    return th_prompt_of(sys, DOC, docs, n_docs, q);
}

/* The result of one assembly decoded greedily. */
typedef struct run {
    cg_assembly_info info;
    float *logits;
    int32_t toks[GREEDY];
    size_t n_toks;
} run;

static void run_free(run *r)
{
    cg_assembly_info_free(&r->info);
    free(r->logits);
}

static void runs_free(run *const *rs, size_t n)
{
    for (size_t i = 0; i < n; i++)
        run_free(rs[i]);
}

static uint64_t clock_ms = 1000; /* the engine's "now": tests control time */

static run do_run(cg_engine *e, const th_prompt *rq, cg_mode mode, cg_engine_path path, uint32_t k)
{
    run r;
    memset(&r, 0, sizeof r);
    int vocab = cg_model_cfg(cg_engine_model(e))->vocab_size;
    r.logits = cg_malloc((size_t)vocab * sizeof(float));
    cg_assemble_req ar = {.segs = rq->segs,
                          .n_segs = rq->n,
                          .mode = mode,
                          .recompute_prefix_tokens = k,
                          .reserve_tokens = -1,
                          .path = path,
                          .logits_out = r.logits};
    char err[ERRLEN];
    cg_status st = cg_engine_assemble(e, &ar, clock_ms, &r.info, err, sizeof err);
    ck_assert_msg(st == CG_OK, "assemble: %s (%s)", cg_status_name(st), err);
    cg_complete_req cr = {.assembly_id = r.info.id, .max_tokens = GREEDY};
    cg_complete_result res;
    st = cg_engine_complete(e, &cr, clock_ms, &res, err, sizeof err);
    ck_assert_msg(st == CG_OK, "complete: %s (%s)", cg_status_name(st), err);
    ck_assert_uint_eq(res.prompt_tokens, r.info.n_tokens);
    ck_assert_uint_eq(res.cached_tokens, r.info.cached_tokens);
    r.n_toks = res.n_tokens;
    memcpy(r.toks, res.tokens, res.n_tokens * sizeof(int32_t));
    cg_complete_result_free(&res);
    return r;
}

/* max |a - b| relative to max |ref|. */
static double rel_diff(const float *a, const float *ref, int n)
{
    double md = 0, mr = 0;
    for (int i = 0; i < n; i++) {
        md = fmax(md, fabs((double)a[i] - ref[i]));
        mr = fmax(mr, fabs((double)ref[i]));
    }
    return md / mr;
}

/* Asserts logits within 1e-4 * max|logit| and the same greedy tokens. */
static void assert_same(cg_engine *e, const run *got, const run *ref, const char *what)
{
    int vocab = cg_model_cfg(cg_engine_model(e))->vocab_size;
    double d = rel_diff(got->logits, ref->logits, vocab);
    ck_assert_msg(d <= 1e-4, "%s: max|dlogit| = %g * max|logit| > 1e-4", what, d);
    ck_assert_msg(got->n_toks == ref->n_toks, "%s: %zu vs %zu greedy tokens", what, got->n_toks,
                  ref->n_toks);
    for (size_t i = 0; i < ref->n_toks; i++)
        ck_assert_msg(got->toks[i] == ref->toks[i], "%s: greedy token %zu differs: %d vs %d", what,
                      i, got->toks[i], ref->toks[i]);
}

static uint32_t chunk_tokens(const run *r)
{
    uint32_t n = 0;
    for (size_t i = 0; i < r->info.n_segs; i++)
        if (r->info.segs[i].role == CG_ROLE_CHUNK) n += r->info.segs[i].n_tokens;
    return n;
}

/* (1) strict: cached path vs one reference forward under the same mask, on misses and then
 * on hits at new offsets. */
static void strict_fidelity(cg_model *m)
{
    cg_engine *e = new_engine(m, 0);
    int d1[] = {0, 1, 2};
    th_prompt r1 = make_req(SYS1, d1, 3, Q1);
    run a = do_run(e, &r1, CG_MODE_STRICT, CG_PATH_CACHED, 0);
    for (size_t i = 0; i < a.info.n_segs; i++)
        ck_assert_int_eq(a.info.segs[i].hit, 0);
    run ref = do_run(e, &r1, CG_MODE_STRICT, CG_PATH_REFERENCE, 0);
    assert_same(e, &a, &ref, "strict misses");
    ck_assert_int_ge(ref.n_toks, GREEDY / 2); /* greedy decoding says something */

    /* The mask matters: a plain causal forward gives other logits, so the comparison above
     * could have failed. */
    run causal = do_run(e, &r1, CG_MODE_STRICT, CG_PATH_CAUSAL, 0);
    int vocab = cg_model_cfg(m)->vocab_size;
    ck_assert_msg(rel_diff(causal.logits, ref.logits, vocab) > 1e-3,
                  "causal and strict logits are too close for the test to discriminate");

    /* Second request: another system prompt (another length) and the chunks reordered, so
     * every chunk is a hit at a new offset. */
    int d2[] = {2, 0, 1};
    th_prompt r2 = make_req(SYS2, d2, 3, Q2);
    run b = do_run(e, &r2, CG_MODE_STRICT, CG_PATH_CACHED, 0);
    for (size_t i = 1; i < 4; i++) {
        ck_assert_int_eq(b.info.segs[i].hit, 1);
        ck_assert_int_eq(b.info.segs[i].tier, CG_TIER_RAM);
    }
    ck_assert_int_eq(b.info.segs[0].hit, 0);                         /* new system prompt */
    ck_assert_uint_ne(b.info.segs[2].offset, a.info.segs[1].offset); /* doc A moved */
    ck_assert_uint_eq(b.info.cached_tokens, chunk_tokens(&b));
    run ref2 = do_run(e, &r2, CG_MODE_STRICT, CG_PATH_REFERENCE, 0);
    assert_same(e, &b, &ref2, "strict hits at new offsets");
    runs_free((run *[]){&a, &ref, &causal, &b, &ref2}, 5);
    ck_assert_int_eq(cg_pool_check(cg_engine_pool(e)), CG_OK);
    cg_engine_close(&e);
}

START_TEST(test_strict_fidelity)
{
    strict_fidelity(m_half);
}
END_TEST

/* (7) the interleaved pairing passes (1) too. */
START_TEST(test_strict_fidelity_interleaved)
{
    strict_fidelity(m_inter);
}
END_TEST

/* The cached path on rq in sys mode, run twice, against one run of path other: both runs give
 * its answer, and the second hits the system segment and each of the n_chunks chunks. */
static void sys_twice(cg_engine *e, const th_prompt *rq, size_t n_chunks, cg_engine_path other,
                      run *first, run *want, run *again, const char *what)
{
    char msg[128];
    *first = do_run(e, rq, CG_MODE_SYS, CG_PATH_CACHED, 0);
    *want = do_run(e, rq, CG_MODE_SYS, other, 0);
    snprintf(msg, sizeof msg, "%s (first run)", what);
    assert_same(e, first, want, msg);
    *again = do_run(e, rq, CG_MODE_SYS, CG_PATH_CACHED, 0);
    for (size_t i = 0; i <= n_chunks; i++)
        ck_assert_msg(again->info.segs[i].hit == 1, "%s: segment %zu missed", what, i);
    snprintf(msg, sizeof msg, "%s (hits)", what);
    assert_same(e, again, want, msg);
}

/* (2) sys: cached equals the two-stage computation without the cache; equals a single pass
 * where the chunk directly follows the system segment. */
START_TEST(test_sys_fidelity)
{
    cg_engine *e = new_engine(m_half, 0);
    int vocab = cg_model_cfg(m_half)->vocab_size;
    int d[] = {0, 1};
    th_prompt r = make_req(SYS1, d, 2, Q1);
    run miss, bypass, hit;
    sys_twice(e, &r, 2, CG_PATH_BYPASS, &miss, &bypass, &hit, "sys vs two-stage without cache");

    /* Reordered: B now follows the system segment, A comes second. Still hits. */
    int d2[] = {1, 0};
    th_prompt r2 = make_req(SYS1, d2, 2, Q1);
    run hit2 = do_run(e, &r2, CG_MODE_SYS, CG_PATH_CACHED, 0);
    ck_assert_int_eq(hit2.info.segs[1].hit, 1);
    ck_assert_int_eq(hit2.info.segs[2].hit, 1);
    run bypass2 = do_run(e, &r2, CG_MODE_SYS, CG_PATH_BYPASS, 0);
    assert_same(e, &hit2, &bypass2, "sys reordered hits vs two-stage without cache");

    /* A single chunk directly after the system segment: the single pass is exact. */
    int d3[] = {2};
    th_prompt r3 = make_req(SYS1, d3, 1, Q2);
    run c3, ref3, c3b;
    sys_twice(e, &r3, 1, CG_PATH_REFERENCE, &c3, &ref3, &c3b, "sys single chunk vs single pass");

    /* With two chunks the second keeps its system-only context from virtual position s: the
     * single pass differs (the approximation of DESIGN §6), which shows the comparisons
     * above can fail. */
    run ref = do_run(e, &r, CG_MODE_SYS, CG_PATH_REFERENCE, 0);
    ck_assert_msg(rel_diff(ref.logits, bypass.logits, vocab) > 1e-4,
                  "two-stage and single pass agree although chunk 2 is displaced");

    /* sys keys depend on the system segment: another system prompt misses. */
    th_prompt r4 = make_req(SYS2, d, 2, Q1);
    run c4 = do_run(e, &r4, CG_MODE_SYS, CG_PATH_CACHED, 0);
    ck_assert_int_eq(c4.info.segs[1].hit, 0);
    ck_assert_int_eq(c4.info.segs[2].hit, 0);
    ck_assert(!cg_key_equal(&c4.info.segs[1].key, &miss.info.segs[1].key));

    run *all[] = {&miss, &bypass, &hit, &hit2, &bypass2, &c3, &ref3, &c3b, &ref, &c4};
    runs_free(all, CG_ARRAY_LEN(all));
    cg_engine_close(&e);
}
END_TEST

/* (3) reuse across prompts: same chunks, another order, another system prompt (strict). */
START_TEST(test_reuse_across_prompts)
{
    cg_engine *e = new_engine(m_half, 0);
    int d1[] = {3, 4, 0, 1};
    th_prompt r1 = make_req(SYS1, d1, 4, Q1);
    run a = do_run(e, &r1, CG_MODE_STRICT, CG_PATH_CACHED, 0);
    ck_assert_uint_eq(a.info.cached_tokens, 0);
    int d2[] = {1, 0, 4, 3};
    th_prompt r2 = make_req(SYS2, d2, 4, Q2);
    run b = do_run(e, &r2, CG_MODE_STRICT, CG_PATH_CACHED, 0);
    ck_assert_int_eq(b.info.segs[0].hit, 0);
    for (size_t i = 1; i <= 4; i++)
        ck_assert_int_eq(b.info.segs[i].hit, 1);
    ck_assert_int_eq(b.info.segs[5].hit, 0); /* the question is never cached */
    ck_assert_uint_eq(b.info.cached_tokens, chunk_tokens(&b));
    /* same text, same key, wherever it sits */
    ck_assert(cg_key_equal(&a.info.segs[1].key, &b.info.segs[4].key));
    run ref = do_run(e, &r2, CG_MODE_STRICT, CG_PATH_REFERENCE, 0);
    assert_same(e, &b, &ref, "reuse across prompts");

    /* The same request again: now the system segment hits too, and nothing is computed but
     * the question. */
    run c = do_run(e, &r2, CG_MODE_STRICT, CG_PATH_CACHED, 0);
    ck_assert_int_eq(c.info.segs[0].hit, 1);
    ck_assert_uint_eq(c.info.cached_tokens, c.info.n_tokens - c.info.segs[5].n_tokens);
    ck_assert_uint_eq(c.info.computed_tokens, c.info.segs[5].n_tokens);
    assert_same(e, &c, &ref, "full reuse");

    /* Without a question the last logits come from a hit chunk's last token. */
    int d3[] = {4, 3};
    th_prompt r3 = make_req(SYS2, d3, 2, NULL);
    run nq = do_run(e, &r3, CG_MODE_STRICT, CG_PATH_CACHED, 0);
    ck_assert_int_eq(nq.info.segs[2].hit, 1);
    run nqref = do_run(e, &r3, CG_MODE_STRICT, CG_PATH_REFERENCE, 0);
    assert_same(e, &nq, &nqref, "prompt ending in a hit chunk");

    run *all[] = {&a, &b, &ref, &c, &nq, &nqref};
    runs_free(all, CG_ARRAY_LEN(all));
    ck_assert_int_eq(cg_pool_check(cg_engine_pool(e)), CG_OK);
    cg_engine_close(&e);
}
END_TEST

/* A freed assembly's KV serves the next assembly of about the same size: a request a few
 * tokens longer than the last takes the spare instead of a new buffer (which would then be kept
 * beside it), and one over twice as small gets a buffer of its own. */
START_TEST(test_spare_kv_reused)
{
    cg_live *l = cg_live_new(m_half, NULL, 4, 60000, SIZE_MAX);
    cg_assembly *a = cg_live_prepare(l, 900, 900 + 512, 0);
    ck_assert_ptr_nonnull(a);
    const cg_kv *kv = a->kv;
    ck_assert_uint_ge(cg_kv_cap(kv), 900 + 512);
    cg_live_discard(l, &a, 0);
    ck_assert_uint_eq(cg_live_get_stats(l).spare_bytes, cg_kv_bytes(kv));
    cg_assembly *b = cg_live_prepare(l, 907, 907 + 512, 0);
    ck_assert_ptr_eq(b->kv, kv);
    ck_assert_uint_eq(cg_live_get_stats(l).spare_bytes, 0);
    cg_live_discard(l, &b, 0); /* the spare again */
    cg_assembly *c = cg_live_prepare(l, 100, 100, 0);
    ck_assert_ptr_ne(c->kv, kv);
    cg_live_discard(l, &c, 0);
    cg_live_free(&l);
}
END_TEST

/* The spares never hold more than their byte budget: a buffer over it is freed, and the
 * largest buffers that fit are the ones kept. */
START_TEST(test_spare_kv_budget)
{
    cg_live *l = cg_live_new(m_half, NULL, 4, 60000, 0);
    cg_assembly *a = cg_live_prepare(l, 10, 10, 0);
    cg_live_discard(l, &a, 0);
    ck_assert_uint_eq(cg_live_get_stats(l).spare_bytes, 0); /* budget 0: none kept */
    cg_live_free(&l);

    /* Capacities go in steps of 1024 slots; the budget has room for 3 steps. */
    cg_kv *k = cg_kv_new(m_half, 1024);
    const size_t step = cg_kv_bytes(k);
    cg_kv_free(&k);
    l = cg_live_new(m_half, NULL, 4, 60000, 3 * step);
    cg_assembly *big = cg_live_prepare(l, 3000, 3000, 0);   /* 3 steps */
    cg_assembly *mid = cg_live_prepare(l, 2000, 2000, 0);   /* 2 */
    cg_assembly *small = cg_live_prepare(l, 1000, 1000, 0); /* 1 */
    cg_live_discard(l, &small, 0);
    ck_assert_uint_eq(cg_live_get_stats(l).spare_bytes, step);
    cg_live_discard(l, &mid, 0);
    ck_assert_uint_eq(cg_live_get_stats(l).spare_bytes, 3 * step);
    /* Largest first: the 3-step buffer is kept, and the two smaller are freed for it. */
    cg_live_discard(l, &big, 0);
    ck_assert_uint_eq(cg_live_get_stats(l).spare_bytes, 3 * step);
    /* So 1500 slots (2 steps) find no spare (3 steps would waste over half) ... */
    cg_assembly *a2 = cg_live_prepare(l, 1500, 1500, 0);
    ck_assert_uint_eq(cg_live_get_stats(l).spare_bytes, 3 * step);
    /* ... and 1600 take the 3-step one. */
    cg_assembly *a3 = cg_live_prepare(l, 1600, 1600, 0);
    ck_assert_uint_eq(cg_live_get_stats(l).spare_bytes, 0);
    ck_assert_uint_eq(cg_kv_cap(a3->kv), 3 * 1024);
    cg_live_discard(l, &a2, 0);
    cg_live_discard(l, &a3, 0);
    ck_assert_uint_eq(cg_live_get_stats(l).spare_bytes, 3 * step); /* a3's; a2's freed */
    cg_live_free(&l);
}
END_TEST

/* (4) full recompute: k >= every chunk's length equals a plain causal forward. */
START_TEST(test_full_recompute)
{
    cg_engine *e = new_engine(m_half, 0);
    int d[] = {0, 2, 4};
    th_prompt r = make_req(SYS1, d, 3, Q1);
    run causal = do_run(e, &r, CG_MODE_STRICT, CG_PATH_CAUSAL, 0);
    run miss = do_run(e, &r, CG_MODE_STRICT, CG_PATH_CACHED, 100000);
    assert_same(e, &miss, &causal, "full recompute (misses) vs causal");
    run hit = do_run(e, &r, CG_MODE_STRICT, CG_PATH_CACHED, 100000);
    for (size_t i = 1; i <= 3; i++)
        ck_assert_int_eq(hit.info.segs[i].hit, 1);
    assert_same(e, &hit, &causal, "full recompute (hits) vs causal");
    /* The pool kept the isolated version: a request without recompute still equals the
     * strict reference. */
    run plain = do_run(e, &r, CG_MODE_STRICT, CG_PATH_CACHED, 0);
    run ref = do_run(e, &r, CG_MODE_STRICT, CG_PATH_REFERENCE, 0);
    assert_same(e, &plain, &ref, "after recompute, pool still isolated");
    /* sys mode too: after full recompute the system context is the causal one. */
    run sys = do_run(e, &r, CG_MODE_SYS, CG_PATH_CACHED, 100000);
    assert_same(e, &sys, &causal, "sys full recompute vs causal");
    /* Partial recompute lies between: different from both (so k is honoured). */
    run part = do_run(e, &r, CG_MODE_STRICT, CG_PATH_CACHED, 8);
    int vocab = cg_model_cfg(m_half)->vocab_size;
    ck_assert(rel_diff(part.logits, causal.logits, vocab) > 1e-5);
    ck_assert(rel_diff(part.logits, ref.logits, vocab) > 1e-5);
    /* Prompt ending in a chunk, fully recomputed: the last logits are the causal ones. */
    th_prompt rn = make_req(SYS1, d, 3, NULL);
    run nq = do_run(e, &rn, CG_MODE_STRICT, CG_PATH_CACHED, 100000);
    run nqc = do_run(e, &rn, CG_MODE_STRICT, CG_PATH_CAUSAL, 0);
    assert_same(e, &nq, &nqc, "full recompute, no question");
    run *all[] = {&causal, &miss, &hit, &plain, &ref, &sys, &part, &nq, &nqc};
    runs_free(all, CG_ARRAY_LEN(all));
    cg_engine_close(&e);
}
END_TEST

static int in_pool(cg_engine *e, const cg_key *k)
{
    cg_pool_chunk_info info;
    return cg_pool_peek(cg_engine_pool(e), k, &info) == CG_OK;
}

/* (5) pool pressure: answers stay equal to the reference; live assemblies pin their chunks. */
START_TEST(test_pool_pressure)
{
    /* Room for about two of the documents (each ~19 blocks of 16 tokens) and a system. */
    cg_engine *e = new_engine(m_half, block_bytes(m_half) * 44);
    const uint32_t sys_blocks = (uint32_t)((strlen(SYS2) + 1 + 15) / 16);
    ck_assert_uint_lt(sys_blocks, 4);

    /* All five in one request: the pool cannot hold them, some are used unstored. */
    int all5[] = {0, 1, 2, 3, 4};
    th_prompt r = make_req(SYS2, all5, 5, Q1);
    run a = do_run(e, &r, CG_MODE_STRICT, CG_PATH_CACHED, 0);
    run ref = do_run(e, &r, CG_MODE_STRICT, CG_PATH_REFERENCE, 0);
    assert_same(e, &a, &ref, "pool pressure, one request");
    int stored = 0;
    for (size_t i = 1; i <= 5; i++)
        stored += a.info.segs[i].stored;
    ck_assert_int_ge(stored, 1);
    ck_assert_int_lt(stored, 5);
    ck_assert_int_eq(cg_pool_check(cg_engine_pool(e)), CG_OK);

    /* Hold an assembly on doc 0 (live, not consumed). */
    int d0[] = {0};
    th_prompt rh = make_req(SYS2, d0, 1, Q2);
    cg_assembly_info held;
    char err[ERRLEN];
    cg_assemble_req ar = {
        .segs = rh.segs, .n_segs = rh.n, .mode = CG_MODE_STRICT, .reserve_tokens = -1};
    ck_assert_int_eq(cg_engine_assemble(e, &ar, clock_ms, &held, err, sizeof err), CG_OK);
    cg_key k0 = held.segs[1].key;
    ck_assert(in_pool(e, &k0));

    /* Push the other documents through, two at a time, in several orders: evictions happen,
     * answers stay right, doc 0 stays. */
    int pairs[][2] = {{1, 2}, {3, 4}, {2, 3}, {4, 1}, {1, 3}};
    size_t evicted = 0;
    for (size_t i = 0; i < CG_ARRAY_LEN(pairs); i++) {
        th_prompt rp = make_req(SYS1, pairs[i], 2, Q1);
        run x = do_run(e, &rp, CG_MODE_STRICT, CG_PATH_CACHED, 0);
        run xr = do_run(e, &rp, CG_MODE_STRICT, CG_PATH_REFERENCE, 0);
        assert_same(e, &x, &xr, "pool pressure, rotating documents");
        evicted += x.info.n_evicted;
        for (size_t k = 0; k < x.info.n_evicted; k++) {
            ck_assert(!cg_key_equal(&x.info.evicted[k], &k0));
            ck_assert(!in_pool(e, &x.info.evicted[k]));
        }
        ck_assert(in_pool(e, &k0));
        ck_assert_int_eq(cg_pool_check(cg_engine_pool(e)), CG_OK);
        run_free(&x);
        run_free(&xr);
    }
    ck_assert_uint_gt(evicted, 0);
    cg_engine_stats st = cg_engine_get_stats(e);
    ck_assert_uint_eq(st.evictions, evicted);

    /* A deleted chunk that a live assembly uses is refused. */
    ck_assert_int_eq(cg_engine_chunk_delete(e, &k0), CG_E_CONFLICT);
    ck_assert(in_pool(e, &k0));

    /* Doc 0 still hits, and the held assembly still decodes to the reference answer. */
    run again = do_run(e, &rh, CG_MODE_STRICT, CG_PATH_CACHED, 0);
    ck_assert_int_eq(again.info.segs[1].hit, 1);
    run href = do_run(e, &rh, CG_MODE_STRICT, CG_PATH_REFERENCE, 0);
    assert_same(e, &again, &href, "held chunk hit");
    cg_complete_req cr = {.assembly_id = held.id, .max_tokens = GREEDY};
    cg_complete_result res;
    ck_assert_int_eq(cg_engine_complete(e, &cr, clock_ms, &res, err, sizeof err), CG_OK);
    ck_assert_uint_eq(res.n_tokens, href.n_toks);
    for (size_t i = 0; i < res.n_tokens; i++)
        ck_assert_int_eq(res.tokens[i], href.toks[i]);
    cg_complete_result_free(&res);

    /* Consumed: the chunk is evictable and deletable now. */
    ck_assert_int_eq(cg_engine_chunk_delete(e, &k0), CG_OK);
    ck_assert(!in_pool(e, &k0));
    ck_assert_int_eq(cg_engine_chunk_delete(e, &k0), CG_E_NOT_FOUND);
    ck_assert_int_eq(cg_pool_check(cg_engine_pool(e)), CG_OK);

    cg_assembly_info_free(&held);
    run *rs[] = {&a, &ref, &again, &href};
    runs_free(rs, CG_ARRAY_LEN(rs));
    cg_engine_close(&e);
}
END_TEST

/* (6) a key that does not match its text is refused, and nothing is stored under it. */
START_TEST(test_key_mismatch)
{
    cg_engine *e = new_engine(m_half, 0);
    const cg_model_config *c = cg_model_cfg(m_half);
    int d[] = {0, 1};
    th_prompt r = make_req(SYS1, d, 2, Q1);
    /* Claim doc B's key for doc A's text (the poisoning attempt). */
    cg_key kb = cg_key_compute(c->model_id, strlen(c->model_id), CG_MODE_STRICT, NULL, 0, NULL,
                               DOC[1], strlen(DOC[1]));
    r.segs[1].key = &kb;
    cg_assembly_info info;
    char err[ERRLEN];
    cg_assemble_req ar = {
        .segs = r.segs, .n_segs = r.n, .mode = CG_MODE_STRICT, .reserve_tokens = -1};
    ck_assert_int_eq(cg_engine_assemble(e, &ar, clock_ms, &info, err, sizeof err),
                     CG_E_KEY_MISMATCH);
    ck_assert_ptr_nonnull(strstr(err, "segments[1]"));
    ck_assert_uint_eq(info.n_segs, 0);
    cg_pool_stats ps = cg_pool_get_stats(cg_engine_pool(e));
    ck_assert_uint_eq(ps.chunks, 0);
    ck_assert_uint_eq(ps.bytes_used, 0);
    ck_assert(!in_pool(e, &kb));
    ck_assert_uint_eq(cg_engine_live_assemblies(e, clock_ms), 0);

    /* The right key (and a salted one) is accepted; salt changes the key. */
    cg_key ka = cg_key_compute(c->model_id, strlen(c->model_id), CG_MODE_STRICT, NULL, 0, NULL,
                               DOC[0], strlen(DOC[0]));
    r.segs[1].key = &ka;
    ck_assert_int_eq(cg_engine_assemble(e, &ar, clock_ms, &info, err, sizeof err), CG_OK);
    ck_assert(cg_key_equal(&info.segs[1].key, &ka));
    ck_assert(in_pool(e, &ka));
    /* doc B's key now holds doc B's KV (it is in this request), not doc A's */
    cg_pool_chunk_info pi;
    ck_assert_int_eq(cg_pool_peek(cg_engine_pool(e), &kb, &pi), CG_OK);
    ck_assert_uint_eq(pi.tokens, strlen(DOC[1]));
    ck_assert(cg_key_equal(&info.segs[2].key, &kb));
    ck_assert_int_eq(cg_engine_release(e, info.id, clock_ms), CG_OK);
    ck_assert_int_eq(cg_engine_release(e, info.id, clock_ms), CG_E_NOT_FOUND);
    cg_assembly_info_free(&info);
    ar.salt = "tenant-1";
    ar.salt_len = 8;
    ck_assert_int_eq(cg_engine_assemble(e, &ar, clock_ms, &info, err, sizeof err),
                     CG_E_KEY_MISMATCH);
    r.segs[1].key = NULL;
    ck_assert_int_eq(cg_engine_assemble(e, &ar, clock_ms, &info, err, sizeof err), CG_OK);
    ck_assert(!cg_key_equal(&info.segs[1].key, &ka));
    ck_assert_int_eq(info.segs[1].hit, 0); /* another tenant does not share the chunk */
    cg_assembly_info_free(&info);
    cg_engine_close(&e);
}
END_TEST

/* Input checks, TTL expiry, plain prompts, KV growth while decoding, export. */
/* a slow token callback (a client reading slowly: the scheduler decodes ahead of it) that
 * asks to stop at the third token, counting its calls */
static int stop_at_third(void *ud, const cg_tok_rec *rec, const char *bytes, size_t len)
{
    (void)rec, (void)bytes, (void)len;
    th_sleep_ms(20);
    return ++*(int *)ud >= 3;
}

START_TEST(test_lifecycle)
{
    cg_engine_params p = cg_engine_default_params();
    p.assembly_ttl_ms = 500;
    p.max_assemblies = 2;
    p.now_ms = NULL; /* every time below is set by hand: ttls count from the given now */
    cg_engine *e = NULL;
    ck_assert_int_eq(cg_engine_open(m_half, p, &e), CG_OK);
    char err[ERRLEN];
    cg_assembly_info info;
    cg_assemble_req ar = {.mode = CG_MODE_STRICT, .reserve_tokens = -1};

    /* bad inputs */
    ck_assert_int_eq(cg_engine_assemble(e, &ar, clock_ms, &info, err, sizeof err), CG_E_VALUE);
    cg_engine_seg bad[2] = {{CG_ROLE_CHUNK, "x", 1, NULL}, {CG_ROLE_SYSTEM, "y", 1, NULL}};
    ar.segs = bad;
    ar.n_segs = 2;
    ck_assert_int_eq(cg_engine_assemble(e, &ar, clock_ms, &info, err, sizeof err), CG_E_VALUE);
    bad[0] = (cg_engine_seg){CG_ROLE_QUESTION, "x", 1, NULL};
    bad[1] = (cg_engine_seg){CG_ROLE_CHUNK, "y", 1, NULL};
    ck_assert_int_eq(cg_engine_assemble(e, &ar, clock_ms, &info, err, sizeof err), CG_E_VALUE);
    bad[0] = (cg_engine_seg){CG_ROLE_CHUNK, "", 0, NULL};
    ck_assert_int_eq(cg_engine_assemble(e, &ar, clock_ms, &info, err, sizeof err), CG_E_VALUE);
    size_t big_n = (size_t)cg_model_cfg(m_half)->max_pos;
    char *big = cg_malloc(big_n);
    memset(big, 'a', big_n);
    bad[0] = (cg_engine_seg){CG_ROLE_CHUNK, big, big_n / 2, NULL};
    bad[1] = (cg_engine_seg){CG_ROLE_CHUNK, big, big_n / 2 + 1, NULL};
    ck_assert_int_eq(cg_engine_assemble(e, &ar, clock_ms, &info, err, sizeof err), CG_E_CONTEXT);
    cg_complete_req cp = {.prompt = big, .prompt_len = big_n, .max_tokens = 1};
    cg_complete_result res;
    ck_assert_int_eq(cg_engine_complete(e, &cp, clock_ms, &res, err, sizeof err), CG_E_CONTEXT);
    free(big);
    ck_assert_uint_eq(cg_pool_get_stats(cg_engine_pool(e)).chunks, 0);

    /* TTL: an unconsumed assembly expires and gives its chunks back. */
    int d[] = {0};
    th_prompt r = make_req(SYS1, d, 1, Q1);
    ar.segs = r.segs;
    ar.n_segs = r.n;
    ck_assert_int_eq(cg_engine_assemble(e, &ar, 1000, &info, err, sizeof err), CG_OK);
    cg_key k = info.segs[1].key;
    cg_pool_chunk_info pi;
    ck_assert_int_eq(cg_pool_peek(cg_engine_pool(e), &k, &pi), CG_OK);
    ck_assert_uint_eq(pi.refs, 1);
    char id1[33];
    memcpy(id1, info.id, sizeof id1);
    cg_assembly_info_free(&info);
    /* KV export of a live assembly: per head, per layer, K then V. */
    void *kvb = NULL;
    size_t kvlen = 0;
    uint32_t kvt = 0;
    const cg_model_config *c = cg_model_cfg(m_half);
    ck_assert_int_eq(cg_engine_assembly_kv(e, id1, 1, 2, 1100, &kvb, &kvlen, &kvt), CG_OK);
    ck_assert_uint_eq(kvlen, (size_t)2 * c->n_layers * 2 * kvt * c->head_dim * sizeof(float));
    free(kvb);
    ck_assert_int_eq(cg_engine_assembly_kv(e, id1, 2, 9, 1100, &kvb, &kvlen, &kvt), CG_E_VALUE);
    /* Chunk export: every head, the chunk's own token count. */
    ck_assert_int_eq(cg_engine_chunk_kv(e, &k, 0, c->n_kv_heads - 1, &kvb, &kvlen, &kvt), CG_OK);
    ck_assert_uint_eq(kvt, (uint32_t)strlen(DOC[0]));
    ck_assert_uint_eq(kvlen,
                      (size_t)c->n_kv_heads * c->n_layers * 2 * kvt * c->head_dim * sizeof(float));
    free(kvb);

    ck_assert_int_eq(cg_engine_assemble(e, &ar, 1200, &info, err, sizeof err), CG_OK);
    char id2[33];
    memcpy(id2, info.id, sizeof id2);
    ck_assert_str_ne(id1, id2);
    cg_assembly_info_free(&info);
    /* the limit of live assemblies */
    ck_assert_int_eq(cg_engine_assemble(e, &ar, 1300, &info, err, sizeof err), CG_E_UNAVAILABLE);
    /* ... which a completion's own assembly, decoded at once, is not held to */
    ar.internal = 1;
    ck_assert_int_eq(cg_engine_assemble(e, &ar, 1300, &info, err, sizeof err), CG_OK);
    cg_complete_req ci = {.assembly_id = info.id, .max_tokens = 2};
    ck_assert_int_eq(cg_engine_complete(e, &ci, 1300, &res, err, sizeof err), CG_OK);
    cg_complete_result_free(&res);
    cg_assembly_info_free(&info);
    ar.internal = 0;
    ck_assert_uint_eq(cg_engine_live_assemblies(e, 1499), 2);
    ck_assert_uint_eq(cg_engine_live_assemblies(e, 1500), 1); /* id1 expired */
    cg_complete_req cr = {.assembly_id = id1, .max_tokens = 4};
    ck_assert_int_eq(cg_engine_complete(e, &cr, 1500, &res, err, sizeof err), CG_E_NOT_FOUND);
    /* only the whole id names a live assembly: not its prefix, not a longer string */
    char near[40];
    snprintf(near, sizeof near, "%.31s", id2);
    cr.assembly_id = near;
    ck_assert_int_eq(cg_engine_complete(e, &cr, 1500, &res, err, sizeof err), CG_E_NOT_FOUND);
    snprintf(near, sizeof near, "%s0", id2);
    ck_assert_int_eq(cg_engine_complete(e, &cr, 1500, &res, err, sizeof err), CG_E_NOT_FOUND);
    ck_assert_uint_eq(cg_engine_live_assemblies(e, 1500), 1);
    ck_assert_int_eq(cg_pool_peek(cg_engine_pool(e), &k, &pi), CG_OK);
    ck_assert_uint_eq(pi.refs, 1); /* id2's */
    ck_assert_uint_eq(cg_engine_reap(e, 1700), 1);
    ck_assert_int_eq(cg_pool_peek(cg_engine_pool(e), &k, &pi), CG_OK);
    ck_assert_uint_eq(pi.refs, 0);
    ck_assert_uint_eq(cg_engine_get_stats(e).assemblies_expired, 2);

    /* A plain prompt decodes like a one-segment system prompt (BOS + bytes, causal). */
    cp = (cg_complete_req){.prompt = SYS1, .prompt_len = strlen(SYS1), .max_tokens = GREEDY};
    ck_assert_int_eq(cg_engine_complete(e, &cp, 2000, &res, err, sizeof err), CG_OK);
    th_prompt rs = make_req(SYS1, NULL, 0, NULL);
    run one = do_run(e, &rs, CG_MODE_STRICT, CG_PATH_REFERENCE, 0);
    ck_assert_uint_eq(res.prompt_tokens, strlen(SYS1) + 1);
    ck_assert_uint_eq(res.n_tokens, one.n_toks);
    for (size_t i = 0; i < res.n_tokens; i++)
        ck_assert_int_eq(res.tokens[i], one.toks[i]);
    ck_assert_uint_eq(res.text_len, strlen(res.text));
    cg_complete_result_free(&res);
    run_free(&one);

    /* Decoding past the reserve grows the KV; the tokens are those of a roomy KV. Sampling
     * with a seed is reproducible. */
    int dd[] = {1};
    th_prompt rg = make_req(SYS2, dd, 1, Q2);
    ar.segs = rg.segs;
    ar.n_segs = rg.n;
    int32_t toks[2][48];
    size_t nt[2];
    for (int round = 0; round < 2; round++) {
        ar.reserve_tokens = round == 0 ? 0 : 512;
        ck_assert_int_eq(cg_engine_assemble(e, &ar, 3000, &info, err, sizeof err), CG_OK);
        cr = (cg_complete_req){.assembly_id = info.id,
                               .max_tokens = 48,
                               .temperature = 0.8f,
                               .top_p = 0.9f,
                               .seed = 42};
        ck_assert_int_eq(cg_engine_complete(e, &cr, 3000, &res, err, sizeof err), CG_OK);
        nt[round] = res.n_tokens;
        memcpy(toks[round], res.tokens, res.n_tokens * sizeof(int32_t));
        ck_assert(strcmp(res.finish_reason, "length") == 0 ||
                  strcmp(res.finish_reason, "stop") == 0);
        if (res.n_tokens < 48) ck_assert_str_eq(res.finish_reason, "stop");
        cg_complete_result_free(&res);
        cg_assembly_info_free(&info);
    }
    ck_assert_uint_eq(nt[0], nt[1]);
    for (size_t i = 0; i < nt[0]; i++)
        ck_assert_int_eq(toks[0][i], toks[1][i]);

    /* on_token stops at the 3rd token: the answer ends there, whatever the scheduler had
     * already made (a stop sequence's cut relies on it) */
    for (int run_i = 0; run_i < 2; run_i++) {
        int seen = 0;
        cp = (cg_complete_req){.prompt = "hello there",
                               .prompt_len = 11,
                               .max_tokens = 48,
                               .on_token = stop_at_third,
                               .ud = &seen};
        ck_assert_int_eq(cg_engine_complete(e, &cp, 4000, &res, err, sizeof err), CG_OK);
        ck_assert_int_eq(seen, 3);
        ck_assert_uint_eq(res.n_tokens, 3);
        ck_assert_uint_eq(res.completion_tokens, 3);
        ck_assert_str_eq(res.finish_reason, "stop");
        cg_complete_result_free(&res);
    }

    /* max_tokens 0 */
    cp = (cg_complete_req){.prompt = "hi", .prompt_len = 2, .max_tokens = 0};
    ck_assert_int_eq(cg_engine_complete(e, &cp, 4000, &res, err, sizeof err), CG_OK);
    ck_assert_uint_eq(res.n_tokens, 0);
    ck_assert_str_eq(res.finish_reason, "length");
    cg_complete_result_free(&res);
    cg_engine_close(&e);
}
END_TEST

static cg_key doc_key(const cg_model *m, int d)
{
    const cg_model_config *c = cg_model_cfg(m);
    return cg_key_compute(c->model_id, strlen(c->model_id), CG_MODE_STRICT, NULL, 0, NULL, DOC[d],
                          strlen(DOC[d]));
}

/* Bit-exact: the same logits and tokens. */
static void assert_identical(const run *got, const run *ref, int vocab, const char *what)
{
    ck_assert_msg(memcmp(got->logits, ref->logits, (size_t)vocab * sizeof(float)) == 0,
                  "%s: logits differ", what);
    ck_assert_uint_eq(got->n_toks, ref->n_toks);
    ck_assert(memcmp(got->toks, ref->toks, ref->n_toks * sizeof(int32_t)) == 0);
}

/* (10) the disk tier under a small pool */
START_TEST(test_disk_tier)
{
    const cg_model_config *c = cg_model_cfg(m_half);
    const int vocab = c->vocab_size;
    char dir[] = "/tmp/cg_test_engine_disk_XXXXXX";
    ck_assert_ptr_nonnull(mkdtemp(dir));
    const size_t bb = block_bytes(m_half);
    cg_engine_params p = cg_engine_default_params();
    p.pool_bytes = bb * 44; /* the system prompt and two documents */
    p.disk_bytes = (size_t)64 << 20;
    p.disk_dir = dir;
    cg_engine *e = NULL;
    ck_assert_int_eq(cg_engine_open(m_half, p, &e), CG_OK);
    ck_assert_ptr_nonnull(cg_engine_disk(e));
    cg_engine *big = new_engine(m_half, 0); /* RAM only, never evicts: the comparison */

    /* Rotating pairs of documents: chunks go to disk and come back, answers keep every bit. */
    int pairs[][2] = {{0, 1}, {2, 3}, {4, 0}, {1, 2}, {3, 4}, {0, 2}, {1, 3}};
    size_t disk_segs = 0, spilled = 0;
    for (size_t i = 0; i < CG_ARRAY_LEN(pairs); i++) {
        th_prompt rp = make_req(SYS2, pairs[i], 2, Q1);
        run x = do_run(e, &rp, CG_MODE_STRICT, CG_PATH_CACHED, 0);
        run xr = do_run(big, &rp, CG_MODE_STRICT, CG_PATH_CACHED, 0);
        assert_identical(&x, &xr, vocab, "disk tier, rotating documents");
        for (size_t k = 0; k < x.info.n_segs; k++) {
            disk_segs += x.info.segs[k].hit && x.info.segs[k].tier == CG_TIER_DISK;
        }
        ck_assert_uint_eq(x.info.n_evicted, 0); /* the disk had room: nothing left the worker */
        spilled += x.info.n_spilled;
        for (size_t k = 0; k < x.info.n_spilled; k++) {
            ck_assert(!in_pool(e, &x.info.spilled[k]));
            ck_assert(cg_disk_contains(cg_engine_disk(e), &x.info.spilled[k]));
        }
        ck_assert_int_eq(cg_pool_check(cg_engine_pool(e)), CG_OK);
        ck_assert_int_eq(cg_disk_check(cg_engine_disk(e)), CG_OK);
        run_free(&x);
        run_free(&xr);
    }
    cg_engine_stats st = cg_engine_get_stats(e);
    ck_assert_uint_gt(spilled, 0);
    ck_assert_uint_gt(disk_segs, 0);
    ck_assert_uint_eq(st.disk_hits, disk_segs);
    ck_assert_uint_ge(st.restores, disk_segs);
    ck_assert_uint_eq(st.spills, st.evictions);
    ck_assert_uint_eq(st.spill_failures, 0);
    ck_assert_uint_eq(st.restore_failures, 0);

    /* The KV export of a chunk on disk only reads it back. */
    int on_disk = -1;
    for (int d = 0; d < 5 && on_disk < 0; d++) {
        cg_key k = doc_key(m_half, d);
        if (!in_pool(e, &k) && cg_disk_contains(cg_engine_disk(e), &k)) on_disk = d;
    }
    ck_assert_int_ge(on_disk, 0);
    cg_key kd = doc_key(m_half, on_disk);
    void *kv1 = NULL, *kv2 = NULL;
    size_t n1 = 0, n2 = 0;
    uint32_t t1 = 0, t2 = 0;
    ck_assert_int_eq(cg_engine_chunk_kv(e, &kd, 0, c->n_kv_heads - 1, &kv1, &n1, &t1), CG_OK);
    ck_assert_int_eq(cg_engine_chunk_kv(big, &kd, 0, c->n_kv_heads - 1, &kv2, &n2, &t2), CG_OK);
    ck_assert_uint_eq(n1, n2);
    ck_assert(memcmp(kv1, kv2, n1) == 0);
    free(kv1);
    free(kv2);

    /* Corruption: every slot of the data file gets bytes flipped behind the tier's back. The
     * records fail their checksum and are misses, recomputed: the answers keep every bit. */
    char path[600], kvdir[512];
    ck_assert_int_eq(cg_tiers_disk_dir(c, dir, kvdir, sizeof kvdir), 0);
    snprintf(path, sizeof path, "%s/kv.blocks", kvdir);
    ck_assert_int_gt(th_flip_bytes(path, bb, 100, 1, 108, 0xa5), 0);
    int two[2], n_two = 0;
    for (int d = 0; d < 5 && n_two < 2; d++) {
        cg_key k = doc_key(m_half, d);
        if (!in_pool(e, &k) && cg_disk_contains(cg_engine_disk(e), &k)) two[n_two++] = d;
    }
    ck_assert_int_eq(n_two, 2);
    th_prompt rc = make_req(SYS2, two, 2, Q2);
    run x = do_run(e, &rc, CG_MODE_STRICT, CG_PATH_CACHED, 0);
    run xr = do_run(big, &rc, CG_MODE_STRICT, CG_PATH_CACHED, 0);
    assert_identical(&x, &xr, vocab, "corrupt disk records");
    ck_assert_int_eq(x.info.segs[1].hit, 0);
    ck_assert_int_eq(x.info.segs[2].hit, 0);
    run_free(&x);
    run_free(&xr);
    st = cg_engine_get_stats(e);
    ck_assert_uint_ge(st.restore_failures, 2);
    ck_assert_uint_ge(cg_disk_get_stats(cg_engine_disk(e)).checksum_failures, 2);
    ck_assert_int_eq(cg_disk_check(cg_engine_disk(e)), CG_OK);

    /* Flush, close, reopen: every chunk that was in RAM is a disk hit. */
    size_t in_ram = cg_pool_get_stats(cg_engine_pool(e)).chunks;
    ck_assert_uint_eq(cg_engine_flush(e, clock_ms), in_ram);
    cg_engine_close(&e);
    ck_assert_int_eq(cg_engine_open(m_half, p, &e), CG_OK);
    x = do_run(e, &rc, CG_MODE_STRICT, CG_PATH_CACHED, 0);
    xr = do_run(big, &rc, CG_MODE_STRICT, CG_PATH_CACHED, 0);
    assert_identical(&x, &xr, vocab, "after a reopen");
    for (int k = 0; k < 3; k++) {
        ck_assert_int_eq(x.info.segs[k].hit, 1);
        ck_assert_int_eq(x.info.segs[k].tier, CG_TIER_DISK);
    }
    run_free(&x);
    run_free(&xr);

    /* DELETE takes a chunk off both tiers. */
    cg_key k0 = doc_key(m_half, two[0]);
    ck_assert_int_eq(cg_engine_chunk_delete(e, &k0), CG_OK);
    ck_assert(!in_pool(e, &k0));
    ck_assert(!cg_disk_contains(cg_engine_disk(e), &k0));
    ck_assert_int_eq(cg_engine_chunk_delete(e, &k0), CG_E_NOT_FOUND);

    /* A second engine on the same directory is refused while this one has it. */
    cg_engine *dup = NULL;
    ck_assert_int_eq(cg_engine_open(m_half, p, &dup), CG_E_CONFLICT);
    ck_assert_ptr_null(dup);

    cg_engine_close(&e);
    cg_engine_close(&big);
    th_rmrf(dir);
}
END_TEST

/* (11) adopted KV (what a backend pulls) decodes exactly like the assembly it came from */
START_TEST(test_adopt)
{
    const cg_model_config *c = cg_model_cfg(m_half);
    cg_engine *src = new_engine(m_half, 0), *dst = new_engine(m_half, 0);
    int d[] = {1, 2};
    th_prompt r = make_req(SYS1, d, 2, Q1);
    cg_assemble_req ar = {
        .segs = r.segs, .n_segs = r.n, .mode = CG_MODE_STRICT, .reserve_tokens = -1};
    cg_assembly_info a, b;
    char err[ERRLEN];
    ck_assert_int_eq(cg_engine_assemble(src, &ar, clock_ms, &a, err, sizeof err), CG_OK);
    ck_assert_int_eq(cg_engine_assemble(src, &ar, clock_ms, &b, err, sizeof err), CG_OK);
    ck_assert(cg_engine_has_assembly(src, a.id, clock_ms));
    /* the logits and the per-head KV, as the HTTP export gives them */
    float *logits = cg_malloc((size_t)c->vocab_size * sizeof(float));
    uint32_t n_tokens = 0, cached = 0, tokens = 0;
    ck_assert_int_eq(cg_engine_assembly_logits(src, a.id, clock_ms, logits, &n_tokens, &cached),
                     CG_OK);
    ck_assert_uint_eq(n_tokens, a.n_tokens);
    ck_assert_uint_eq(cached, a.cached_tokens);
    void *payload = NULL;
    size_t len = 0;
    ck_assert_int_eq(
        cg_engine_assembly_kv(src, a.id, 0, c->n_kv_heads - 1, clock_ms, &payload, &len, &tokens),
        CG_OK);
    cg_kv *kv = cg_kv_new(m_half, n_tokens + 64);
    const size_t plane = (size_t)n_tokens * (size_t)c->head_dim;
    const float *f = payload;
    for (int h = 0; h < c->n_kv_heads; h++)
        for (int l = 0; l < c->n_layers; l++) {
            memcpy(cg_kv_k(kv, l, h), f, plane * sizeof(float));
            f += plane;
            memcpy(cg_kv_v(kv, l, h), f, plane * sizeof(float));
            f += plane;
        }
    free(payload);
    char id[33];
    ck_assert_int_eq(cg_engine_adopt(dst, &kv, n_tokens, cached, logits, clock_ms, id), CG_OK);
    ck_assert_ptr_null(kv);
    cg_complete_req c1 = {.assembly_id = b.id, .max_tokens = GREEDY};
    cg_complete_req c2 = {.assembly_id = id, .max_tokens = GREEDY};
    cg_complete_result r1, r2;
    ck_assert_int_eq(cg_engine_complete(src, &c1, clock_ms, &r1, err, sizeof err), CG_OK);
    ck_assert_int_eq(cg_engine_complete(dst, &c2, clock_ms, &r2, err, sizeof err), CG_OK);
    ck_assert_uint_eq(r1.n_tokens, r2.n_tokens);
    ck_assert(memcmp(r1.tokens, r2.tokens, r1.n_tokens * sizeof(int32_t)) == 0);
    ck_assert_uint_eq(r2.cached_tokens, cached);
    ck_assert_uint_eq(r2.prompt_tokens, n_tokens);
    ck_assert_uint_eq(cg_engine_get_stats(dst).assemblies_adopted, 1);
    /* bad sizes are refused, and the KV is taken over anyway */
    kv = cg_kv_new(m_half, 8);
    ck_assert_int_eq(cg_engine_adopt(dst, &kv, 9, 0, logits, clock_ms, id), CG_E_VALUE);
    ck_assert_ptr_null(kv);
    cg_complete_result_free(&r1);
    cg_complete_result_free(&r2);
    ck_assert_int_eq(cg_engine_release(src, a.id, clock_ms), CG_OK);
    cg_assembly_info_free(&a);
    cg_assembly_info_free(&b);
    free(logits);
    cg_engine_close(&src);
    cg_engine_close(&dst);
}
END_TEST

/* The ttl of an assembly runs from when it is ready, not from when the request came in: a
 * cold prompt may compute for longer than the ttl. The engine's clock advances 1000 ms
 * between the start and the end of the assemble here, with a ttl of 500 ms. */
static uint64_t fake_ms;
static uint64_t slow_clock(void)
{
    fake_ms += 1000;
    return fake_ms;
}

START_TEST(test_ttl_from_ready)
{
    cg_engine_params p = cg_engine_default_params();
    p.assembly_ttl_ms = 500;
    p.now_ms = slow_clock;
    cg_engine *e = NULL;
    ck_assert_int_eq(cg_engine_open(m_half, p, &e), CG_OK);
    char err[ERRLEN];
    cg_assembly_info info;
    int d[] = {0};
    th_prompt r = make_req(SYS1, d, 1, Q1);
    cg_assemble_req ar = {
        .segs = r.segs, .n_segs = r.n, .mode = CG_MODE_STRICT, .reserve_tokens = -1};
    ck_assert_int_eq(cg_engine_assemble(e, &ar, 1000, &info, err, sizeof err), CG_OK);
    char id[33];
    memcpy(id, info.id, sizeof id);
    cg_assembly_info_free(&info);
    /* ready at 1000 + 1000: live until 2500 */
    ck_assert_uint_eq(cg_engine_live_assemblies(e, 1600), 1);
    ck_assert_uint_eq(cg_engine_live_assemblies(e, 2499), 1);
    cg_complete_req cr = {.assembly_id = id, .max_tokens = 2};
    cg_complete_result res;
    ck_assert_int_eq(cg_engine_complete(e, &cr, 2400, &res, err, sizeof err), CG_OK);
    cg_complete_result_free(&res);
    ck_assert_uint_eq(cg_engine_live_assemblies(e, 2400), 0); /* consumed */
    /* and one never consumed expires at ready + ttl */
    ck_assert_int_eq(cg_engine_assemble(e, &ar, 3000, &info, err, sizeof err), CG_OK);
    cg_assembly_info_free(&info);
    ck_assert_uint_eq(cg_engine_live_assemblies(e, 4499), 1);
    ck_assert_uint_eq(cg_engine_live_assemblies(e, 4500), 0);
    ck_assert_uint_eq(cg_engine_get_stats(e).assemblies_expired, 1);
    cg_engine_close(&e);
}
END_TEST

/* The cancel hook of test_client_left: 1 from its calls-th call on. */
typedef struct left_after {
    int calls, at;
} left_after;

static int left_hook(void *ud)
{
    left_after *l = ud;
    return ++l->calls >= l->at;
}

/* A client that leaves while its cold prompt is computed stops it before the next segment's
 * forward: the segments computed until then stay stored, the rest are not computed, and the
 * same prompt asked again finds what was stored. */
START_TEST(test_client_left)
{
    cg_engine *e = new_engine(m_half, 0);
    int d[] = {0, 1, 2, 3};
    th_prompt rq = make_req(SYS1, d, 4, Q1);
    left_after l = {.at = 3}; /* asked before the system segment, chunk 0, then chunk 1 */
    cg_assemble_req ar = {.segs = rq.segs,
                          .n_segs = rq.n,
                          .mode = CG_MODE_STRICT,
                          .reserve_tokens = -1,
                          .path = CG_PATH_CACHED,
                          .cancelled = left_hook,
                          .cancel_ud = &l};
    cg_assembly_info info;
    char err[ERRLEN];
    cg_status st = cg_engine_assemble(e, &ar, clock_ms, &info, err, sizeof err);
    ck_assert_int_eq(st, CG_E_UNAVAILABLE);
    ck_assert_msg(strstr(err, "client left") && strstr(err, "2 segments"), "%s", err);
    ck_assert_int_eq(l.calls, 3);
    ck_assert_uint_eq(cg_pool_get_stats(cg_engine_pool(e)).chunks, 2);
    uint64_t computed = cg_engine_get_stats(e).prefill_tokens; /* counted though it failed */
    ck_assert_int_eq(cg_pool_check(cg_engine_pool(e)), CG_OK);
    /* asked again, in full: the system segment and the first chunk hit */
    run again = do_run(e, &rq, CG_MODE_STRICT, CG_PATH_CACHED, 0);
    ck_assert_int_eq(again.info.segs[0].hit, 1);
    ck_assert_int_eq(again.info.segs[1].hit, 1);
    for (size_t i = 2; i < again.info.n_segs; i++)
        ck_assert_int_eq(again.info.segs[i].hit, 0);
    ck_assert_uint_eq(computed, again.info.segs[0].n_tokens + again.info.segs[1].n_tokens);
    run ref = do_run(e, &rq, CG_MODE_STRICT, CG_PATH_REFERENCE, 0);
    assert_same(e, &again, &ref, "after a client left");
    run *all[] = {&again, &ref};
    runs_free(all, CG_ARRAY_LEN(all));
    cg_engine_close(&e);
}
END_TEST

/* A system text equal to a chunk text has the same strict key but one more token (BOS):
 * the engine must not mix them up. */
START_TEST(test_role_collision)
{
    cg_engine *e = new_engine(m_half, 0);
    cg_engine_seg s1[2] = {{CG_ROLE_SYSTEM, DOC[2], strlen(DOC[2]), NULL},
                           {CG_ROLE_QUESTION, Q1, strlen(Q1), NULL}};
    th_prompt r1 = {{s1[0], s1[1]}, 2};
    run a = do_run(e, &r1, CG_MODE_STRICT, CG_PATH_CACHED, 0);
    int d[] = {2};
    th_prompt r2 = make_req(SYS1, d, 1, Q1);
    run b = do_run(e, &r2, CG_MODE_STRICT, CG_PATH_CACHED, 0);
    ck_assert(cg_key_equal(&a.info.segs[0].key, &b.info.segs[1].key));
    ck_assert_int_eq(b.info.segs[1].hit, 0);
    run ref = do_run(e, &r2, CG_MODE_STRICT, CG_PATH_REFERENCE, 0);
    assert_same(e, &b, &ref, "chunk whose text equals a cached system text");
    runs_free((run *[]){&a, &b, &ref}, 3);
    cg_engine_close(&e);
}
END_TEST

int main(int argc, char **argv)
{
    (void)argc;
    th_omp_passive(argv); /* this suite ran ten times slower under the spin-wait */
    cg_log_init("test_engine", CG_LOG_WARN);
    m_half = make_model(CG_ROPE_HALF, &dir_half);
    m_inter = make_model(CG_ROPE_INTERLEAVED, &dir_inter);
    int failed = th_run_tests("engine", "fidelity", 300,
                              TH_TESTS(test_strict_fidelity, test_strict_fidelity_interleaved,
                                       test_sys_fidelity, test_reuse_across_prompts,
                                       test_full_recompute, test_pool_pressure, test_key_mismatch,
                                       test_lifecycle, test_ttl_from_ready, test_client_left,
                                       test_role_collision, test_disk_tier, test_adopt,
                                       test_spare_kv_reused, test_spare_kv_budget));
    cg_model_close(&m_half);
    cg_model_close(&m_inter);
    th_rmdtemp(dir_half);
    th_rmdtemp(dir_inter);
    return failed;
}

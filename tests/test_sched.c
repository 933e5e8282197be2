/* Check suite for the scheduler (worker/serve/sched.c) through the engine, on real tensors:
 * batch invariance (a greedy request gives the same tokens alone and in any batch, at any
 * position), decode steps shared by concurrent sequences, chunked prefill interleaved with
 * decoding, admission (429 beyond max_running + max_queue), and departures (a sequence whose
 * caller stops is dropped and gives its KV back). f32 and bf16 weights of the tiny model, and
 * batch invariance on the Qwen2 and Qwen3 architectures too. */
#include <check.h>
#include <dirent.h>
#include <pthread.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <unistd.h>

#include "base/base.h"
#include "tests/harness/harness.h"
#include "worker/serve/engine.h"

#define ERRLEN 512
#define N_TOK 24
#define N_PROMPTS 6

static char dir_f32[64], dir_bf16[64], dir_qwen2[64], dir_qwen3[64], dir_q8[64], dir_q4[64];
static cg_model *m_f32, *m_bf16, *m_qwen2, *m_qwen3, *m_q8, *m_q4;

static const char *PROMPTS[N_PROMPTS] = {
    "The harbour town exported dried cod and tar.",
    "Annual rainfall in the valley averaged 812 millimetres.",
    "The cooperative's bylaws were amended in March; members may vote by post.",
    "Hold the mode button for five seconds until the LED blinks amber.",
    "The survey counted 1,140 breeding pairs of terns on the outer islands.",
    "A quick question about nothing in particular, answered at length.",
};

/* The tiny model in dtype, or, with preset set, that real architecture (Qwen2's q/k/v biases,
 * Qwen3's q/k norms) at a small geometry with a byte-level vocabulary, in bf16; its weights
 * quantised at load as quant says. */
static cg_model *make_model_q(const char *dtype, const char *preset, cg_quant quant, char *dir)
{
    snprintf(dir, 64, "/tmp/cg_test_sched_XXXXXX");
    if (!mkdtemp(dir)) abort();
    char err[ERRLEN];
    cg_model_gen_params gp = cg_model_gen_default_params();
    if (preset) {
        if (cg_model_gen_preset(preset, &gp) != CG_OK) abort();
        gp.n_layers = 2;
        gp.dim = 64;
        gp.n_heads = 4;
        gp.n_kv_heads = 2;
        if (gp.head_dim) gp.head_dim = 24; /* Qwen3: head_dim apart from dim / heads */
        gp.hidden_dim = 128;
        gp.vocab_size = 512;
        gp.bos_id = 510;
        gp.eos_ids[0] = 511;
        gp.n_eos = 1;
    }
    gp.seed = 11;
    gp.dtype = dtype;
    cg_model *m = NULL;
    if (cg_model_generate(dir, gp, err, sizeof err) != CG_OK ||
        cg_model_open_quant(dir, quant, &m, err, sizeof err) != CG_OK) {
        fprintf(stderr, "model: %s\n", err);
        abort();
    }
    return m;
}

static cg_model *make_model(const char *dtype, const char *preset, char *dir)
{
    return make_model_q(dtype, preset, CG_QUANT_NONE, dir);
}

static cg_engine *new_engine(cg_model *m, uint32_t max_running, uint32_t max_queue, uint32_t chunk)
{
    cg_engine_params p = cg_engine_default_params();
    p.sched.max_running = max_running;
    p.sched.max_queue = max_queue;
    p.sched.prefill_chunk = chunk;
    p.sched.prefill_budget = chunk;
    cg_engine *e = NULL;
    ck_assert_int_eq(cg_engine_open(m, p, &e), CG_OK);
    return e;
}

/* One greedy completion of a plain prompt on its own thread. */
typedef struct job {
    cg_engine *e;
    const char *prompt;
    uint32_t max_tokens;
    int stop_after; /* > 0: the caller stops after this many tokens */
    int seen;
    cg_complete_result res;
    cg_status st;
    uint64_t *stamps; /* optional: when each token arrived (ns) */
    int *gate;        /* optional: after its first token the caller waits until *gate is set */
} job;

static int on_token(void *ud, const cg_tok_rec *rec, const char *bytes, size_t len)
{
    job *j = ud;
    (void)rec, (void)bytes, (void)len;
    int seen = __atomic_load_n(&j->seen, __ATOMIC_RELAXED);
    if (j->stamps && seen < (int)j->max_tokens) j->stamps[seen] = cg_now_ns();
    /* another thread polls seen: publish it atomically, after the stamp */
    __atomic_store_n(&j->seen, seen + 1, __ATOMIC_RELEASE);
    while (j->gate && !__atomic_load_n(j->gate, __ATOMIC_ACQUIRE)) /* a client not reading */
        th_sleep_ms(1);
    return j->stop_after > 0 && seen + 1 >= j->stop_after;
}

static void *run_job(void *arg)
{
    job *j = arg;
    char err[ERRLEN];
    cg_complete_req r = {.prompt = j->prompt,
                         .prompt_len = strlen(j->prompt),
                         .max_tokens = j->max_tokens,
                         .temperature = 0,
                         .top_p = 1,
                         .logprobs = -1,
                         .on_token = on_token,
                         .ud = j};
    j->st = cg_engine_complete(j->e, &r, cg_now_ms(), &j->res, err, sizeof err);
    if (j->st != CG_OK) fprintf(stderr, "complete: %s\n", err);
    return NULL;
}

static void run_all(job *jobs, size_t n)
{
    pthread_t th[16];
    for (size_t i = 0; i < n; i++)
        ck_assert_int_eq(pthread_create(&th[i], NULL, run_job, &jobs[i]), 0);
    for (size_t i = 0; i < n; i++)
        pthread_join(th[i], NULL);
}

/* The tokens each prompt gives alone, then in batches of every size and order: identical. */
static void check_invariance(cg_model *m)
{
    cg_engine *e = new_engine(m, 8, 8, 64);
    int32_t alone[N_PROMPTS][N_TOK];
    for (int p = 0; p < N_PROMPTS; p++) {
        job j = {.e = e, .prompt = PROMPTS[p], .max_tokens = N_TOK};
        run_job(&j);
        ck_assert_int_eq(j.st, CG_OK);
        ck_assert_uint_eq(j.res.n_tokens, N_TOK);
        memcpy(alone[p], j.res.tokens, sizeof alone[p]);
        cg_complete_result_free(&j.res);
    }
    cg_sched_stats s0 = cg_engine_sched_stats(e);
    for (int round = 0; round < 3; round++) {
        job jobs[N_PROMPTS];
        size_t n = round == 0 ? 2 : round == 1 ? 4 : N_PROMPTS;
        for (size_t i = 0; i < n; i++) /* rotate the order: each prompt at another position */
            jobs[i] = (job){
                .e = e, .prompt = PROMPTS[(i + (size_t)round) % N_PROMPTS], .max_tokens = N_TOK};
        run_all(jobs, n);
        for (size_t i = 0; i < n; i++) {
            int p = (int)((i + (size_t)round) % N_PROMPTS);
            ck_assert_int_eq(jobs[i].st, CG_OK);
            ck_assert_uint_eq(jobs[i].res.n_tokens, N_TOK);
            for (int t = 0; t < N_TOK; t++)
                ck_assert_msg(jobs[i].res.tokens[t] == alone[p][t],
                              "prompt %d, token %d: %d in a batch of %zu, %d alone", p, t,
                              jobs[i].res.tokens[t], n, alone[p][t]);
            cg_complete_result_free(&jobs[i].res);
        }
    }
    /* the concurrent rounds shared decode steps: fewer steps than decode rows */
    cg_sched_stats s1 = cg_engine_sched_stats(e);
    ck_assert_uint_gt(s1.decode_rows - s0.decode_rows, s1.steps - s0.steps);
    ck_assert_uint_eq(cg_engine_live_assemblies(e, cg_now_ms()), 0);
    cg_engine_close(&e);
}

START_TEST(batch_invariance_f32)
{
    check_invariance(m_f32);
}
END_TEST

START_TEST(batch_invariance_bf16)
{
    check_invariance(m_bf16);
}
END_TEST

START_TEST(batch_invariance_qwen2)
{
    check_invariance(m_qwen2);
}
END_TEST

START_TEST(batch_invariance_qwen3)
{
    check_invariance(m_qwen3);
}
END_TEST

/* --quant: the block-quantised kernels quantise each row of x on its own, so a decode row's
 * tokens do not depend on the batch either. */
START_TEST(batch_invariance_q8)
{
    check_invariance(m_q8);
}
END_TEST

START_TEST(batch_invariance_q4)
{
    check_invariance(m_q4);
}
END_TEST

/* A long prefill runs in pieces between decode steps: a running stream keeps receiving
 * tokens while the long prompt is computed. (An ordering property: some tokens of the stream
 * arrive after the long request began and before its first token.) */
START_TEST(prefill_interleaves_with_decode)
{
    cg_engine *e = new_engine(m_f32, 8, 8, 64);
    uint64_t stamps[64];
    job stream = {.e = e, .prompt = PROMPTS[0], .max_tokens = 64, .stamps = stamps};
    cg_buf longp;
    cg_buf_init_unbounded(&longp);
    while (longp.len < 3000)
        ck_assert_int_eq(cg_buf_append(&longp, PROMPTS[1], strlen(PROMPTS[1])), CG_OK);
    uint64_t first_long = 0;
    job big = {.e = e, .prompt = longp.data, .max_tokens = 1, .stamps = &first_long};
    pthread_t ts, tb;
    ck_assert_int_eq(pthread_create(&ts, NULL, run_job, &stream), 0);
    while (__atomic_load_n(&stream.seen, __ATOMIC_ACQUIRE) < 2)
        usleep(1000);
    uint64_t t0 = cg_now_ns();
    ck_assert_int_eq(pthread_create(&tb, NULL, run_job, &big), 0);
    pthread_join(tb, NULL);
    pthread_join(ts, NULL);
    ck_assert_int_eq(big.st, CG_OK);
    ck_assert_int_eq(stream.st, CG_OK);
    int during = 0;
    for (int i = 0; i < stream.seen && i < 64; i++)
        during += stamps[i] > t0 && stamps[i] < first_long;
    ck_assert_msg(during >= 2, "only %d stream tokens arrived while the long prompt was computed",
                  during);
    cg_sched_stats s = cg_engine_sched_stats(e);
    ck_assert_uint_ge(s.prefill_pieces, 3000 / 64); /* cut into pieces of 64 rows */
    cg_complete_result_free(&stream.res);
    cg_complete_result_free(&big.res);
    cg_buf_free(&longp);
    cg_engine_close(&e);
}
END_TEST

/* At most max_running + max_queue requests are admitted; the next is refused at once. */
START_TEST(admission)
{
    cg_engine *e = new_engine(m_f32, 2, 3, 64);
    for (int i = 0; i < 5; i++)
        ck_assert_int_eq(cg_engine_admit(e, 0), CG_OK);
    ck_assert_int_eq(cg_engine_admit(e, 0), CG_E_RATE_LIMIT);
    cg_engine_leave(e);
    ck_assert_int_eq(cg_engine_admit(e, 0), CG_OK);
    ck_assert_int_eq(cg_engine_admit(e, 0), CG_E_RATE_LIMIT);
    for (int i = 0; i < 5; i++)
        cg_engine_leave(e);
    ck_assert_uint_eq(cg_engine_sched_stats(e).refused, 2);
    ck_assert_uint_eq(cg_engine_sched_stats(e).admitted, 0);
    cg_engine_close(&e);
}
END_TEST

/* More sequences than max_running decode: the extra ones wait for a place, all finish, and
 * no step ever holds more than max_running rows. */
START_TEST(running_set_bounded)
{
    cg_engine *e = new_engine(m_f32, 2, 8, 64);
    job jobs[5];
    for (int i = 0; i < 5; i++)
        jobs[i] = (job){.e = e, .prompt = PROMPTS[i], .max_tokens = 12};
    run_all(jobs, 5);
    for (int i = 0; i < 5; i++) {
        ck_assert_int_eq(jobs[i].st, CG_OK);
        ck_assert_uint_eq(jobs[i].res.n_tokens, 12);
        cg_complete_result_free(&jobs[i].res);
    }
    cg_sched_stats s = cg_engine_sched_stats(e);
    ck_assert_uint_le(s.decode_rows, 2 * s.steps);
    ck_assert_uint_eq(s.running, 0);
    cg_engine_close(&e);
}
END_TEST

/* A caller that stops (the client left) ends its sequence at the next step; the others go on,
 * and every assembly and pool reference is given back. */
START_TEST(departures)
{
    cg_engine *e = new_engine(m_f32, 4, 4, 64);
    job jobs[3] = {{.e = e, .prompt = PROMPTS[0], .max_tokens = 40, .stop_after = 3},
                   {.e = e, .prompt = PROMPTS[1], .max_tokens = 20},
                   {.e = e, .prompt = PROMPTS[2], .max_tokens = 40, .stop_after = 1}};
    run_all(jobs, 3);
    ck_assert_int_eq(jobs[0].st, CG_OK);
    ck_assert(jobs[0].res.cancelled);
    ck_assert_uint_eq(jobs[0].res.n_tokens, 3);
    ck_assert_str_eq(jobs[0].res.finish_reason, "stop");
    ck_assert_uint_eq(jobs[1].res.n_tokens, 20);
    ck_assert_str_eq(jobs[1].res.finish_reason, "length");
    ck_assert_uint_eq(jobs[2].res.n_tokens, 1);
    for (int i = 0; i < 3; i++)
        cg_complete_result_free(&jobs[i].res);
    ck_assert_uint_eq(cg_engine_live_assemblies(e, cg_now_ms()), 0);
    ck_assert_uint_eq(cg_engine_sched_stats(e).running, 0);
    ck_assert_uint_eq(cg_pool_get_stats(cg_engine_pool(e)).referenced_chunks, 0);
    cg_engine_close(&e);
}
END_TEST

/* A caller that stops reading (a slow client) gives up its place once it is 64 tokens
 * behind: with one place, another request runs to the end meanwhile; the slow one then joins
 * again and ends with the tokens it gives alone. */
START_TEST(slow_owner_is_parked)
{
    cg_engine *e = new_engine(m_f32, 1, 8, 64);
    job alone = {.e = e, .prompt = PROMPTS[0], .max_tokens = 100};
    run_job(&alone);
    ck_assert_int_eq(alone.st, CG_OK);
    int gate = 0;
    job slow = {.e = e, .prompt = PROMPTS[0], .max_tokens = 100, .gate = &gate};
    pthread_t th;
    ck_assert_int_eq(pthread_create(&th, NULL, run_job, &slow), 0);
    int parked = 0;
    for (int t = 0; t < 30000 && !parked; t++) {
        parked = cg_engine_sched_stats(e).parked == 1;
        if (!parked) th_sleep_ms(1);
    }
    ck_assert_msg(parked, "the sequence of a caller that stopped reading was not parked");
    ck_assert_uint_eq(cg_engine_sched_stats(e).running, 0);
    job other = {.e = e, .prompt = PROMPTS[1], .max_tokens = 12};
    run_job(&other); /* would wait forever for the one place if the slow sequence held it */
    ck_assert_int_eq(other.st, CG_OK);
    ck_assert_uint_eq(other.res.n_tokens, 12);
    __atomic_store_n(&gate, 1, __ATOMIC_RELEASE);
    pthread_join(th, NULL);
    ck_assert_int_eq(slow.st, CG_OK);
    ck_assert_uint_eq(slow.res.n_tokens, 100);
    ck_assert_mem_eq(slow.res.tokens, alone.res.tokens, 100 * sizeof *alone.res.tokens);
    cg_sched_stats st = cg_engine_sched_stats(e);
    ck_assert_uint_ge(st.parked_total, 1);
    ck_assert_uint_eq(st.parked, 0);
    ck_assert_uint_eq(st.running, 0);
    cg_complete_result_free(&alone.res);
    cg_complete_result_free(&slow.res);
    cg_complete_result_free(&other.res);
    cg_engine_close(&e);
}
END_TEST

int main(void)
{
    cg_log_init("test_sched", CG_LOG_WARN);
    m_f32 = make_model("f32", NULL, dir_f32);
    m_bf16 = make_model("bf16", NULL, dir_bf16);
    m_qwen2 = make_model("bf16", "qwen2", dir_qwen2);
    m_qwen3 = make_model("bf16", "qwen3", dir_qwen3);
    m_q8 = make_model_q("bf16", NULL, CG_QUANT_Q8, dir_q8);
    m_q4 = make_model_q("bf16", "qwen2", CG_QUANT_Q4, dir_q4);
    int failed =
        th_run_tests("sched", "engine", 300,
                     TH_TESTS(batch_invariance_f32, batch_invariance_bf16, batch_invariance_qwen2,
                              batch_invariance_qwen3, batch_invariance_q8, batch_invariance_q4,
                              prefill_interleaves_with_decode, admission, running_set_bounded,
                              departures, slow_owner_is_parked));
    cg_model_close(&m_f32);
    cg_model_close(&m_bf16);
    cg_model_close(&m_qwen2);
    cg_model_close(&m_qwen3);
    cg_model_close(&m_q8);
    cg_model_close(&m_q4);
    th_rmrf(dir_q8);
    th_rmrf(dir_q4);
    th_rmrf(dir_f32);
    th_rmrf(dir_bf16);
    th_rmrf(dir_qwen2);
    th_rmrf(dir_qwen3);
    return failed ? EXIT_FAILURE : EXIT_SUCCESS;
}

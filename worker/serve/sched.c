/* The worker's scheduler: one compute thread, continuous batching of decode steps, chunked
 * FIFO prefill between them, background pieces when idle, admission (worker/serve/sched.h). */
#include "worker/serve/sched.h"

#include <math.h>
#include <pthread.h>
#include <stdlib.h>
#include <string.h>

#include "base/base.h"
#include "base/metrics.h"

/* Tokens a sequence may have sampled and not yet handed to its owner. The scheduler stops
 * stepping a sequence whose owner is this far behind (a slow client), instead of buffering:
 * it parks it (out of the running set, its KV kept by its owner) so that it holds no place
 * among max_running, and queues it to join again once its owner has read half of them. */
#define REC_RING 64u
#define REC_RESUME (REC_RING / 2)

/* The scheduler's side of a decoding sequence (guarded by the scheduler's lock). */
struct cg_dseq_sync {
    cg_tok_rec ring[REC_RING];
    uint32_t head, count; /* records not yet read */
    cg_dseq_state state;
    int cancel, left, joined;
    int parked; /* on the parked list: no place in the running set until its owner reads */
    uint32_t generated;
    int32_t last; /* the last token sampled: the next decode row */
    uint64_t join_ns;
    pthread_cond_t cv;         /* the owner waits here */
    struct cg_dseq *next_wait; /* the join queue */
};

/* Prefill work waiting for the scheduler thread. */
typedef struct pjob {
    const cg_fwd_seq *q;
    uint32_t done_rows; /* rows computed so far */
    cg_status st;
    int finished;
    uint64_t enq_ns, start_ns;
    pthread_cond_t cv;
    struct pjob *next;
} pjob;

struct cg_sched {
    const cg_model *m;
    cg_sched_params p;
    pthread_t th;
    int started, stop;
    pthread_mutex_t mu;
    pthread_cond_t work_cv; /* the scheduler waits here */
    cg_dseq **run;          /* the decoding set, max_running entries */
    uint32_t n_run;
    cg_dseq *wait_head, *wait_tail; /* joined, waiting for a place */
    cg_dseq *parked;                /* held for a slow owner (linked by next_wait) */
    uint32_t n_parked;
    pjob *pq_head, *pq_tail; /* prefill queue, FIFO */
    pjob *iq_head, *iq_tail; /* background queue, FIFO: runs only when idle */
    int idle_stopped;        /* cg_sched_stop_idle: background jobs fail */
    int interrupt;           /* live work arrived: a background piece stops (atomic) */
    uint32_t admitted;
    cg_sched_stats stats;
    cg_fwd_scratch *scratch; /* the scheduler thread's */
    cg_attn_span *spans;     /* slice spans of the piece running */
    size_t spans_cap;
    /* decode step buffers, max_running entries */
    cg_fwd_seq *fseqs;
    int32_t *toks;
    cg_attn_span *dspans;
    cg_metric *h_prefill_wait, *h_decode_wait; /* optional */
};

cg_sched_params cg_sched_default_params(void)
{
    return (cg_sched_params){.max_running = 16,
                             .max_queue = 48,
                             .prefill_chunk = 256,
                             .prefill_budget = 256,
                             .idle_chunk = 32};
}

/* ---- sampling with its record ---- */

/* The top_k most likely tokens of logits (raw, before temperature) with their logprobs, into
 * r; returns the log-normaliser. Computed before sampling modifies the logits. */
static double record_of(const float *logits, int vocab, int top_k, cg_tok_rec *r)
{
    double lse = cg_logprobs_top(logits, vocab, top_k, r->top_ids, r->top_lps);
    r->n_top = top_k < vocab ? top_k : vocab;
    return lse;
}

/* Samples d's next token; records it unless it is an EOS. Returns 1 when d goes on. */
static int sample_one(cg_sched *s, cg_dseq *d)
{
    const cg_model_config *c = cg_model_cfg(s->m);
    struct cg_dseq_sync *y = d->sync;
    cg_tok_rec r = {.n_top = 0, .logprob = 0};
    double lse = 0;
    float raw = 0;
    /* logprobs are of the raw distribution: taken before sampling scales the logits */
    if (d->top_k >= 0) {
        lse = record_of(d->logits, c->vocab_size, d->top_k, &r);
    }
    const int capture = d->cap_logits && d->cap_n < d->cap_max;
    if (capture)
        memcpy(d->cap_logits + (size_t)d->cap_n * (size_t)c->vocab_size, d->logits,
               (size_t)c->vocab_size * sizeof(float));
    /* the chosen token's raw logit is needed only for its logprob (sampling rewrites the
     * logits, so keeping it costs a copy of the vocabulary per token) */
    int32_t tok = d->top_k >= 0 ? cg_sample_keep(&d->sampler, d->logits, c->vocab_size, &raw)
                                : cg_sample(&d->sampler, d->logits, c->vocab_size);
    if (capture) d->cap_tokens[d->cap_n++] = tok;
    r.token = tok;
    r.logprob = d->top_k >= 0 ? (float)((double)raw - lse) : 0.0f;
    if (cg_model_config_is_eos(c, tok)) {
        y->state = CG_DSEQ_EOS;
        return 0;
    }
    y->ring[(y->head + y->count) % REC_RING] = r;
    y->count++;
    y->generated++;
    y->last = tok;
    if (y->generated >= d->max_tokens || d->pos >= (uint32_t)c->max_pos) {
        y->state = CG_DSEQ_LENGTH;
        return 0;
    }
    return 1;
}

/* ---- the decode step ---- */

/* Moves waiting joiners into the decoding set while there is room (under mu). */
static void admit_joiners(cg_sched *s)
{
    while (s->wait_head && s->n_run < s->p.max_running) {
        cg_dseq *d = s->wait_head;
        s->wait_head = d->sync->next_wait;
        if (!s->wait_head) s->wait_tail = NULL;
        d->sync->joined = 1;
        s->run[s->n_run++] = d;
        if (s->h_decode_wait)
            cg_metric_observe(s->h_decode_wait, (double)(cg_now_ns() - d->sync->join_ns) / 1e9);
    }
}

/* Appends d to the join queue (under mu). */
static void enqueue_waiting(cg_sched *s, cg_dseq *d)
{
    d->sync->next_wait = NULL;
    d->sync->join_ns = cg_now_ns();
    if (s->wait_tail)
        s->wait_tail->sync->next_wait = d;
    else
        s->wait_head = d;
    s->wait_tail = d;
}

/* Moves d, whose owner is REC_RING tokens behind, from the running set to the parked list
 * (under mu; the caller removes it from run). */
static void park(cg_sched *s, cg_dseq *d)
{
    d->sync->joined = 0;
    d->sync->parked = 1;
    d->sync->next_wait = s->parked;
    s->parked = d;
    s->n_parked++;
    s->stats.parked_total++;
}

/* Removes d from the parked list (under mu); 1 when it was there. */
static int unpark(cg_sched *s, cg_dseq *d)
{
    if (!d->sync->parked) return 0;
    cg_dseq **pp = &s->parked;
    while (*pp && *pp != d)
        pp = &(*pp)->sync->next_wait;
    if (*pp) *pp = d->sync->next_wait;
    d->sync->next_wait = NULL;
    d->sync->parked = 0;
    s->n_parked--;
    return 1;
}

/* Drops ended and cancelled sequences from the set and wakes their owners (under mu). */
static void drop_ended(cg_sched *s)
{
    uint32_t k = 0;
    for (uint32_t i = 0; i < s->n_run; i++) {
        cg_dseq *d = s->run[i];
        if (d->sync->cancel && d->sync->state == CG_DSEQ_RUNNING)
            d->sync->state = CG_DSEQ_CANCELLED;
        if (d->sync->state == CG_DSEQ_RUNNING) {
            s->run[k++] = d;
            continue;
        }
        d->sync->left = 1;
        pthread_cond_broadcast(&d->sync->cv);
    }
    s->n_run = k;
}

/* One step: every running sequence samples its next token (under mu), then the tokens that
 * go on run through the model together (mu released). */
static void decode_step(cg_sched *s)
{
    pthread_mutex_lock(&s->mu);
    drop_ended(s);
    size_t n = 0;
    cg_dseq *step[s->p.max_running > 0 ? s->p.max_running : 1];
    uint32_t kept = 0;
    for (uint32_t i = 0; i < s->n_run; i++) {
        cg_dseq *d = s->run[i];
        if (d->sync->count >= REC_RING && !d->sync->cancel) {
            park(s, d); /* its owner is behind: give its place to another */
            continue;
        }
        s->run[kept++] = d;
        int more = sample_one(s, d);
        pthread_cond_broadcast(&d->sync->cv);
        if (more) {
            s->toks[n] = d->sync->last;
            step[n++] = d;
        }
    }
    s->n_run = kept;
    drop_ended(s);
    pthread_mutex_unlock(&s->mu);
    if (!n) return;
    for (size_t i = 0; i < n; i++) {
        cg_dseq *d = step[i];
        uint32_t pos = d->pos;
        if (pos >= cg_kv_cap(d->kv)) d->kv = d->grow(d->grow_ud, d->kv, pos, pos + 1);
        s->dspans[i] = (cg_attn_span){pos, 1, 0, 0};
        s->fseqs[i] = (cg_fwd_seq){.kv = d->kv,
                                   .tokens = &s->toks[i],
                                   .n = 1,
                                   .slot0 = pos,
                                   .pos0 = pos,
                                   .spans = &s->dspans[i],
                                   .n_spans = 1,
                                   .logits = d->logits};
    }
    cg_status st = cg_model_forward_batch(s->m, s->fseqs, n, CG_FWD_DECODE, s->scratch);
    pthread_mutex_lock(&s->mu);
    for (size_t i = 0; i < n; i++) {
        step[i]->pos++;
        if (st != CG_OK) step[i]->sync->state = CG_DSEQ_FAILED;
    }
    s->stats.steps++;
    s->stats.decode_rows += n;
    pthread_mutex_unlock(&s->mu);
}

/* ---- prefill pieces ---- */

/* Ends job j of queue (*head, *tail) with status st and wakes its owner (under mu). */
static void finish_job(pjob **head, pjob **tail, pjob *j, cg_status st)
{
    j->st = st;
    j->finished = 1;
    *head = j->next;
    if (!*head) *tail = NULL;
    pthread_cond_broadcast(&j->cv);
}

/* Fails every background job (under mu): the scheduler stops or background work was stopped. */
static void fail_idle_jobs(cg_sched *s)
{
    while (s->iq_head) {
        finish_job(&s->iq_head, &s->iq_tail, s->iq_head, CG_E_UNAVAILABLE);
        s->stats.idle_waiting--;
    }
}

/* Runs the next piece of the head job of the prefill queue, or of the background queue (idle)
 * when nothing else waits; returns its rows (0: nothing ran). */
static uint32_t run_piece(cg_sched *s, int idle)
{
    pthread_mutex_lock(&s->mu);
    pjob *j = idle ? s->iq_head : s->pq_head;
    if (idle && (s->n_run || s->wait_head || s->pq_head || s->admitted))
        j = NULL; /* live work first */
    /* Under the lock: live work that arrives from now on sets it again. */
    if (idle && j) __atomic_store_n(&s->interrupt, 0, __ATOMIC_RELEASE);
    pthread_mutex_unlock(&s->mu);
    if (!j) return 0;
    if (!j->start_ns) j->start_ns = cg_now_ns();
    const cg_fwd_seq *q = j->q;
    uint32_t n = CG_MIN(idle ? s->p.idle_chunk : s->p.prefill_chunk, q->n - j->done_rows);
    if (q->n_spans > s->spans_cap) {
        s->spans = cg_realloc(s->spans, q->n_spans * sizeof *s->spans);
        s->spans_cap = q->n_spans;
    }
    cg_fwd_seq piece = cg_fwd_seq_slice(q, j->done_rows, n, s->spans);
    if (idle) piece.interrupt = &s->interrupt;
    cg_status st = cg_model_forward_batch(s->m, &piece, 1, CG_FWD_PREFILL, s->scratch);
    pthread_mutex_lock(&s->mu);
    if (idle && st == CG_E_UNAVAILABLE) { /* stopped for live work: the piece runs again */
        s->stats.idle_interrupts++;
        pthread_mutex_unlock(&s->mu);
        return 0;
    }
    j->done_rows += n;
    if (idle) {
        s->stats.idle_pieces++;
        s->stats.idle_rows += n;
    } else {
        s->stats.prefill_pieces++;
        s->stats.prefill_rows += n;
    }
    if (st != CG_OK || j->done_rows == q->n) {
        if (idle) {
            finish_job(&s->iq_head, &s->iq_tail, j, st);
            s->stats.idle_waiting--;
        } else {
            finish_job(&s->pq_head, &s->pq_tail, j, st);
            s->stats.prefill_waiting--;
        }
    }
    pthread_mutex_unlock(&s->mu);
    return n;
}

static void *sched_main(void *arg)
{
    cg_sched *s = arg;
    for (;;) {
        pthread_mutex_lock(&s->mu);
        admit_joiners(s);
        /* background work waits while a request is admitted, even between its phases */
        while (!s->stop && !s->n_run && !s->pq_head &&
               !(s->iq_head && (!s->admitted || s->idle_stopped))) {
            pthread_cond_wait(&s->work_cv, &s->mu);
            admit_joiners(s);
        }
        int stop = s->stop && !s->n_run && !s->pq_head;
        if (stop || s->idle_stopped) fail_idle_jobs(s);
        int decoding = s->n_run > 0;
        pthread_mutex_unlock(&s->mu);
        if (stop) break;
        if (decoding) decode_step(s);
        /* Prefill between two decode steps: at most the budget while sequences decode, one
         * piece at a time otherwise (so a joiner starts at the next step). */
        uint32_t budget = decoding ? s->p.prefill_budget : 1, done = 0;
        while (done < budget) {
            uint32_t rows = run_piece(s, 0);
            if (!rows) break;
            done += rows;
        }
        /* Nothing live ran: one background piece, then everything is looked at again. */
        if (!decoding && !done) (void)run_piece(s, 1);
    }
    return NULL;
}

/* ---- lifetime ---- */

cg_status cg_sched_open(const cg_model *m, cg_sched_params p, cg_sched **out)
{
    *out = NULL;
    if (!p.max_running || !p.prefill_chunk || !p.prefill_budget) return CG_E_VALUE;
    if (!p.idle_chunk) p.idle_chunk = cg_sched_default_params().idle_chunk;
    cg_sched *s = cg_calloc(1, sizeof *s);
    s->m = m;
    s->p = p;
    pthread_mutex_init(&s->mu, NULL);
    pthread_cond_init(&s->work_cv, NULL);
    s->run = cg_calloc(p.max_running, sizeof *s->run);
    s->fseqs = cg_calloc(p.max_running, sizeof *s->fseqs);
    s->toks = cg_calloc(p.max_running, sizeof *s->toks);
    s->dspans = cg_calloc(p.max_running, sizeof *s->dspans);
    s->scratch = cg_fwd_scratch_new();
    if (pthread_create(&s->th, NULL, sched_main, s) != 0) {
        cg_sched_close(&s);
        return CG_E_INTERNAL;
    }
    s->started = 1;
    *out = s;
    return CG_OK;
}

void cg_sched_close(cg_sched **sp)
{
    cg_sched *s = *sp;
    if (!s) return;
    if (s->started) cg_thread_stop(s->th, &s->mu, &s->work_cv, &s->stop);
    cg_fwd_scratch_free(&s->scratch);
    free(s->spans);
    free(s->run);
    free(s->fseqs);
    free(s->toks);
    free(s->dspans);
    pthread_mutex_destroy(&s->mu);
    pthread_cond_destroy(&s->work_cv);
    cg_free(sp);
}

/* ---- admission ---- */

cg_status cg_sched_admit(cg_sched *s, int force)
{
    cg_status st = CG_OK;
    pthread_mutex_lock(&s->mu);
    if (!force && s->admitted >= s->p.max_running + s->p.max_queue) {
        s->stats.refused++;
        st = CG_E_RATE_LIMIT;
    } else {
        s->admitted++;
        __atomic_store_n(&s->interrupt, 1, __ATOMIC_RELEASE);
    }
    pthread_mutex_unlock(&s->mu);
    return st;
}

void cg_sched_release(cg_sched *s)
{
    pthread_mutex_lock(&s->mu);
    if (s->admitted) s->admitted--;
    if (!s->admitted && s->iq_head) pthread_cond_signal(&s->work_cv); /* background may run */
    pthread_mutex_unlock(&s->mu);
}

/* ---- prefill ---- */

/* Queues q (idle: on the background queue) and waits until it is computed. */
static cg_status submit(cg_sched *s, const cg_fwd_seq *q, uint64_t *queued_ns, int idle)
{
    pjob j = {.q = q, .enq_ns = cg_now_ns()};
    if (!q->n) return CG_E_VALUE;
    pthread_cond_init(&j.cv, NULL);
    pthread_mutex_lock(&s->mu);
    if (idle && s->idle_stopped) {
        pthread_mutex_unlock(&s->mu);
        pthread_cond_destroy(&j.cv);
        return CG_E_UNAVAILABLE;
    }
    pjob **head = idle ? &s->iq_head : &s->pq_head, **tail = idle ? &s->iq_tail : &s->pq_tail;
    if (*tail)
        (*tail)->next = &j;
    else
        *head = &j;
    *tail = &j;
    if (idle) {
        s->stats.idle_waiting++;
    } else {
        s->stats.prefill_waiting++;
        __atomic_store_n(&s->interrupt, 1, __ATOMIC_RELEASE);
    }
    pthread_cond_signal(&s->work_cv);
    while (!j.finished)
        pthread_cond_wait(&j.cv, &s->mu);
    pthread_mutex_unlock(&s->mu);
    pthread_cond_destroy(&j.cv);
    uint64_t waited = j.start_ns > j.enq_ns ? j.start_ns - j.enq_ns : 0;
    if (queued_ns) *queued_ns = waited;
    /* background work waits by design: it is not a live request's queue time */
    if (s->h_prefill_wait && !idle) cg_metric_observe(s->h_prefill_wait, (double)waited / 1e9);
    return j.st;
}

cg_status cg_sched_prefill(cg_sched *s, const cg_fwd_seq *q, uint64_t *queued_ns)
{
    return submit(s, q, queued_ns, 0);
}

cg_status cg_sched_prefill_idle(cg_sched *s, const cg_fwd_seq *q, uint64_t *queued_ns)
{
    return submit(s, q, queued_ns, 1);
}

void cg_sched_stop_idle(cg_sched *s)
{
    pthread_mutex_lock(&s->mu);
    s->idle_stopped = 1;
    pthread_cond_signal(&s->work_cv); /* the scheduler fails the queued jobs */
    pthread_mutex_unlock(&s->mu);
}

/* ---- decode ---- */

void cg_sched_join(cg_sched *s, cg_dseq *d)
{
    d->sync = cg_calloc(1, sizeof *d->sync);
    pthread_cond_init(&d->sync->cv, NULL);
    d->sync->state = CG_DSEQ_RUNNING;
    pthread_mutex_lock(&s->mu);
    enqueue_waiting(s, d);
    __atomic_store_n(&s->interrupt, 1, __ATOMIC_RELEASE);
    pthread_cond_signal(&s->work_cv);
    pthread_mutex_unlock(&s->mu);
}

int cg_sched_next(cg_sched *s, cg_dseq *d, cg_tok_rec *rec, cg_dseq_state *state)
{
    struct cg_dseq_sync *y = d->sync;
    pthread_mutex_lock(&s->mu);
    while (!y->count && !y->left)
        pthread_cond_wait(&y->cv, &s->mu);
    int got = 0;
    if (y->count) {
        *rec = y->ring[y->head];
        y->head = (y->head + 1) % REC_RING;
        y->count--;
        got = 1;
        /* a sequence parked for its owner joins again once half its records are read */
        if (y->count <= REC_RESUME && !y->cancel && unpark(s, d)) enqueue_waiting(s, d);
        pthread_cond_signal(&s->work_cv);
    }
    *state = y->state;
    pthread_mutex_unlock(&s->mu);
    return got;
}

void cg_sched_cancel(cg_sched *s, cg_dseq *d)
{
    pthread_mutex_lock(&s->mu);
    d->sync->cancel = 1;
    if (unpark(s, d)) { /* no step will drop it: it ends here */
        if (d->sync->state == CG_DSEQ_RUNNING) d->sync->state = CG_DSEQ_CANCELLED;
        d->sync->left = 1;
        pthread_cond_broadcast(&d->sync->cv);
    }
    pthread_cond_signal(&s->work_cv);
    pthread_mutex_unlock(&s->mu);
}

/* Removes d from the join queue when it never got a place (under mu). */
static void unlink_waiting(cg_sched *s, cg_dseq *d)
{
    cg_dseq *prev = NULL;
    for (cg_dseq *w = s->wait_head; w; prev = w, w = w->sync->next_wait) {
        if (w != d) continue;
        if (prev)
            prev->sync->next_wait = w->sync->next_wait;
        else
            s->wait_head = w->sync->next_wait;
        if (s->wait_tail == d) s->wait_tail = prev;
        d->sync->left = 1;
        return;
    }
}

void cg_sched_leave(cg_sched *s, cg_dseq *d)
{
    struct cg_dseq_sync *y = d->sync;
    if (!y) return;
    pthread_mutex_lock(&s->mu);
    y->cancel = 1;
    if (unpark(s, d))
        y->left = 1;
    else if (!y->joined)
        unlink_waiting(s, d);
    pthread_cond_signal(&s->work_cv);
    while (!y->left)
        pthread_cond_wait(&y->cv, &s->mu);
    pthread_mutex_unlock(&s->mu);
    pthread_cond_destroy(&y->cv);
    cg_free(&d->sync);
}

cg_sched_stats cg_sched_get_stats(cg_sched *s)
{
    pthread_mutex_lock(&s->mu);
    cg_sched_stats st = s->stats;
    st.running = s->n_run;
    st.parked = s->n_parked;
    st.admitted = s->admitted;
    pthread_mutex_unlock(&s->mu);
    return st;
}

void cg_sched_load(cg_sched *s, uint32_t *running, uint32_t *queued)
{
    pthread_mutex_lock(&s->mu);
    *running = s->n_run;
    *queued = s->admitted > s->n_run ? s->admitted - s->n_run : 0;
    pthread_mutex_unlock(&s->mu);
}

void cg_sched_set_queue_histograms(cg_sched *s, struct cg_metric *prefill, struct cg_metric *decode)
{
    s->h_prefill_wait = prefill;
    s->h_decode_wait = decode;
}

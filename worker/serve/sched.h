/* The worker's scheduler (DESIGN §14): one thread runs every forward pass. Decoding sequences
 * are stepped together, their decode tokens one batch through every weight product
 * (continuous batching: sequences join and leave between steps). Prefill work (assemble,
 * plain prompts) runs in pieces of at most prefill_chunk rows, FIFO by arrival, with at most
 * prefill_budget rows between two decode steps, so running streams keep flowing while a cold
 * prompt is computed. A decode row always goes through the batch-invariant kernels, and a
 * prompt is always cut at the same piece boundaries, so a greedy request gives the same tokens
 * alone and in any batch. Admission bounds the requests in the worker. Background work (the
 * quality canary) has a queue of its own that runs only while no request is admitted and the
 * scheduler has nothing else to do, in small pieces; a live request arriving stops the piece
 * at its next layer (the piece runs again later), so it waits at most for one layer. */
#ifndef CG_SCHED_H
#define CG_SCHED_H

#include <stddef.h>
#include <stdint.h>

#include "base/status.h"
#include "worker/model/model.h"

typedef struct cg_sched cg_sched;

typedef struct cg_sched_params {
    uint32_t max_running;    /* decoding sequences stepped together; default 16 */
    uint32_t max_queue;      /* admitted requests beyond max_running; default 48 */
    uint32_t prefill_chunk;  /* rows per prefill piece; default 256 */
    uint32_t prefill_budget; /* prefill rows between two decode steps; default 256 */
    uint32_t idle_chunk;     /* rows per background piece (cg_sched_prefill_idle); default 32;
                                0 = the default */
} cg_sched_params;

cg_sched_params cg_sched_default_params(void);

/* Starts the scheduler thread for model m (borrowed; it must outlive the scheduler). Caller
 * closes with cg_sched_close, after every request has left. */
cg_status cg_sched_open(const cg_model *m, cg_sched_params p, cg_sched **out) CG_WUR;
void cg_sched_close(cg_sched **s);

/* ---- admission ---- */

/* Admits one request (an assemble or a completion) when fewer than max_running + max_queue
 * are admitted: CG_OK, or CG_E_RATE_LIMIT at once. force: admit anyway (a completion of an
 * assembly this worker built: refusing it would throw away work already done). Every CG_OK is
 * paired with cg_sched_release. */
cg_status cg_sched_admit(cg_sched *s, int force) CG_WUR;
void cg_sched_release(cg_sched *s);

/* ---- prefill ---- */

/* Runs q on the prefill kernels on the scheduler thread, in pieces of at most prefill_chunk
 * rows, behind the prefill work queued before it; blocks until done. Returns the forward
 * pass's status. *queued_ns (may be NULL) receives the time before its first piece ran. */
cg_status cg_sched_prefill(cg_sched *s, const cg_fwd_seq *q, uint64_t *queued_ns) CG_WUR;

/* The same at background priority: a piece of at most idle_chunk rows runs only when no
 * request is admitted (cg_sched_admit), no sequence decodes or waits to join and no prefill
 * is queued; an admission, a prefill or a join meanwhile interrupts the piece between two
 * layers, and it runs again once the worker is idle. FIFO among background jobs; blocks until
 * done (which may be long under load). */
cg_status cg_sched_prefill_idle(cg_sched *s, const cg_fwd_seq *q, uint64_t *queued_ns) CG_WUR;
/* For shutdown: from now on background jobs fail with CG_E_UNAVAILABLE (queued ones before
 * their next piece, new ones at once), so their owners can be joined without waiting for them. */
void cg_sched_stop_idle(cg_sched *s);

/* ---- decode ---- */

/* Most top entries a token record carries (vLLM's limit). */
#define CG_SCHED_TOP_MAX 20

/* One generated token as the scheduler sampled it. */
typedef struct cg_tok_rec {
    int32_t token;
    float logprob; /* of token under the distribution it was drawn from (raw logits) */
    int n_top;     /* entries below: the most likely tokens, best first */
    int32_t top_ids[CG_SCHED_TOP_MAX];
    float top_lps[CG_SCHED_TOP_MAX];
} cg_tok_rec;

typedef enum {
    CG_DSEQ_RUNNING,
    CG_DSEQ_EOS,       /* an EOS id was sampled (not reported as a token) */
    CG_DSEQ_LENGTH,    /* max_tokens generated, or the model's last position reached */
    CG_DSEQ_CANCELLED, /* cg_sched_cancel */
    CG_DSEQ_FAILED,    /* a forward pass failed */
} cg_dseq_state;

/* A decoding sequence. The owner fills the fields up to grow_ud, joins it, reads its tokens
 * with cg_sched_next until it ends, then leaves. */
typedef struct cg_dseq {
    cg_kv *kv;           /* holds the prompt in slots [0, pos) */
    uint32_t pos;        /* the next slot and position */
    float *logits;       /* vocab_size floats: the next token is sampled from them; the
                            scheduler overwrites them at every step */
    cg_sampler sampler;  /* the request's temperature, top_p and seed */
    uint32_t max_tokens; /* > 0 */
    int top_k;           /* -1: no logprobs (records carry the token only); else the top
                            entries per record, 0..CG_SCHED_TOP_MAX */
    /* Makes kv hold at least need slots, on the scheduler thread (the owner does not touch kv
     * while joined). Returns the KV to use (the same or a new one holding slots [0, pos)). */
    cg_kv *(*grow)(void *ud, cg_kv *kv, uint32_t pos, uint32_t need);
    void *grow_ud;
    /* Optional capture of the distributions sampled from (a quality probe): the first cap_max
     * samples copy their raw logits (before temperature) to cap_logits + i * vocab_size and
     * the token drawn to cap_tokens[i] (an EOS included); cap_n counts them. The scheduler
     * writes these while d is joined; the owner reads them after cg_sched_leave. */
    float *cap_logits;
    int32_t *cap_tokens;
    uint32_t cap_max, cap_n;
    struct cg_dseq_sync *sync; /* the scheduler's; opaque */
} cg_dseq;

/* Joins d to the decoding set, waiting for a place among max_running. A sequence whose owner
 * has not read its last 64 tokens (a slow client) is parked: it leaves the running set,
 * keeping its KV and its place in the admitted count, so others may run, and joins the queue
 * again once its owner has read half of them. */
void cg_sched_join(cg_sched *s, cg_dseq *d);
/* Waits for d's next token: 1 with *rec filled, or 0 once d has ended (then *state says how,
 * and every token was delivered). */
int cg_sched_next(cg_sched *s, cg_dseq *d, cg_tok_rec *rec, cg_dseq_state *state);
/* Asks the scheduler to drop d at its next step (the client left, a stop sequence matched). */
void cg_sched_cancel(cg_sched *s, cg_dseq *d);
/* Waits until the scheduler no longer uses d (it has ended or been dropped); then the owner
 * may free d, its KV and logits. */
void cg_sched_leave(cg_sched *s, cg_dseq *d);

typedef struct cg_sched_stats {
    uint64_t steps;          /* decode steps */
    uint64_t decode_rows;    /* decode tokens computed in them */
    uint64_t prefill_pieces; /* prefill pieces run */
    uint64_t prefill_rows;
    uint64_t refused;     /* cg_sched_admit refusals */
    uint64_t idle_pieces; /* background pieces run to the end */
    uint64_t idle_rows;
    uint64_t idle_interrupts; /* background pieces stopped for live work (run again) */
    uint64_t parked_total;    /* sequences parked because their owner fell behind */
    uint32_t running, admitted, prefill_waiting; /* now */
    uint32_t parked;       /* now: held for a slow owner, outside the running set */
    uint32_t idle_waiting; /* background jobs queued now */
} cg_sched_stats;
cg_sched_stats cg_sched_get_stats(cg_sched *s);
/* The load the worker reports to gateways, in GET /healthz and in its chunk events, so every
 * gateway replica sees the same numbers: *running gets the sequences decoding, *queued the
 * admitted requests not decoding (prefilling, waiting for a place, or parked). */
void cg_sched_load(cg_sched *s, uint32_t *running, uint32_t *queued);

/* Histograms (borrowed; they must outlive the scheduler) that receive, in seconds, how long
 * prefill work waited for its first piece and how long a decoding sequence waited for a place
 * in the running set. Set once, before any request. */
struct cg_metric;
void cg_sched_set_queue_histograms(cg_sched *s, struct cg_metric *prefill,
                                   struct cg_metric *decode);

#endif

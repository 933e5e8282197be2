/* The worker's quality canary (worker/serve/api_canary.h). */
#include "worker/serve/api_canary.h"

#include <math.h>
#include <pthread.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/random.h>

#include "base/base.h"

#define P "chunkgate_worker_"

/* Label values are bucketed so that a client choosing settings freely cannot make the series
 * count grow without bound: the ratio to steps of 0.05 (21 values), the prefix tokens to 6
 * ranges. With two modes and two selections at most 504 settings. */
#define MAX_SETTINGS (2 * 21 * 6 * 2)

static const double KL_BUCKETS[] = {1e-6, 1e-5, 1e-4, 1e-3, 3e-3, 0.01, 0.03, 0.1, 0.3, 1, 3};
static const double AGREE_BUCKETS[] = {0.5, 0.75, 0.9, 0.95, 0.99, 1};

/* The figures of one setting. */
typedef struct setting {
    char mode[8], ratio[8], prefix[8], select[12];
    char labels[128]; /* the Prometheus label set of the four */
    uint64_t requests, tokens, agreed;
    double kl_sum; /* of the per-request means */
} setting;

struct cg_canary {
    cg_engine *e;
    cg_metrics *m;
    double rate;
    uint64_t seed, counter; /* sampling: a hash of a counter (atomic) */
    pthread_mutex_t mu;
    pthread_cond_t cv;
    cg_probe **q; /* ring of waiting probes */
    uint64_t *qt; /* when each was queued (ns) */
    uint32_t cap, head, n;
    int stop, started;
    pthread_t th;
    setting set[MAX_SETTINGS];
    size_t n_set;
    uint64_t dropped, failed;
};

static uint64_t splitmix(uint64_t x)
{
    x += 0x9e3779b97f4a7c15ull;
    x = (x ^ (x >> 30)) * 0xbf58476d1ce4e5b9ull;
    x = (x ^ (x >> 27)) * 0x94d049bb133111ebull;
    return x ^ (x >> 31);
}

int cg_canary_sample(cg_canary *c)
{
    if (c->rate <= 0) return 0;
    if (c->rate >= 1) return 1;
    uint64_t k = __atomic_fetch_add(&c->counter, 1, __ATOMIC_RELAXED);
    return (double)(splitmix(c->seed ^ k) >> 11) * 0x1.0p-53 < c->rate;
}

/* ---- recording ---- */

static void labels_of(const cg_probe *p, setting *s)
{
    snprintf(s->mode, sizeof s->mode, "%s", cg_mode_name(p->mode));
    snprintf(s->ratio, sizeof s->ratio, "%.2f", round(p->recompute_ratio * 20.0) / 20.0);
    uint32_t k = p->recompute_prefix_tokens;
    snprintf(s->prefix, sizeof s->prefix, "%s",
             k == 0    ? "0"
             : k <= 8  ? "1-8"
             : k <= 16 ? "9-16"
             : k <= 32 ? "17-32"
             : k <= 64 ? "33-64"
                       : "65+");
    snprintf(s->select, sizeof s->select, "%s", cg_select_names[p->recompute_select]);
    snprintf(s->labels, sizeof s->labels,
             "mode=\"%s\",recompute_ratio=\"%s\",recompute_prefix_tokens=\"%s\","
             "recompute_select=\"%s\"",
             s->mode, s->ratio, s->prefix, s->select);
}

static void count(cg_canary *c, const char *kind, const char *result)
{
    char labels[64];
    snprintf(labels, sizeof labels, "kind=\"%s\",result=\"%s\"", kind, result);
    cg_metrics_inc(c->m, P "canary_requests_total",
                   "Reuse-quality comparisons by kind (sampled, probe) and result (ok, dropped, "
                   "failed)",
                   labels, 1);
}

static void record(cg_canary *c, const cg_probe *p, const cg_quality *q, const char *kind,
                   double seconds)
{
    setting key;
    memset(&key, 0, sizeof key);
    labels_of(p, &key);
    pthread_mutex_lock(&c->mu);
    setting *s = NULL;
    for (size_t i = 0; i < c->n_set && !s; i++)
        if (!strcmp(c->set[i].labels, key.labels)) s = &c->set[i];
    if (!s && c->n_set < MAX_SETTINGS) {
        s = &c->set[c->n_set++];
        *s = key;
    }
    if (s) {
        s->requests++;
        s->tokens += q->tokens_compared;
        s->agreed += q->top1_agreed;
        s->kl_sum += q->kl;
    }
    pthread_mutex_unlock(&c->mu);
    const char *l = key.labels;
    cg_metric_observe(cg_metrics_histogram(c->m, P "canary_kl_nats",
                                           "KL(full || reused) of the next-token distributions, "
                                           "mean over a request's compared positions (nats)",
                                           l, KL_BUCKETS, CG_ARRAY_LEN(KL_BUCKETS)),
                      q->kl);
    cg_metric_observe(cg_metrics_histogram(c->m, P "canary_top1_agreement_ratio",
                                           "Share of a request's compared positions where the "
                                           "reused and the full forward agree on the top token",
                                           l, AGREE_BUCKETS, CG_ARRAY_LEN(AGREE_BUCKETS)),
                      q->tokens_compared ? (double)q->top1_agreed / q->tokens_compared : 1);
    cg_metrics_inc(c->m, P "canary_tokens_compared_total",
                   "Positions compared by the canary (the prompt's end and generated tokens)", l,
                   q->tokens_compared);
    cg_metrics_inc(c->m, P "canary_top1_agreed_total",
                   "Compared positions where reused and full forward agree on the top token", l,
                   q->top1_agreed);
    cg_metric_observe(cg_metrics_histogram(c->m, P "canary_seconds",
                                           "Time from an answer's end to its comparison's result",
                                           NULL, cg_metrics_latency_buckets, cg_metrics_latency_n),
                      seconds);
    count(c, kind, "ok");
}

cg_status cg_canary_run(cg_canary *c, const cg_probe *p, cg_quality *out)
{
    uint64_t t0 = cg_now_ns();
    cg_status st = cg_engine_probe_compare(c->e, p, out);
    if (st == CG_OK) {
        record(c, p, out, "probe", (double)(cg_now_ns() - t0) / 1e9);
    } else {
        __atomic_add_fetch(&c->failed, 1, __ATOMIC_RELAXED);
        count(c, "probe", "failed");
    }
    return st;
}

/* ---- the background thread ---- */

static void set_queue_gauge(cg_canary *c, uint32_t n)
{
    cg_metric_set(cg_metrics_gauge(c->m, P "canary_queue",
                                   "Sampled comparisons waiting for the background", NULL),
                  n);
}

static void *canary_main(void *arg)
{
    cg_canary *c = arg;
    cg_log_set_request_id("canary");
    pthread_mutex_lock(&c->mu);
    for (;;) {
        while (!c->stop && !c->n)
            pthread_cond_wait(&c->cv, &c->mu);
        if (c->stop) break;
        cg_probe *p = c->q[c->head];
        uint64_t t0 = c->qt[c->head];
        c->q[c->head] = NULL;
        c->head = (c->head + 1) % c->cap;
        uint32_t left = --c->n;
        pthread_mutex_unlock(&c->mu);
        set_queue_gauge(c, left);
        cg_quality q;
        cg_status st = cg_engine_probe_compare(c->e, p, &q);
        if (st == CG_OK) {
            record(c, p, &q, "sampled", (double)(cg_now_ns() - t0) / 1e9);
        } else if (st != CG_E_UNAVAILABLE) { /* not stopped: a real failure */
            cg_log(CG_LOG_WARN, "canary comparison failed: %s", cg_status_name(st));
            __atomic_add_fetch(&c->failed, 1, __ATOMIC_RELAXED);
            count(c, "sampled", "failed");
        }
        cg_probe_free(&p);
        pthread_mutex_lock(&c->mu);
    }
    pthread_mutex_unlock(&c->mu);
    return NULL;
}

void cg_canary_submit(cg_canary *c, cg_probe **pp)
{
    cg_probe *p = *pp;
    *pp = NULL;
    if (!p) return;
    pthread_mutex_lock(&c->mu);
    int full = c->stop || c->n == c->cap;
    if (!full) {
        c->q[(c->head + c->n) % c->cap] = p;
        c->qt[(c->head + c->n) % c->cap] = cg_now_ns();
        c->n++;
        p = NULL;
        pthread_cond_signal(&c->cv);
    }
    uint32_t n = c->n;
    if (full) c->dropped++;
    pthread_mutex_unlock(&c->mu);
    set_queue_gauge(c, n);
    if (full) {
        count(c, "sampled", "dropped");
        cg_probe_free(&p);
    }
}

cg_canary *cg_canary_new(cg_engine *e, cg_metrics *m, double rate, uint32_t queue)
{
    cg_canary *c = cg_calloc(1, sizeof *c);
    c->e = e;
    c->m = m;
    c->rate = rate;
    c->cap = queue ? queue : 1;
    c->q = cg_calloc(c->cap, sizeof *c->q);
    c->qt = cg_calloc(c->cap, sizeof *c->qt);
    if (getrandom(&c->seed, sizeof c->seed, 0) != (ssize_t)sizeof c->seed) c->seed = cg_now_ns();
    pthread_mutex_init(&c->mu, NULL);
    pthread_cond_init(&c->cv, NULL);
    c->started = pthread_create(&c->th, NULL, canary_main, c) == 0;
    if (!c->started) cg_log(CG_LOG_WARN, "canary thread not started: sampled comparisons off");
    if (!c->started) c->stop = 1;
    return c;
}

void cg_canary_free(cg_canary **cp)
{
    cg_canary *c = *cp;
    if (!c) return;
    *cp = NULL;
    pthread_mutex_lock(&c->mu);
    c->stop = 1;
    pthread_cond_signal(&c->cv);
    pthread_mutex_unlock(&c->mu);
    if (c->e) cg_engine_stop_background(c->e); /* a comparison in progress ends now */
    if (c->started) pthread_join(c->th, NULL);
    for (uint32_t i = 0; i < c->cap; i++)
        cg_probe_free(&c->q[i]);
    free(c->q);
    free(c->qt);
    pthread_mutex_destroy(&c->mu);
    pthread_cond_destroy(&c->cv);
    free(c);
}

/* ---- JSON ---- */

json_t *cg_canary_quality_json(const cg_quality *q)
{
    return json_pack(
        "{s:f, s:f, s:f, s:f, s:i, s:i}", "kl", q->kl, "kl_max", q->kl_max, "kl_first", q->kl_first,
        "top1_agree", q->tokens_compared ? (double)q->top1_agreed / q->tokens_compared : 1.0,
        "top1_agreed", (int)q->top1_agreed, "tokens_compared", (int)q->tokens_compared);
}

json_t *cg_canary_summary_json(cg_canary *c)
{
    json_t *rows = json_array();
    uint64_t req = 0, tok = 0, agr = 0;
    double kl = 0;
    pthread_mutex_lock(&c->mu);
    for (size_t i = 0; i < c->n_set; i++) {
        const setting *s = &c->set[i];
        req += s->requests;
        tok += s->tokens;
        agr += s->agreed;
        kl += s->kl_sum;
        json_array_append_new(
            rows, json_pack("{s:s, s:s, s:s, s:s, s:I, s:I, s:f, s:f}", "mode", s->mode,
                            "recompute_ratio", s->ratio, "recompute_prefix_tokens", s->prefix,
                            "recompute_select", s->select, "requests", (json_int_t)s->requests,
                            "tokens_compared", (json_int_t)s->tokens, "top1_agreement",
                            s->tokens ? (double)s->agreed / s->tokens : 1.0, "kl_mean",
                            s->requests ? s->kl_sum / s->requests : 0.0));
    }
    uint64_t dropped = c->dropped;
    pthread_mutex_unlock(&c->mu);
    return json_pack("{s:f, s:I, s:I, s:I, s:I, s:I, s:o, s:o, s:o}", "rate", c->rate, "requests",
                     (json_int_t)req, "dropped", (json_int_t)dropped, "failed",
                     (json_int_t)__atomic_load_n(&c->failed, __ATOMIC_RELAXED), "tokens_compared",
                     (json_int_t)tok, "top1_agreed", (json_int_t)agr, "top1_agreement",
                     tok ? json_real((double)agr / tok) : json_null(), "kl_mean",
                     req ? json_real(kl / req) : json_null(), "settings", rows);
}

/* Prometheus metrics registry: series are created once and updated under a lock. */
#include "base/metrics.h"

#include <math.h>
#include <pthread.h>
#include <stdio.h>
#include <string.h>

typedef enum { M_COUNTER, M_GAUGE, M_HISTOGRAM } mtype;

struct cg_metric {
    char *name, *labels;
    mtype type;
    double value;     /* counter/gauge */
    double *bounds;   /* histogram */
    uint64_t *counts; /* per bucket (not cumulative), n_bounds + 1 */
    size_t n_bounds;
    double sum;
    uint64_t count;
    cg_metric *next;
    uint64_t hash;     /* of type, name and labels: the index's key */
    cg_metric *bucket; /* next series in the same index bucket */
};

typedef struct family {
    char *name, *help;
    mtype type;
    struct family *next;
} family;

struct cg_metrics {
    pthread_mutex_t mu;
    cg_metric *series, *tail; /* in creation order: the exposition's order */
    cg_metric **index;        /* hash buckets over the series: lookups stay O(1) per call */
    size_t index_cap, n_series;
    family *families, *ftail;
};

const double cg_metrics_latency_buckets[] = {0.001, 0.0025, 0.005, 0.01, 0.025, 0.05, 0.1, 0.25,
                                             0.5,   1,      2.5,   5,    10,    30,   60};
const size_t cg_metrics_latency_n = CG_ARRAY_LEN(cg_metrics_latency_buckets);

cg_metrics *cg_metrics_new(void)
{
    cg_metrics *m = cg_calloc(1, sizeof *m);
    pthread_mutex_init(&m->mu, NULL);
    return m;
}

void cg_metrics_free(cg_metrics **mp)
{
    cg_metrics *m = *mp;
    if (!m) return;
    *mp = NULL;
    for (cg_metric *s = m->series, *n; s; s = n) {
        n = s->next;
        free(s->name);
        free(s->labels);
        free(s->bounds);
        free(s->counts);
        free(s);
    }
    for (family *f = m->families, *n; f; f = n) {
        n = f->next;
        free(f->name);
        free(f->help);
        free(f);
    }
    free(m->index);
    pthread_mutex_destroy(&m->mu);
    free(m);
}

static int same(const char *a, const char *b)
{
    return strcmp(a ? a : "", b ? b : "") == 0;
}

/* FNV-1a over the type, the name and the labels (NULL and "" alike). */
static uint64_t series_hash(mtype type, const char *name, const char *labels)
{
    uint64_t h = 0xcbf29ce484222325ull ^ (uint64_t)type;
    for (const char *p = name; *p; p++)
        h = (h ^ (unsigned char)*p) * 0x100000001b3ull;
    h = (h ^ 0xff) *
        0x100000001b3ull; /* a byte no name holds: name "ab" + labels "c" != "a" + "bc" */
    for (const char *p = labels ? labels : ""; *p; p++)
        h = (h ^ (unsigned char)*p) * 0x100000001b3ull;
    return h;
}

/* Adds s to the index (under mu), doubling it at half full. */
static void index_add(cg_metrics *m, cg_metric *s)
{
    if (2 * (m->n_series + 1) > m->index_cap) {
        size_t cap = m->index_cap ? m->index_cap * 2 : 64;
        cg_metric **idx = cg_calloc(cap, sizeof *idx);
        for (cg_metric *t = m->series; t; t = t->next) {
            t->bucket = idx[t->hash & (cap - 1)];
            idx[t->hash & (cap - 1)] = t;
        }
        free(m->index);
        m->index = idx;
        m->index_cap = cap;
    }
    s->bucket = m->index[s->hash & (m->index_cap - 1)];
    m->index[s->hash & (m->index_cap - 1)] = s;
    m->n_series++;
}

static cg_metric *get(cg_metrics *m, const char *name, const char *help, const char *labels,
                      mtype type, const double *bounds, size_t nb)
{
    uint64_t h = series_hash(type, name, labels);
    pthread_mutex_lock(&m->mu);
    cg_metric *s = m->index_cap ? m->index[h & (m->index_cap - 1)] : NULL;
    for (; s; s = s->bucket)
        if (s->hash == h && s->type == type && !strcmp(s->name, name) && same(s->labels, labels))
            goto out;
    family *f;
    for (f = m->families; f; f = f->next)
        if (!strcmp(f->name, name)) break;
    if (!f) {
        f = cg_calloc(1, sizeof *f);
        f->name = cg_strdup(name);
        f->help = cg_strdup(help ? help : name);
        f->type = type;
        if (m->ftail)
            m->ftail->next = f;
        else
            m->families = f;
        m->ftail = f;
    }
    s = cg_calloc(1, sizeof *s);
    s->name = cg_strdup(name);
    s->labels = labels && *labels ? cg_strdup(labels) : NULL;
    s->type = type;
    if (type == M_HISTOGRAM) {
        s->n_bounds = nb;
        s->bounds = cg_malloc(nb * sizeof *bounds);
        memcpy(s->bounds, bounds, nb * sizeof *bounds);
        s->counts = cg_calloc(nb + 1, sizeof *s->counts);
    }
    s->hash = h;
    index_add(m, s); /* before s joins the list: a rehash walks the list */
    if (m->tail)
        m->tail->next = s;
    else
        m->series = s;
    m->tail = s;
out:
    pthread_mutex_unlock(&m->mu);
    return s;
}

cg_metric *cg_metrics_counter(cg_metrics *m, const char *name, const char *help, const char *labels)
{
    return get(m, name, help, labels, M_COUNTER, NULL, 0);
}
cg_metric *cg_metrics_gauge(cg_metrics *m, const char *name, const char *help, const char *labels)
{
    return get(m, name, help, labels, M_GAUGE, NULL, 0);
}
cg_metric *cg_metrics_histogram(cg_metrics *m, const char *name, const char *help,
                                const char *labels, const double *bounds, size_t n_bounds)
{
    return get(m, name, help, labels, M_HISTOGRAM, bounds, n_bounds);
}

/* Series are never freed before the registry, so a short global lock per update suffices. */
static pthread_mutex_t update_mu = PTHREAD_MUTEX_INITIALIZER;

void cg_metric_add(cg_metric *c, double v)
{
    pthread_mutex_lock(&update_mu);
    c->value += v;
    pthread_mutex_unlock(&update_mu);
}

void cg_metric_set(cg_metric *g, double v)
{
    pthread_mutex_lock(&update_mu);
    g->value = v;
    pthread_mutex_unlock(&update_mu);
}

double cg_metric_value(cg_metric *c)
{
    pthread_mutex_lock(&update_mu);
    double v = c->value;
    pthread_mutex_unlock(&update_mu);
    return v;
}

void cg_metric_observe(cg_metric *h, double v)
{
    size_t i = 0;
    while (i < h->n_bounds && v > h->bounds[i])
        i++;
    pthread_mutex_lock(&update_mu);
    h->counts[i]++;
    h->count++;
    h->sum += v;
    pthread_mutex_unlock(&update_mu);
}

void cg_metric_hist_load(cg_metric *h, const uint64_t *counts, size_t n, double sum)
{
    if (h->type != M_HISTOGRAM || n != h->n_bounds + 1) return;
    uint64_t total = 0;
    for (size_t i = 0; i < n; i++)
        total += counts[i];
    pthread_mutex_lock(&update_mu);
    memcpy(h->counts, counts, n * sizeof *counts);
    h->count = total;
    h->sum = sum;
    pthread_mutex_unlock(&update_mu);
}

void cg_metrics_inc(cg_metrics *m, const char *name, const char *help, const char *labels, double v)
{
    cg_metric_add(cg_metrics_counter(m, name, help, labels), v);
}

static void num(cg_buf *out, double v)
{
    cg_status st;
    if (isinf(v))
        st = cg_buf_printf(out, v > 0 ? "+Inf" : "-Inf");
    else if (v == (double)(long long)v && fabs(v) < 1e15)
        st = cg_buf_printf(out, "%lld", (long long)v);
    else
        st = cg_buf_printf(out, "%.9g", v);
    (void)st;
}

static void series(cg_buf *out, const char *name, const char *suffix, const char *labels,
                   const char *extra, double v)
{
    cg_status st = cg_buf_printf(out, "%s%s", name, suffix);
    if (labels || extra)
        st = cg_buf_printf(out, "{%s%s%s}", labels ? labels : "", labels && extra ? "," : "",
                           extra ? extra : "");
    st = cg_buf_append(out, " ", 1);
    num(out, v);
    st = cg_buf_append(out, "\n", 1);
    (void)st;
}

void cg_metrics_render(cg_metrics *m, cg_buf *out)
{
    static const char *tnames[] = {"counter", "gauge", "histogram"};
    pthread_mutex_lock(&m->mu);
    pthread_mutex_lock(&update_mu);
    for (family *f = m->families; f; f = f->next) {
        cg_status st = cg_buf_printf(out, "# HELP %s %s\n# TYPE %s %s\n", f->name, f->help, f->name,
                                     tnames[f->type]);
        (void)st;
        for (cg_metric *s = m->series; s; s = s->next) {
            if (strcmp(s->name, f->name) != 0) continue;
            if (s->type != M_HISTOGRAM) {
                series(out, s->name, "", s->labels, NULL, s->value);
                continue;
            }
            uint64_t cum = 0;
            char le[64];
            for (size_t i = 0; i <= s->n_bounds; i++) {
                cum += s->counts[i];
                if (i < s->n_bounds)
                    snprintf(le, sizeof le, "le=\"%.9g\"", s->bounds[i]);
                else
                    snprintf(le, sizeof le, "le=\"+Inf\"");
                series(out, s->name, "_bucket", s->labels, le, (double)cum);
            }
            series(out, s->name, "_sum", s->labels, NULL, s->sum);
            series(out, s->name, "_count", s->labels, NULL, (double)s->count);
        }
    }
    pthread_mutex_unlock(&update_mu);
    pthread_mutex_unlock(&m->mu);
}

/* Prometheus text-format metrics shared by gateway and worker: counters, gauges and
 * histograms keyed by name + label set, rendered by cg_metrics_render. Thread-safe. */
#ifndef CG_METRICS_H
#define CG_METRICS_H

#include <stddef.h>
#include <stdint.h>
#include "base/base.h"

typedef struct cg_metrics cg_metrics;
typedef struct cg_metric cg_metric; /* one series: name + labels */

cg_metrics *cg_metrics_new(void);
void cg_metrics_free(cg_metrics **m);

/* Get-or-create one series. labels is the inside of {...} in Prometheus syntax, e.g.
 * "route=\"completions\",code=\"200\"", or NULL. help is used the first time a name is seen.
 * The returned pointer lives as long as m; callers may cache it. */
cg_metric *cg_metrics_counter(cg_metrics *m, const char *name, const char *help,
                              const char *labels);
cg_metric *cg_metrics_gauge(cg_metrics *m, const char *name, const char *help, const char *labels);
/* bounds: ascending upper bounds (the +Inf bucket is implicit), copied. */
cg_metric *cg_metrics_histogram(cg_metrics *m, const char *name, const char *help,
                                const char *labels, const double *bounds, size_t n_bounds);

void cg_metric_add(cg_metric *c, double v);     /* counters (v >= 0) and gauges */
void cg_metric_set(cg_metric *g, double v);     /* gauges */
void cg_metric_observe(cg_metric *h, double v); /* histograms */
double cg_metric_value(cg_metric *c);           /* counters and gauges; for tests and stats */
/* Histograms whose observations are counted elsewhere (e.g. with atomics on a hot path): sets
 * the per-bucket counts (not cumulative; n_bounds + 1 of them, the last one +Inf) and the sum.
 * counts is borrowed; n must equal the histogram's n_bounds + 1 (otherwise nothing changes). */
void cg_metric_hist_load(cg_metric *h, const uint64_t *counts, size_t n, double sum);

/* Convenience: add v to the counter name{labels}, creating it on first use. */
void cg_metrics_inc(cg_metrics *m, const char *name, const char *help, const char *labels,
                    double v);

/* Appends the exposition text (# HELP, # TYPE, series) to out. */
void cg_metrics_render(cg_metrics *m, cg_buf *out);

/* Default latency buckets in seconds (1 ms .. 60 s). */
extern const double cg_metrics_latency_buckets[];
extern const size_t cg_metrics_latency_n;

#endif

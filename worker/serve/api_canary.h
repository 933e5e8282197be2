/* The worker's quality canary (DESIGN §15): a sampled fraction of the completions decoded from
 * an assembly, and every request that sets quality_probe, is compared with a plain causal
 * forward of the same tokens (cg_engine_probe_compare); the results become metrics
 * (chunkgate_worker_canary_*, per isolation mode and recompute setting) and a summary for
 * /healthz. Sampled comparisons run on a thread of their own, after the answer went out, from
 * a bounded queue (a full queue drops them, counted); their forward runs on the scheduler's
 * background queue, which yields to live requests. Not a public interface. */
#ifndef CG_API_CANARY_H
#define CG_API_CANARY_H

#include <jansson.h>
#include <stdint.h>

#include "base/metrics.h"
#include "worker/serve/engine.h"

typedef struct cg_canary cg_canary;

/* A canary over engine e (borrowed; it must outlive the canary) writing to metrics m
 * (borrowed, likewise), sampling a fraction rate (<= 0: never, >= 1: always) of the requests
 * offered, with at most queue (>= 1) sampled comparisons waiting. Starts its thread. */
cg_canary *cg_canary_new(cg_engine *e, cg_metrics *m, double rate, uint32_t queue);
/* Stops the engine's background work (for good: call it at shutdown), joins the thread and
 * drops what waits. NULL-safe; sets *c to NULL. */
void cg_canary_free(cg_canary **c);

/* 1 when this request is sampled (thread-safe). */
int cg_canary_sample(cg_canary *c);
/* Queues a sampled probe for the background thread; takes *p over (sets it to NULL), also
 * when the queue is full (then it is dropped and counted). */
void cg_canary_submit(cg_canary *c, cg_probe **p);
/* Compares p now, on the caller's thread (a request that asked with quality_probe), and
 * records the result like a sampled one. Returns cg_engine_probe_compare's status. */
cg_status cg_canary_run(cg_canary *c, const cg_probe *p, cg_quality *out) CG_WUR;

/* {kl, kl_max, kl_first, top1_agree, top1_agreed, tokens_compared} of one comparison (new
 * reference): chunk_cache.quality. */
json_t *cg_canary_quality_json(const cg_quality *q);
/* The results so far (new reference): {requests, dropped, failed, tokens_compared,
 * top1_agreed, top1_agreement, kl_mean, settings: [{mode, recompute_ratio,
 * recompute_prefix_tokens, requests, tokens_compared, top1_agreement, kl_mean}]}; a setting's
 * ratio and prefix tokens are the metrics' label values (buckets, as strings). */
json_t *cg_canary_summary_json(cg_canary *c);

#endif

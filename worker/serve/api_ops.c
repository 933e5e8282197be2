/* The worker's operations routes: GET /healthz, /v1/info, /v1/models, /metrics. */
#include "worker/serve/api_ops.h"

#include <stdio.h>
#include <string.h>

#include "kv/pool.h"
#include "base/tier.h"
#include "worker/serve/api_common.h"

/* The canary's summary rides on the health check, which the gateway polls anyway: its status
 * page shows the figures without another request per worker. */
void cg_api_health(cg_http_req *req, void *app)
{
    cg_worker_api *a = app;
    /* The load goes with every health answer: each gateway replica polls it, so all of them
     * weigh the worker by the same numbers, not only by the requests each sent itself. */
    uint32_t running = 0, queued = 0;
    cg_sched_load(cg_engine_sched(a->e), &running, &queued);
    /* "object" tells a gateway whose --backend this is that a chunkgate-worker answers (a
     * plain prompt falling back to it keeps the tenant's salt) */
    cg_http_reply_json(req, 200,
                       json_pack("{s:s, s:s, s:I, s:I, s:o}", "object", "worker.health", "status",
                                 "ok", "running", (json_int_t)running, "queued", (json_int_t)queued,
                                 "canary", cg_canary_summary_json(a->canary)));
}

/* A special token's string ("<|endoftext|>"), or null when it has none. */
static json_t *token_string(cg_worker_api *a, int32_t id)
{
    size_t n = 0;
    const char *s =
        id < 0 ? NULL : cg_tokenizer_token_str(cg_model_tokenizer(cg_engine_model(a->e)), id, &n);
    return s && n ? json_stringn(s, n) : json_null();
}

/* The remote client's counters (zero without one). */
static cg_remote_stats remote_stats(cg_worker_api *a)
{
    cg_remote_stats rs;
    memset(&rs, 0, sizeof rs);
    cg_remote *r = cg_engine_get_params(a->e).remote;
    if (r) cg_remote_stats_get(r, &rs);
    return rs;
}

void cg_api_info(cg_http_req *req, void *app)
{
    cg_worker_api *a = app;
    const cg_model_config *c = cg_api_cfg(a);
    cg_pool_stats ps = cg_pool_get_stats(cg_engine_pool(a->e));
    cg_engine_params ep = cg_engine_get_params(a->e);
    json_t *j = json_object();
#define SET(k, v) json_object_set_new(j, k, v)
    SET("object", json_string("worker.info"));
    SET("model", json_string(c->model_id));
    SET("kv_model", json_string(c->kv_model));
    SET("n_layers", json_integer(c->n_layers));
    SET("n_heads", json_integer(c->n_heads));
    SET("n_kv_heads", json_integer(c->n_kv_heads));
    SET("head_dim", json_integer(c->head_dim));
    SET("hidden_size", json_integer(c->dim));
    SET("intermediate_size", json_integer(c->hidden_dim));
    SET("vocab_size", json_integer(c->vocab_size));
    SET("bos_token_id", c->bos_id >= 0 ? json_integer(c->bos_id) : json_null());
    SET("eos_token_id", c->n_eos ? json_integer(c->eos_ids[0]) : json_null());
    json_t *eos = json_array();
    for (int i = 0; i < c->n_eos; i++)
        json_array_append_new(eos, json_integer(c->eos_ids[i]));
    SET("eos_token_ids", eos);
    const cg_tokenizer *tok = cg_model_tokenizer(cg_engine_model(a->e));
    SET("bos_token", token_string(a, cg_tokenizer_bos(tok)));
    SET("eos_token", token_string(a, cg_tokenizer_eos(tok)));
    /* the template the worker renders chats with: a gateway in front renders the same way */
    SET("chat_template", a->p.chat ? json_string(cg_chat_model_source(a->p.chat)) : json_null());
    SET("architecture", json_string(cg_arch_name(c->arch)));
    SET("rope_scaling", json_string(c->rope_scaling));
    SET("dtype", json_string("f32")); /* compute and KV dtype */
    SET("weights_dtype", json_string(c->dtype));
    SET("rope_style", json_string(cg_rope_style_name(c->rope_style)));
    SET("rope_theta", json_real(c->rope_theta));
    SET("max_positions", json_integer(c->max_pos));
    SET("isolation_modes", json_pack("[s,s]", "strict", "sys"));
    SET("key_version", json_string(CG_KEY_VERSION));
    SET("key_hash", json_string(cg_key_hash_name(cg_key_get_hash())));
    SET("instance_id", json_string(a->instance_id));
    SET("started_ms", json_integer((json_int_t)a->started_ms));
    SET("separator", json_string(a->p.separator));
    SET("block_tokens", json_integer(ep.block_tokens));
    SET("block_bytes", json_integer((json_int_t)ps.block_bytes));
    SET("pool_capacity_bytes", json_integer((json_int_t)ps.capacity_bytes));
    SET("pool_used_bytes", json_integer((json_int_t)ps.bytes_used));
    SET("chunks", json_integer((json_int_t)ps.chunks));
    cg_disk *d = cg_engine_disk(a->e);
    if (d) {
        cg_disk_stats ds = cg_disk_get_stats(d);
        SET("disk_capacity_bytes", json_integer((json_int_t)ds.capacity_bytes));
        SET("disk_used_bytes", json_integer((json_int_t)ds.used_bytes));
        SET("disk_chunks", json_integer((json_int_t)ds.chunks));
    } else {
        SET("disk_capacity_bytes", json_integer(0));
        SET("disk_used_bytes", json_integer(0));
        SET("disk_chunks", json_integer(0));
    }
    json_t *tiers = json_pack("[s]", cg_tier_name(CG_TIER_RAM));
    if (d) json_array_append_new(tiers, json_string(cg_tier_name(CG_TIER_DISK)));
    if (a->p.remote_url) json_array_append_new(tiers, json_string(cg_tier_name(CG_TIER_REMOTE)));
    SET("tiers", tiers);
    /* Workers that report the same remote tier id share it: a chunk one of them computed is a
     * remote hit on the others (the gateway routes by it). */
    if (a->p.remote_url) {
        cg_remote_url u;
        int cluster = cg_remote_parse_url(a->p.remote_url, &u, NULL, 0) == CG_OK && u.cluster;
        SET("remote_tier",
            json_pack("{s:s, s:s, s:b, s:I, s:I}", "id", a->p.remote_id, "url", a->p.remote_url,
                      "cluster", cluster, "nodes", (json_int_t)remote_stats(a).nodes,
                      "write_behind_queue", (json_int_t)remote_stats(a).queue_depth));
    } else {
        SET("remote_tier", json_null());
    }
    SET("disk_write_behind", json_integer((json_int_t)(d ? ep.disk_write_behind : 0)));
    SET("tp", json_integer(a->p.tp));
    json_t *srcs = json_array();
    for (size_t i = 0; i < a->p.n_kv_sources; i++)
        json_array_append_new(srcs, json_string(a->p.kv_sources[i]));
    SET("kv_source", a->p.n_kv_sources ? json_string(a->p.kv_sources[0]) : json_null());
    SET("kv_sources", srcs);
    SET("assemblies_live", json_integer((json_int_t)cg_engine_live_assemblies(a->e, cg_now_ms())));
    SET("assembly_ttl_ms", json_integer((json_int_t)ep.assembly_ttl_ms));
    SET("spare_kv_bytes", json_integer((json_int_t)ep.spare_kv_bytes));
    SET("recompute_ratio", json_real(a->p.recompute_ratio));
    SET("recompute_select", json_string(cg_select_names[a->p.recompute_select]));
    SET("canary_rate", json_real(a->p.canary_rate));
    SET("canary_tokens", json_integer(a->p.canary_tokens));
    SET("kv_format", json_string("CGKV1"));
    SET("kv_layout", json_string("per head, per layer: K then V, each [tokens][head_dim] "
                                 "little-endian f32"));
#undef SET
    cg_http_reply_json(req, 200, j);
}

void cg_api_models(cg_http_req *req, void *app)
{
    cg_worker_api *a = app;
    const cg_model_config *c = cg_api_cfg(a);
    json_t *j = json_pack("{s:s, s:[{s:s, s:s, s:I, s:s, s:i}]}", "object", "list", "data", "id",
                          c->model_id, "object", "model", "created", (json_int_t)0, "owned_by",
                          "chunkgate-worker", "max_model_len", c->max_pos);
    cg_http_reply_json(req, 200, j);
}

static void set_counter(cg_metrics *m, const char *name, const char *help, uint64_t v)
{
    cg_metric_set(cg_metrics_counter(m, name, help, NULL), (double)v);
}

static void set_gauge(cg_metrics *m, const char *name, const char *help, double v)
{
    cg_metric_set(cg_metrics_gauge(m, name, help, NULL), v);
}

/* One counter family with one label: name{label="values[i]"} = v[i]. */
static void set_counters(cg_metrics *m, const char *name, const char *help, const char *label,
                         const char *const *values, const uint64_t *v, size_t n)
{
    for (size_t i = 0; i < n; i++) {
        char l[96];
        snprintf(l, sizeof l, "%s=\"%s\"", label, values[i]);
        cg_metric_set(cg_metrics_counter(m, name, help, l), (double)v[i]);
    }
}

/* The disk write-behind and the remote tier. */
static void tier_metrics(cg_worker_api *a, cg_metrics *m, const cg_engine_stats *es)
{
    cg_tiers_stats ts = cg_engine_tier_stats(a->e);
    set_counter(m, P "disk_write_behind_total", "Computed chunks queued for the disk tier",
                ts.wb.puts);
    set_counter(m, P "disk_write_behind_drops_total",
                "Computed chunks not queued for the disk tier: the write-behind queue was full",
                ts.wb.drops);
    set_counter(m, P "disk_write_behind_written_total",
                "Queued chunks written to the disk tier (or found there)", ts.wb.written);
    set_counter(m, P "disk_write_behind_failures_total", "Queued chunks the disk tier did not take",
                ts.wb.failed);
    set_gauge(m, P "disk_write_behind_queue_chunks",
              "Chunks queued for the disk tier and not yet written (lost by a crash)",
              (double)ts.wb.depth);
    set_gauge(m, P "disk_write_behind_queue_bytes", "Bytes queued for the disk tier",
              (double)ts.wb.bytes);
    set_gauge(m, P "disk_write_behind_oldest_seconds",
              "Age of the oldest chunk queued for the disk tier",
              (double)ts.wb.oldest_age_ms / 1e3);
    cg_remote_stats rs = remote_stats(a);
    set_counter(m, P "remote_hits_total", "Cacheable segments served from the remote tier",
                es->remote_hits);
    static const char *rl =
        "Chunks looked up in the remote tier by outcome: hit, miss, invalid (a corrupt or "
        "foreign value, never used), error (Redis down or slow), skipped (not asked after an "
        "error in the same request)";
    static const char *const outcomes[] = {"hit", "miss", "invalid", "error", "skipped"};
    const uint64_t reads[] = {ts.remote_hits, ts.remote_misses, ts.remote_invalid, ts.remote_errors,
                              ts.remote_skipped};
    set_counters(m, P "remote_reads_total", rl, "outcome", outcomes, reads, 5);
    set_counter(m, P "remote_read_bytes_total", "Value bytes read from the remote tier by hits",
                ts.remote_bytes_read);
    set_counter(m, P "remote_written_bytes_total", "Value bytes written to the remote tier",
                rs.bytes_written);
    set_counter(m, P "remote_writes_total", "Per-head values written to the remote tier", rs.sets);
    static const char *re = "Failed remote tier calls by kind (reads, writes, deletes, pings)";
    static const char *const kinds[] = {"unavailable", "timeout", "protocol", "other"};
    const uint64_t errs[] = {rs.errors_unavailable, rs.errors_timeout, rs.errors_protocol,
                             rs.errors_other};
    set_counters(m, P "remote_errors_total", re, "kind", kinds, errs, 4);
    set_counter(m, P "remote_queue_drops_total",
                "Computed chunks not written to the remote tier: the write-behind queue was full",
                ts.remote_put_drops);
    set_counter(m, P "remote_queue_failures_total",
                "Queued chunks the remote tier did not take (Redis down, slow or full)",
                rs.queue_failed);
    set_gauge(m, P "remote_queue_chunks", "Chunks queued for the remote tier",
              (double)rs.queue_depth);
    set_gauge(m, P "remote_queue_bytes", "Value bytes queued for the remote tier",
              (double)rs.queue_bytes);
    set_counter(m, P "remote_reconnects_total",
                "Connections to a Redis node re-established after a failure", rs.reconnects);
    set_gauge(m, P "remote_nodes", "Redis nodes known (cluster masters, or 1)", (double)rs.nodes);
    cg_events_stats ev = cg_events_get_stats(cg_engine_get_params(a->e).events);
    set_counter(m, P "events_published_total", "Chunk events appended to the Redis Stream",
                ev.published);
    set_counter(m, P "events_dropped_total",
                "Chunk events dropped because the queue was full (the next one asks for a resync)",
                ev.dropped);
    set_counter(m, P "events_failed_total",
                "Attempts to append a chunk event that Redis did not take (down, slow, refused); "
                "the event stays queued and is sent again",
                ev.failed);
    set_gauge(m, P "events_queue_depth", "Chunk events waiting for the publisher",
              (double)ev.depth);
    cg_metric_hist_load(cg_metrics_histogram(m, P "remote_read_seconds",
                                             "Latency of one chunk's read from the remote tier "
                                             "(all heads, pipelined), whatever its outcome",
                                             NULL, cg_tiers_remote_read_bounds,
                                             CG_TIERS_REMOTE_BOUNDS),
                        ts.remote_read_buckets, CG_TIERS_REMOTE_BOUNDS + 1, ts.remote_read_seconds);
}

/* A gauge with one series per KV tier: ram and disk. */
static void set_tier_gauge(cg_metrics *m, const char *name, const char *help, double ram,
                           double disk)
{
    cg_metric_set(cg_metrics_gauge(m, name, help, "tier=\"ram\""), ram);
    cg_metric_set(cg_metrics_gauge(m, name, help, "tier=\"disk\""), disk);
}

void cg_api_metrics(cg_http_req *req, void *app)
{
    cg_worker_api *a = app;
    cg_metrics *m = a->metrics;
    cg_pool_stats ps = cg_pool_get_stats(cg_engine_pool(a->e));
    cg_engine_stats es = cg_engine_get_stats(a->e);
    size_t live = cg_engine_live_assemblies(a->e, cg_now_ms());
    /* The engine and the pool keep the counts; a scrape copies them into the registry. */
    set_gauge(m, P "pool_capacity_bytes", "KV pool capacity in bytes", (double)ps.capacity_bytes);
    set_gauge(m, P "pool_used_bytes", "KV pool bytes held by chunks", (double)ps.bytes_used);
    set_gauge(m, P "pool_chunks", "Chunks in the KV pool", (double)ps.chunks);
    set_gauge(m, P "pool_referenced_chunks", "Pool chunks referenced by live assemblies",
              (double)ps.referenced_chunks);
    set_gauge(m, P "assemblies_live", "Assemblies built and not yet consumed or released",
              (double)live);
    cg_sched_stats ss = cg_engine_sched_stats(a->e);
    set_gauge(m, P "sequences_running", "Sequences in the decoding batch", (double)ss.running);
    set_gauge(m, P "sequences_parked",
              "Decoding sequences held for a slow reader, outside the decoding batch",
              (double)ss.parked);
    set_counter(m, P "sequences_parked_total",
                "Times a sequence left the decoding batch because its reader fell behind",
                ss.parked_total);
    set_counter(m, P "stream_stalls_total",
                "Streams cut because their client read nothing for --stream-stall-ms",
                __atomic_load_n(&a->stream_stalls, __ATOMIC_RELAXED));
    set_gauge(m, P "requests_admitted",
              "Assemble and completion requests in the worker (running and waiting)",
              (double)ss.admitted);
    set_gauge(m, P "prefill_waiting", "Prefill jobs queued or running", (double)ss.prefill_waiting);
    set_counter(m, P "decode_steps_total", "Decode steps (one batch of every running sequence)",
                ss.steps);
    set_counter(m, P "decode_rows_total", "Decode tokens computed in decode steps", ss.decode_rows);
    set_counter(m, P "prefill_pieces_total", "Prefill pieces computed between decode steps",
                ss.prefill_pieces);
    set_counter(m, P "rate_limited_total", "Requests answered 429 (max_running + max_queue)",
                ss.refused);
    set_gauge(m, P "background_waiting",
              "Background jobs (canary comparisons) queued in the scheduler; they run only idle",
              (double)ss.idle_waiting);
    set_counter(m, P "background_pieces_total",
                "Background pieces computed while no live work waited", ss.idle_pieces);
    set_counter(m, P "background_rows_total", "Rows computed in background pieces", ss.idle_rows);
    set_counter(m, P "background_interrupts_total",
                "Background pieces stopped for live work (run again later)", ss.idle_interrupts);
    set_gauge(m, P "kv_pulls_in_flight", "KV pulls from a source worker in progress",
              (double)__atomic_load_n(&a->pulls, __ATOMIC_ACQUIRE));
    set_counter(m, P "chunk_hits_total", "Cacheable segments found in the pool", es.chunk_hits);
    set_counter(m, P "chunk_misses_total", "Cacheable segments computed", es.chunk_misses);
    set_counter(m, P "evictions_total", "Chunks evicted from the pool", es.evictions);
    set_counter(m, P "tokens_reused_total", "Prompt tokens taken from the pool", es.tokens_reused);
    set_counter(m, P "tokens_computed_total", "Prompt tokens not taken from the pool",
                es.tokens_computed);
    set_counter(m, P "prefill_tokens_total", "Tokens run through the model during prefill",
                es.prefill_tokens);
    set_counter(m, P "decode_tokens_total", "Tokens generated", es.decode_tokens);
    set_counter(m, P "recomputed_tokens_total",
                "Chunk tokens recomputed with full context (recompute_prefix_tokens, "
                "recompute_ratio)",
                es.recomputed_tokens);
    set_counter(m, P "rank_tokens_total",
                "Tokens run through the ranking pass of recompute_ratio (chunk tokens through its "
                "first layers, or the question through all)",
                es.rank_tokens);
    set_counter(m, P "assemblies_total", "Assemblies built", es.assemblies_created);
    set_counter(m, P "assemblies_expired_total", "Assemblies released by their ttl",
                es.assemblies_expired);
    set_counter(m, P "assemblies_adopted_total", "Assemblies made from KV pulled from a worker",
                es.assemblies_adopted);
    set_gauge(m, P "kv_spare_bytes",
              "Capacity of the freed assembly KV buffers kept for the next requests "
              "(--spare-kv-mb)",
              (double)es.kv_spare_bytes);
    /* Tiers: what each holds now, and the traffic between them. */
    cg_disk *d = cg_engine_disk(a->e);
    cg_disk_stats ds = d ? cg_disk_get_stats(d) : (cg_disk_stats){0};
    set_tier_gauge(m, P "tier_bytes", "Bytes held per KV tier (RAM: pool blocks; disk: slots)",
                   (double)ps.bytes_used, (double)ds.used_bytes);
    set_tier_gauge(m, P "tier_chunks", "Chunks per KV tier (a chunk restored from disk is in both)",
                   (double)ps.chunks, (double)ds.chunks);
    set_tier_gauge(m, P "tier_capacity_bytes", "Capacity per KV tier in bytes",
                   (double)ps.capacity_bytes, (double)ds.capacity_bytes);
    set_counter(m, P "disk_hits_total", "Cacheable segments served from the disk tier",
                es.disk_hits);
    set_counter(m, P "spills_total", "Chunks evicted from RAM and written to disk", es.spills);
    set_counter(m, P "spill_failures_total",
                "Chunks evicted from RAM that the disk tier did not take (dropped)",
                es.spill_failures);
    set_counter(m, P "restores_total", "Chunks read back from disk and verified", es.restores);
    set_counter(m, P "restore_failures_total",
                "Disk records that failed verification or reading (recomputed)",
                es.restore_failures);
    set_counter(m, P "disk_drops_total", "Chunks dropped from the disk tier to make room (LRU)",
                ds.drops);
    set_counter(m, P "checksum_failures_total",
                "Disk records whose XXH3-128 checksum did not match (never served)",
                ds.checksum_failures);
    set_counter(m, P "disk_io_errors_total", "Disk tier read, write or inventory errors",
                ds.io_errors);
    set_counter(m, P "disk_written_bytes_total", "Bytes written by spills", ds.bytes_written);
    set_counter(m, P "disk_read_bytes_total", "Bytes read back by restores", ds.bytes_read);
    set_counter(m, P "disk_open_dropped_total",
                "Inventory rows dropped at start (out of range, overlapping or invalid)",
                ds.open_dropped);
    tier_metrics(a, m, &es);
    cg_buf out;
    cg_buf_init_unbounded(&out); /* the worker's own series: fixed names and labels */
    cg_metrics_render(m, &out);
    cg_http_reply_raw(req, 200, "text/plain; version=0.0.4; charset=utf-8",
                      out.data ? out.data : "", out.len);
    cg_buf_free(&out);
}

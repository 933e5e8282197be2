/* chunkgate-worker: the reference chunk-KV worker. `generate-model` writes the deterministic
 * tiny model; `serve` loads a model and serves openapi/worker.yaml, with an optional disk tier
 * (--disk-mb), an optional shared tier on Redis (--remote), chunk events on a Redis Stream
 * (--events) and, as an inference backend, pulls assemblies from other workers (--kv-source,
 * --tp). */
#include <curl/curl.h>
#include <errno.h>
#include <malloc.h>
#include <stddef.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <unistd.h>

#include "kv/attn.h"
#include "worker/serve/api_common.h"
#include "worker/serve/engine.h"
#include "worker/serve/kvpull.h"
#include "worker/store/tiers.h"
#include "worker/model/matmul.h"
#include "worker/model/model.h"
#include "worker/serve/worker_api.h"
#include "base/base.h"
#include "base/config.h"
#include "base/http.h"
#include "base/signals.h"

#define ERRLEN 1024
/* libgomp spins this many times (a pause instruction each: 0.2-0.5 ms) before a waiting
 * thread sleeps; 10,000 to 200,000 decoded equally fast, 2,000 10-15% slower (bench/README.md) */
#define CG_WORKER_SPINCOUNT "10000"

typedef struct gen_cfg {
    char *out;
    char *preset;
    long long seed;
    char *dtype;
    char *rope_style;
    char *rope_scaling;
    char *model_id;
    char *tokenizer;
    long long shards;
} gen_cfg;

#define GEN_OPT(...) CG_OPT(gen_cfg, __VA_ARGS__)
static const cg_cfg_opt gen_opts[] = {
    GEN_OPT("out", "CHUNKGATE_WORKER_GEN_OUT", CG_CFG_STR, out, NULL, 0, 0,
            "directory to write config.json and model.safetensors into (created if missing; "
            "required)"),
    GEN_OPT("preset", "CHUNKGATE_WORKER_GEN_PRESET", CG_CFG_STR, preset, "tiny", 0, 0,
            "tiny (byte-level Llama), llama3, llama2, qwen2, qwen3 (small, real vocabularies), "
            "qwen2.5-0.5b or qwen2.5-7b (full geometries)"),
    GEN_OPT("seed", "CHUNKGATE_WORKER_GEN_SEED", CG_CFG_INT, seed, "1", 0, (1LL << 62),
            "weights seed; the same seed gives the same bytes"),
    GEN_OPT("dtype", "CHUNKGATE_WORKER_GEN_DTYPE", CG_CFG_STR, dtype, "", 0, 0,
            "storage dtype of the weights: f32, f16 or bf16 (empty: the preset's; tiny f32)"),
    GEN_OPT("rope-style", "CHUNKGATE_WORKER_GEN_ROPE_STYLE", CG_CFG_STR, rope_style, "half", 0, 0,
            "RoPE pairing: half (HF/NeoX) or interleaved (GPT-J; tiny only)"),
    GEN_OPT("rope-scaling", "CHUNKGATE_WORKER_GEN_ROPE_SCALING", CG_CFG_STR, rope_scaling, "", 0, 0,
            "rope_scaling override: none, linear:F, yarn:F, llama3[:F] or dynamic:F (empty: the "
            "preset's)"),
    GEN_OPT("model-id", "CHUNKGATE_WORKER_GEN_MODEL_ID", CG_CFG_STR, model_id, "", 0, 0,
            "model id written into config.json (empty: chunkgate-PRESET)"),
    GEN_OPT("tokenizer", "CHUNKGATE_WORKER_GEN_TOKENIZER", CG_CFG_STR, tokenizer, "", 0, 0,
            "directory holding tokenizer.json and tokenizer_config.json to copy (checked against "
            "the preset's vocabulary, BOS and EOS)"),
    GEN_OPT("shards", "CHUNKGATE_WORKER_GEN_SHARDS", CG_CFG_INT, shards, "1", 1, 99999,
            "N > 1 writes model-0000k-of-0000N.safetensors and model.safetensors.index.json"),
};

typedef struct serve_cfg {
    char *model;
    char *listen;
    char *data_dir;
    long long pool_mb;
    long long disk_mb;
    long long disk_flush_on_exit;
    long long disk_write_behind;
    long long disk_write_behind_mb;
    char *remote;
    char *remote_password_file;
    char *api_key; /* --api-key, or the key of --api-key-file (loaded by load_api_key) */
    char *api_key_file;
    char *remote_id;
    long long remote_timeout_ms;
    long long remote_ttl_s;
    long long remote_queue;
    long long remote_queue_mb;
    long long remote_conns;
    char *events;
    char *events_stream;
    char *events_id;
    long long events_maxlen;
    long long events_queue;
    long long block_tokens;
    long long assembly_ttl_ms;
    long long max_assemblies;
    long long reserve_tokens;
    long long spare_kv_mb;
    long long max_segments;
    char *separator;
    char *chat_template;
    long long default_max_tokens;
    size_t max_body;
    long long io_threads;
    long long job_threads;
    cg_strlist kv_source;
    long long kv_request_source;
    long long tp;
    long long kv_timeout_ms;
    long long kv_max_pulls;
    long long max_running;
    long long max_queue;
    long long prefill_chunk;
    long long prefill_budget;
    double recompute_ratio;
    int recompute_select;
    double canary_rate;
    long long canary_tokens;
    long long canary_queue;
    long long stream_stall_ms;
    size_t sndbuf;
    long long split_special;
    long long canary_chunk;
    int log_level; /* cg_log_level */
    int key_hash;  /* cg_key_hash */
    int quant;     /* cg_quant */
} serve_cfg;

#define OPT(...) CG_OPT(serve_cfg, __VA_ARGS__)
#define OPT_ENUM(...) CG_OPT_ENUM(serve_cfg, __VA_ARGS__)
static const cg_cfg_opt serve_opts[] = {
    OPT("model", "CHUNKGATE_WORKER_MODEL", CG_CFG_STR, model, NULL, 0, 0,
        "model directory (config.json + model.safetensors + tokenizer files) or a .gguf file "
        "(llama, qwen2, qwen3; F32/F16/BF16/Q8_0/Q4_0 tensors; byte-level BPE tokenizer) "
        "(required)"),
    OPT_ENUM("quant", "CHUNKGATE_WORKER_QUANT", quant, "none", cg_quant_names,
             "weights in memory: none (the checkpoint's f32/f16/bf16, mapped), q8 (int8 blocks of "
             "32 with an f16 scale, llama.cpp Q8_0's class) or q4 (4-bit blocks of 32, Q4_0's "
             "class), quantised at load; decode steps use int8 activations per block of 32, "
             "prompt pieces over 64 rows f32 ones (bf16 with AMX or AVX512-BF16)"),
    OPT("listen", "CHUNKGATE_WORKER_LISTEN", CG_CFG_STR, listen, "127.0.0.1:8090", 0, 0,
        "HOST:PORT to listen on; port 0 picks a free port (logged)"),
    OPT("api-key", "CHUNKGATE_WORKER_API_KEY", CG_CFG_STR, api_key, "", 0, 0,
        "bearer token every route but /healthz requires (the gateway's --worker-api-key); also "
        "sent to --kv-source. Empty = open: keep the port private either way"),
    OPT("api-key-file", "CHUNKGATE_WORKER_API_KEY_FILE", CG_CFG_STR, api_key_file, "", 0, 0,
        "file holding --api-key (its first line that is not blank or #)"),
    OPT("data-dir", "CHUNKGATE_WORKER_DATA_DIR", CG_CFG_STR, data_dir, "./chunkgate-worker-data", 0,
        0,
        "state directory (created if missing): holds the disk tier, one kv-* directory per model "
        "and "
        "weights"),
    OPT("pool-mb", "CHUNKGATE_WORKER_POOL_MB", CG_CFG_INT, pool_mb, "256", 1, 1 << 20,
        "KV pool (RAM tier) capacity in MiB"),
    OPT("disk-mb", "CHUNKGATE_WORKER_DISK_MB", CG_CFG_INT, disk_mb, "0", 0, 1LL << 30,
        "disk tier capacity in MiB in --data-dir (0 = no disk tier): RAM evictions spill there, "
        "and it survives restarts"),
    OPT("disk-flush-on-exit", "CHUNKGATE_WORKER_DISK_FLUSH_ON_EXIT", CG_CFG_INT, disk_flush_on_exit,
        "1", 0, 1, "1: on SIGTERM/SIGINT write every RAM chunk to the disk tier before exiting"),
    OPT("disk-write-behind", "CHUNKGATE_WORKER_DISK_WRITE_BEHIND", CG_CFG_INT, disk_write_behind,
        "64", 0, 1 << 20,
        "computed chunks queued for the disk tier in the background (0 = off: only RAM evictions "
        "spill); bounds what kill -9 loses. A full queue drops the write (counted), never waits"),
    OPT("disk-write-behind-mb", "CHUNKGATE_WORKER_DISK_WRITE_BEHIND_MB", CG_CFG_INT,
        disk_write_behind_mb, "64", 1, 1 << 20, "bytes of the disk write-behind queue, in MiB"),
    OPT("remote", "CHUNKGATE_WORKER_REMOTE", CG_CFG_STR, remote, "", 0, 0,
        "shared KV tier on Redis: redis://HOST:PORT[/DB] (one node) or redis+cluster://HOST:PORT "
        "(a "
        "Redis Cluster, discovered from that node); empty = none. Password: the environment "
        "variable CHUNKGATE_WORKER_REMOTE_PASSWORD or --remote-password-file, never the URL"),
    OPT("remote-password-file", "CHUNKGATE_WORKER_REMOTE_PASSWORD_FILE", CG_CFG_STR,
        remote_password_file, "", 0, 0,
        "file holding the Redis password (one trailing newline is dropped); empty = the "
        "environment "
        "variable CHUNKGATE_WORKER_REMOTE_PASSWORD, or no AUTH"),
    OPT("remote-id", "CHUNKGATE_WORKER_REMOTE_ID", CG_CFG_STR, remote_id, "", 0, 0,
        "name of the shared tier in /v1/info; the gateway treats workers reporting the same name "
        "as "
        "sharing it (empty = the --remote URL; set it when workers reach one Redis by different "
        "addresses)"),
    OPT("remote-timeout-ms", "CHUNKGATE_WORKER_REMOTE_TIMEOUT_MS", CG_CFG_INT, remote_timeout_ms,
        "500", 1, 600000,
        "most one remote read or write may take; a request whose remote read fails or times out "
        "does not ask Redis again, so a slow Redis costs it at most this"),
    OPT("remote-ttl-s", "CHUNKGATE_WORKER_REMOTE_TTL_S", CG_CFG_INT, remote_ttl_s, "0", 0,
        1LL << 31,
        "expire remote values after this many seconds (0 = never; let Redis evict with "
        "maxmemory-policy allkeys-lru)"),
    OPT("remote-queue", "CHUNKGATE_WORKER_REMOTE_QUEUE", CG_CFG_INT, remote_queue, "256", 1,
        1 << 20,
        "computed chunks queued for Redis; a full queue drops the write (counted), never waits"),
    OPT("remote-queue-mb", "CHUNKGATE_WORKER_REMOTE_QUEUE_MB", CG_CFG_INT, remote_queue_mb, "256",
        1, 1 << 20, "bytes of the Redis write-behind queue, in MiB"),
    OPT("remote-conns", "CHUNKGATE_WORKER_REMOTE_CONNS", CG_CFG_INT, remote_conns, "4", 1, 64,
        "connections per Redis node"),
    OPT("events", "CHUNKGATE_WORKER_EVENTS", CG_CFG_STR, events, "", 0, 0,
        "chunk events on a Redis Stream, read by every gateway with --events: "
        "redis://HOST:PORT[/DB] or redis+cluster://HOST:PORT; empty = the --remote URL when one "
        "is set, else none; off = none. Same password as --remote"),
    OPT("events-stream", "CHUNKGATE_WORKER_EVENTS_STREAM", CG_CFG_STR, events_stream,
        "chunkgate:events", 0, 0, "Redis Stream key of the chunk events (the gateways' too)"),
    OPT("events-id", "CHUNKGATE_WORKER_EVENTS_ID", CG_CFG_STR, events_id, "", 0, 0,
        "this worker's name in its events, stable across restarts (empty = HOSTNAME:PORT)"),
    OPT("events-maxlen", "CHUNKGATE_WORKER_EVENTS_MAXLEN", CG_CFG_INT, events_maxlen, "100000", 1,
        1LL << 40, "entries the stream keeps, about (XADD MAXLEN ~)"),
    OPT("events-queue", "CHUNKGATE_WORKER_EVENTS_QUEUE", CG_CFG_INT, events_queue, "4096", 1,
        1 << 24,
        "chunk events waiting for Redis (during an outage they wait here and are sent when it is "
        "back); a full queue drops the event (counted) and the next one asks the gateways to "
        "resync this worker, never waits"),
    OPT("block-tokens", "CHUNKGATE_WORKER_BLOCK_TOKENS", CG_CFG_INT, block_tokens, "16", 1, 4096,
        "tokens per pool block"),
    OPT("assembly-ttl-ms", "CHUNKGATE_WORKER_ASSEMBLY_TTL_MS", CG_CFG_INT, assembly_ttl_ms, "60000",
        1, 86400000, "an assembly not consumed or deleted within this time is released"),
    OPT("max-assemblies", "CHUNKGATE_WORKER_MAX_ASSEMBLIES", CG_CFG_INT, max_assemblies, "64", 1,
        1 << 20,
        "live assemblies at once built with /v1/assemble (a completion's own is decoded at once "
        "and not counted); more are refused with 503"),
    OPT("reserve-tokens", "CHUNKGATE_WORKER_RESERVE_TOKENS", CG_CFG_INT, reserve_tokens, "512", 0,
        1 << 24, "decode room allocated with each assembly (it grows when exceeded)"),
    OPT("spare-kv-mb", "CHUNKGATE_WORKER_SPARE_KV_MB", CG_CFG_INT, spare_kv_mb, "1024", 0, 1 << 24,
        "freed assembly KV buffers kept for the next requests (saves their page faults), MiB in "
        "all; 0 = none. A request's own KV (8 x layers x kv heads x head_dim bytes a token) is "
        "outside --pool-mb, and a spare stays resident"),
    OPT("max-segments", "CHUNKGATE_WORKER_MAX_SEGMENTS", CG_CFG_INT, max_segments, "256", 2,
        1 << 20, "segments per request"),
    OPT("separator", "CHUNKGATE_WORKER_SEPARATOR", CG_CFG_STR, separator,
        CG_SPLIT_DEFAULT_SEPARATOR, 0, 0, "segment separator of /v1/completions prompts"),
    OPT("chat-template", "CHUNKGATE_WORKER_CHAT_TEMPLATE", CG_CFG_STR, chat_template, "", 0, 0,
        "Jinja chat template file for /v1/chat/completions, instead of the model's own "
        "(tokenizer_config.json or chat_template.jinja); empty = the model's, or the plain "
        "rendering for a model without one"),
    OPT("split-special-tokens", "CHUNKGATE_WORKER_SPLIT_SPECIAL_TOKENS", CG_CFG_INT, split_special,
        "0", 0, 1,
        "default of a request's split_special_tokens: 0 = special-token text in a prompt is its "
        "control token (as Hugging Face does); 1 = plain text"),
    OPT("default-max-tokens", "CHUNKGATE_WORKER_DEFAULT_MAX_TOKENS", CG_CFG_INT, default_max_tokens,
        "16", 0, 1 << 24, "max_tokens of /v1/completions when the request has none"),
    OPT("max-body", "CHUNKGATE_WORKER_MAX_BODY", CG_CFG_SIZE, max_body, "8M", 1024, 1LL << 32,
        "largest request body; larger gets 413"),
    OPT("io-threads", "CHUNKGATE_WORKER_IO_THREADS", CG_CFG_INT, io_threads, "2", 1, 64,
        "HTTP event-loop threads"),
    OPT("job-threads", "CHUNKGATE_WORKER_JOB_THREADS", CG_CFG_INT, job_threads, "64", 1, 1024,
        "threads for blocking handlers; a decoding request holds one (keep it at least "
        "--max-running + --max-queue)"),
    OPT("max-running", "CHUNKGATE_WORKER_MAX_RUNNING", CG_CFG_INT, max_running, "16", 1, 1024,
        "decoding sequences stepped together (continuous batching); a stream whose client "
        "falls 64 tokens behind is parked outside them, so slow readers never hold these places"),
    OPT("stream-stall-ms", "CHUNKGATE_WORKER_STREAM_STALL_MS", CG_CFG_INT, stream_stall_ms, "30000",
        100, 86400000,
        "a streamed completion whose client reads nothing for this long (its buffer full) is "
        "cut and its sequence freed"),
    OPT("sndbuf", "CHUNKGATE_WORKER_SNDBUF", CG_CFG_SIZE, sndbuf, "256K", 0, 1LL << 29,
        "kernel send buffer of each client connection (SO_SNDBUF; Linux grants twice this, at "
        "most twice net.core.wmem_max): bounds what a client that reads slowly or not at all "
        "holds queued in the kernel, so its stream is parked (and cut after --stream-stall-ms "
        "without a read) after about this much rather than megabytes; 0 = the kernel's autotuning "
        "(up to net.ipv4.tcp_wmem's max)"),
    OPT("max-queue", "CHUNKGATE_WORKER_MAX_QUEUE", CG_CFG_INT, max_queue, "48", 0, 1 << 20,
        "admitted requests beyond --max-running; one more assemble or completion is answered 429 "
        "with Retry-After"),
    OPT("prefill-chunk", "CHUNKGATE_WORKER_PREFILL_CHUNK", CG_CFG_INT, prefill_chunk, "256", 16,
        1 << 20,
        "rows per prefill piece; a long prompt is computed in pieces between decode steps"),
    OPT("prefill-budget", "CHUNKGATE_WORKER_PREFILL_BUDGET", CG_CFG_INT, prefill_budget, "256", 1,
        1 << 20, "prefill rows computed between two decode steps while sequences decode"),
    OPT("recompute-ratio", "CHUNKGATE_WORKER_RECOMPUTE_RATIO", CG_CFG_NUM, recompute_ratio, "0", 0,
        1,
        "recompute_ratio of a request that sends none: the share of chunk tokens whose KV "
        "deviates most that is recomputed with full context (0 = off, 1 = a plain causal forward)"),
    OPT_ENUM("recompute-select", "CHUNKGATE_WORKER_RECOMPUTE_SELECT", recompute_select, "deviation",
             cg_select_names,
             "recompute_select of a request that sends none: how recompute_ratio chooses its "
             "tokens, deviation (those whose KV at layer 1 deviates most from a full-attention "
             "pass, CacheBlend) or question (those the question attends to most, ProphetKV)"),
    OPT("canary-rate", "CHUNKGATE_WORKER_CANARY_RATE", CG_CFG_NUM, canary_rate, "0.01", 0, 1,
        "share of completions decoded from an assembly that are also computed with a plain causal "
        "forward in the background, to measure what reuse costs (KL, top-1 agreement in /metrics)"),
    OPT("canary-tokens", "CHUNKGATE_WORKER_CANARY_TOKENS", CG_CFG_INT, canary_tokens, "16", 0, 4096,
        "generated tokens a canary comparison covers by teacher forcing, after the prompt's "
        "end"),
    OPT("canary-queue", "CHUNKGATE_WORKER_CANARY_QUEUE", CG_CFG_INT, canary_queue, "4", 1, 1024,
        "sampled comparisons waiting for idle time; more are dropped (counted)"),
    OPT("canary-chunk", "CHUNKGATE_WORKER_CANARY_CHUNK", CG_CFG_INT, canary_chunk, "32", 1, 1 << 20,
        "rows per background piece of a comparison: a live request waits at most for one"),
    OPT("kv-source", "CHUNKGATE_WORKER_KV_SOURCE", CG_CFG_LIST, kv_source, NULL, 0, 0,
        "backend role, repeatable: base URL of a worker whose assemblies /v1/completions pulls; "
        "the list is an allow-list: kv_transfer_params.worker (the gateway names the worker "
        "that assembled) must be one of them (403 otherwise), and without one the first is used "
        "(none = only local assemblies)"),
    OPT("kv-request-source", "CHUNKGATE_WORKER_KV_REQUEST_SOURCE", CG_CFG_INT, kv_request_source,
        "0", 0, 1,
        "1: a request's kv_transfer_params.worker may name the worker to pull from (lets any "
        "client make this worker connect to a URL of its choice; trusted networks only)"),
    OPT("tp", "CHUNKGATE_WORKER_TP", CG_CFG_INT, tp, "1", 1, 1024,
        "tensor-parallel ranks of a pull: each fetches exactly its KV heads with its own request "
        "(must divide the KV heads or be a multiple of them)"),
    OPT("kv-timeout-ms", "CHUNKGATE_WORKER_KV_TIMEOUT_MS", CG_CFG_INT, kv_timeout_ms, "5000", 1,
        3600000, "timeout of each KV pull request, connect included"),
    OPT("kv-max-pulls", "CHUNKGATE_WORKER_KV_MAX_PULLS", CG_CFG_INT, kv_max_pulls, "4", 1, 1024,
        "KV pulls in flight at once; more are answered 503 with Retry-After"),
    OPT_ENUM("log-level", "CHUNKGATE_WORKER_LOG_LEVEL", log_level, "info", cg_log_level_names,
             "debug, info, warn or error"),
    OPT_ENUM("key-hash", "CHUNKGATE_WORKER_KEY_HASH", key_hash, "xxhash", cg_key_hash_names,
             "chunk key hash: xxhash (XXH3-128) or sha256; must equal the gateway's --key-hash "
             "(reported "
             "as key_hash in /v1/info)"),
};

static void usage(FILE *out)
{
    fprintf(out, "usage: chunkgate-worker generate-model --out DIR [--preset NAME] [--seed N] "
                 "[--dtype f32|f16|bf16] [--tokenizer DIR] [--rope-scaling SPEC] [--shards N]\n"
                 "       chunkgate-worker serve --model DIR [--listen HOST:PORT] [--data-dir DIR] "
                 "[--pool-mb N] [--disk-mb N] [--remote URL] [--kv-source URL --tp N] "
                 "[options]\n"
                 "       chunkgate-worker SUBCOMMAND --help\n");
}

/* Fills cfg from the subcommand's flags and environment by its table: -1 to go on, else the
 * exit status, 0 after printing its --help and 2 after saying what is wrong (cfg is then
 * still the caller's to free with cg_config_free). */
static int parse_args(const char *cmd, const char *required, const cg_cfg_opt *opts, size_t n,
                      void *cfg, int argc, char **argv)
{
    char err[ERRLEN];
    int help = 0;
    if (cg_config_parse(opts, n, cfg, argc, argv, &help, err, sizeof err) != CG_OK) {
        fprintf(stderr, "chunkgate-worker %s: %s\n", cmd, err);
        return 2;
    }
    if (!help) return -1;
    char line[128];
    snprintf(line, sizeof line, "usage: chunkgate-worker %s %s [options]", cmd, required);
    cg_config_help(stdout, line, opts, n);
    return 0;
}

/* The generator's parameters from the preset and the overrides; 2 after printing why. */
static int gen_params(const gen_cfg *c, cg_model_gen_params *p)
{
    if (cg_model_gen_preset(c->preset, p) != CG_OK) {
        fprintf(stderr, "chunkgate-worker generate-model: unknown --preset %s (one of:", c->preset);
        for (const char *const *n = cg_model_gen_preset_names(); *n; n++)
            fprintf(stderr, " %s", *n);
        fprintf(stderr, ")\n");
        return 2;
    }
    p->seed = (uint64_t)c->seed;
    if (c->dtype[0]) p->dtype = c->dtype;
    if (c->model_id[0]) p->model_id = c->model_id;
    if (c->rope_scaling[0]) p->rope_scaling = c->rope_scaling;
    if (c->tokenizer[0]) p->tokenizer_dir = c->tokenizer;
    p->shards = (int)c->shards;
    if (!strcmp(c->rope_style, "half")) {
        p->rope_style = CG_ROPE_HALF;
    } else if (!strcmp(c->rope_style, "interleaved")) {
        p->rope_style = CG_ROPE_INTERLEAVED;
    } else {
        fprintf(stderr,
                "chunkgate-worker generate-model: --rope-style must be half or interleaved\n");
        return 2;
    }
    return 0;
}

static int cmd_generate(int argc, char **argv)
{
    gen_cfg c;
    memset(&c, 0, sizeof c);
    char err[ERRLEN];
    int rc;
    cg_model_gen_params p;
    if ((rc = parse_args("generate-model", "--out DIR", gen_opts, CG_ARRAY_LEN(gen_opts), &c, argc,
                         argv)) >= 0)
        goto out;
    if (!c.out || !c.out[0]) {
        fprintf(stderr, "chunkgate-worker generate-model: --out DIR is required\n");
        rc = 2;
        goto out;
    }
    if ((rc = gen_params(&c, &p)) != 0) goto out;
    rc = 1;
    if (cg_model_generate(c.out, p, err, sizeof err) != CG_OK) {
        fprintf(stderr, "chunkgate-worker generate-model: %s\n", err);
        goto out;
    }
    printf("wrote preset %s into %s (seed %lld, %s, rope %s%s%s%s)\n", c.preset, c.out, c.seed,
           p.dtype, c.rope_style, p.rope_scaling ? ", scaling " : "",
           p.rope_scaling ? p.rope_scaling : "", p.shards > 1 ? ", sharded" : "");
    rc = 0;
out:
    cg_config_free(gen_opts, CG_ARRAY_LEN(gen_opts), &c);
    return rc;
}

/* mkdir -p */
static int make_dirs(const char *path)
{
    char tmp[4096];
    size_t n = strlen(path);
    if (!n || n >= sizeof tmp) return -1;
    memcpy(tmp, path, n + 1);
    for (size_t i = 1; i <= n; i++) {
        if (tmp[i] != '/' && tmp[i] != '\0') continue;
        char c = tmp[i];
        tmp[i] = '\0';
        if (mkdir(tmp, 0755) != 0 && errno != EEXIST) return -1;
        tmp[i] = c;
    }
    struct stat sb;
    if (stat(path, &sb) != 0) return -1;
    if (!S_ISDIR(sb.st_mode)) {
        errno = ENOTDIR;
        return -1;
    }
    /* The disk tier reads, writes and creates files there. */
    return access(path, R_OK | W_OK | X_OK) == 0 ? 0 : -1;
}

/* Checks what the table cannot; returns 0, or 2 after printing why. */
/* --api-key-file into c->api_key; 2 after saying why. The key is never printed. */
static int load_api_key(serve_cfg *c)
{
    char err[ERRLEN];
    if (c->api_key_file[0]) {
        if (c->api_key[0]) {
            fprintf(stderr, "chunkgate-worker serve: --api-key and --api-key-file: give one\n");
            return 2;
        }
        char *key = NULL;
        if (cg_config_read_key("--api-key-file", c->api_key_file, &key, err, sizeof err) != CG_OK) {
            fprintf(stderr, "chunkgate-worker serve: %s\n", err);
            return 2;
        }
        free(c->api_key);
        c->api_key = key;
    }
    if (c->api_key[0] && !cg_config_key_valid(c->api_key)) {
        fprintf(stderr, "chunkgate-worker serve: --api-key contains whitespace or control bytes\n");
        return 2;
    }
    return 0;
}

static int check_serve_cfg(const serve_cfg *c)
{
    const char *why = NULL;
    if (!c->model || !c->model[0])
        why = "--model DIR is required (see generate-model)";
    else if (!c->separator[0])
        why = "--separator must not be empty";
    else if (c->remote_id[0] && !c->remote[0])
        why = "--remote-id names the --remote tier: give --remote too";
    else if (strlen(c->events_id) > CG_CHUNKEVENT_NAME_MAX)
        why = "--events-id is too long";
    for (size_t i = 0; !why && i < c->kv_source.n; i++)
        if (!cg_kvpull_url_ok(c->kv_source.v[i]))
            why = "--kv-source must be an http:// or https:// base URL";
    if (!why) return 0;
    fprintf(stderr, "chunkgate-worker serve: %s\n", why);
    return 2;
}

/* The worker's parts, opened in order by open_parts and closed in reverse by close_parts. */
typedef struct parts {
    char instance[33]; /* this run's instance id, the epoch of its events */
    cg_events *events;
    cg_remote *remote;
    cg_model *model;
    cg_engine *engine;
    cg_chat_model *chat;
    cg_worker_api *api;
    cg_http_server *srv;
} parts;

/* The events' URL: --events, else --remote; NULL when off. */
static const char *events_url(const serve_cfg *c)
{
    if (!strcmp(c->events, "off")) return NULL;
    if (c->events[0]) return c->events;
    return c->remote[0] ? c->remote : NULL;
}

/* The Redis password of --remote and --events (--remote-password-file, else the environment
 * variable) into *out, NULL when there is none; give it back with cg_remote_free_password. -1,
 * logged under opt, when it cannot be read. */
static int load_password(const serve_cfg *c, const char *opt, char **out)
{
    char err[ERRLEN];
    cg_status st = cg_remote_load_password(
        c->remote_password_file[0] ? c->remote_password_file : NULL, out, err, sizeof err);
    if (st == CG_OK) return 0;
    cg_log(CG_LOG_ERROR, "%s: %s", opt, err);
    return -1;
}

/* Opens the chunk event publisher (--events), when events are on; it starts publishing once
 * the worker listens (start_events). */
static int open_events(const serve_cfg *c, parts *w)
{
    char err[ERRLEN];
    cg_api_random_hex(w->instance, 16);
    const char *url = events_url(c);
    if (!url) return 0;
    char *password;
    if (load_password(c, "--events", &password) != 0) return -1;
    cg_events_params p = cg_events_default_params();
    p.url = url;
    p.password = password;
    p.stream = c->events_stream;
    p.maxlen = (size_t)c->events_maxlen;
    p.queue_max = (size_t)c->events_queue;
    p.epoch = w->instance;
    p.timeout_ms = (int)c->remote_timeout_ms;
    cg_status st = cg_events_open(p, &w->events, err, sizeof err);
    cg_remote_free_password(password);
    if (st != CG_OK) {
        cg_log(CG_LOG_ERROR, "--events %s: %s", url, err);
        return -1;
    }
    return 0;
}

/* The load events report: the same numbers as GET /healthz (cg_sched_load). */
static void events_load(void *ud, uint32_t *running, uint32_t *queued)
{
    cg_sched_load(cg_engine_sched(ud), running, queued);
}

/* Names the worker in its events (--events-id, else HOSTNAME:PORT) and starts publishing. */
static int start_events(const serve_cfg *c, parts *w)
{
    if (!w->events) return 0;
    char name[CG_CHUNKEVENT_NAME_MAX + 1], host[64] = "localhost";
    if (c->events_id[0]) {
        snprintf(name, sizeof name, "%s", c->events_id);
    } else {
        if (gethostname(host, sizeof host) != 0) snprintf(host, sizeof host, "localhost");
        host[sizeof host - 1] = 0;
        snprintf(name, sizeof name, "%s:%u", host, (unsigned)cg_http_port(w->srv));
    }
    if (cg_events_start(w->events, name, events_load, w->engine) != CG_OK) {
        cg_log(CG_LOG_ERROR, "--events: cannot start the publisher");
        return -1;
    }
    cg_log(CG_LOG_INFO, "chunk events to %s stream %s as %s (epoch %s)", events_url(c),
           c->events_stream, name, w->instance);
    return 0;
}

/* Opens the client of the shared remote tier (--remote), when one is configured. A bad URL or
 * a refused password stops the worker; a Redis that is down does not (it is retried). */
static int open_remote(const serve_cfg *c, parts *w)
{
    if (!c->remote[0]) return 0;
    char err[ERRLEN];
    char *password;
    if (load_password(c, "--remote", &password) != 0) return -1;
    cg_remote_params rp = cg_remote_default_params();
    rp.url = c->remote;
    rp.password = password;
    rp.timeout_ms = (int)c->remote_timeout_ms;
    rp.ttl_s = (uint32_t)c->remote_ttl_s;
    rp.queue_max_items = (size_t)c->remote_queue;
    rp.queue_max_bytes = (size_t)c->remote_queue_mb << 20;
    rp.conns_per_node = (int)c->remote_conns;
    if (w->events) {
        rp.on_written = cg_tiers_remote_written;
        rp.on_written_ud = w->events;
    }
    cg_status st = cg_remote_open(rp, &w->remote, err, sizeof err);
    cg_remote_free_password(password);
    if (st != CG_OK) {
        cg_log(CG_LOG_ERROR, "--remote %s: %s", c->remote, err);
        return -1;
    }
    cg_log(CG_LOG_INFO, "remote tier %s (id %s), timeout %lld ms, ttl %lld s", c->remote,
           c->remote_id[0] ? c->remote_id : c->remote, c->remote_timeout_ms, c->remote_ttl_s);
    return 0;
}

/* Opens the model and the engine (with its tiers); logs why on failure. */
static int open_engine(const serve_cfg *c, parts *w)
{
    char err[ERRLEN];
    if (make_dirs(c->data_dir) != 0) {
        cg_log(CG_LOG_ERROR,
               "data dir %s: cannot create it, or it is not readable and writable by this "
               "process: %s",
               c->data_dir, strerror(errno));
        return -1;
    }
    if (cg_model_open_quant(c->model, (cg_quant)c->quant, &w->model, err, sizeof err) != CG_OK) {
        cg_log(CG_LOG_ERROR, "cannot load model from %s: %s", c->model, err);
        return -1;
    }
    /* attention's softmax loops follow the kernels' cap: CG_MATMUL_ISA=avx2 runs as on a CPU
     * without AVX-512 */
    const cg_matmul_isa isa = cg_matmul_isa_active();
    cg_attn_set_max_isa(isa >= CG_MATMUL_ISA_AVX512 ? 3 : isa >= CG_MATMUL_ISA_AVX2 ? 2 : 1);
    cg_log(CG_LOG_INFO, "weights %s (%zu MiB in memory), kernels %s", cg_model_cfg(w->model)->dtype,
           cg_model_weight_bytes(w->model) >> 20, cg_matmul_isa_name(isa));
    const cg_model_config *mc = cg_model_cfg(w->model);
    if (cg_tp_check(mc->n_kv_heads, (int)c->tp) != CG_OK) {
        cg_log(CG_LOG_ERROR,
               "--tp %lld cannot split the model's %d KV heads: it must divide them or be a "
               "multiple of them",
               c->tp, mc->n_kv_heads);
        return -1;
    }
    cg_engine_params ep = cg_engine_default_params();
    ep.pool_bytes = (size_t)c->pool_mb << 20;
    ep.block_tokens = (uint32_t)c->block_tokens;
    ep.assembly_ttl_ms = (uint64_t)c->assembly_ttl_ms;
    ep.max_assemblies = (size_t)c->max_assemblies;
    ep.reserve_tokens = (uint32_t)c->reserve_tokens;
    ep.spare_kv_bytes = (size_t)c->spare_kv_mb << 20;
    ep.disk_bytes = (size_t)c->disk_mb << 20;
    ep.disk_dir = c->data_dir;
    ep.disk_write_behind = (size_t)c->disk_write_behind;
    ep.disk_write_behind_bytes = (size_t)c->disk_write_behind_mb << 20;
    ep.remote = w->remote;
    ep.events = w->events;
    ep.sched.max_running = (uint32_t)c->max_running;
    ep.sched.max_queue = (uint32_t)c->max_queue;
    ep.sched.prefill_chunk = (uint32_t)c->prefill_chunk;
    ep.sched.prefill_budget = (uint32_t)c->prefill_budget;
    ep.sched.idle_chunk = (uint32_t)c->canary_chunk;
    cg_status st = cg_engine_open(w->model, ep, &w->engine);
    if (st == CG_OK) return 0;
    if (st == CG_E_VALUE)
        cg_log(CG_LOG_ERROR,
               "--pool-mb %lld or --disk-mb %lld cannot hold one block of %lld tokens", c->pool_mb,
               c->disk_mb, c->block_tokens);
    else
        cg_log(CG_LOG_ERROR, "cannot open the disk tier in %s (%s); see the line above",
               c->data_dir, cg_status_name(st));
    return -1;
}

/* Reads a chat template file (at most 1 MiB, the renderer's limit) into a new string. */
static char *read_template(const char *path, char *err, size_t errlen)
{
    FILE *f = fopen(path, "rb");
    if (!f) {
        snprintf(err, errlen, "%s", strerror(errno));
        return NULL;
    }
    size_t cap = (1u << 20) + 1, n;
    char *buf = cg_malloc(cap + 1);
    n = fread(buf, 1, cap, f);
    int bad = ferror(f);
    fclose(f);
    if (bad || n == cap) {
        snprintf(err, errlen, "%s", bad ? "read error" : "larger than 1 MiB");
        free(buf);
        return NULL;
    }
    buf[n] = '\0';
    return buf;
}

/* The chat template: --chat-template, else the model's own; compiled now so that a template
 * the worker cannot render refuses the start instead of failing chats later. */
static int open_chat(const serve_cfg *c, parts *w)
{
    char err[ERRLEN];
    const cg_tokenizer *t = cg_model_tokenizer(w->model);
    const char *src = cg_tokenizer_chat_template(t), *from = "its tokenizer_config.json";
    char *owned = NULL;
    if (c->chat_template[0]) {
        if (!(owned = read_template(c->chat_template, err, sizeof err))) {
            cg_log(CG_LOG_ERROR, "--chat-template %s: %s", c->chat_template, err);
            return -1;
        }
        src = owned;
        from = c->chat_template;
    }
    if (!src) return 0; /* the plain rendering */
    /* bos_token and eos_token as the tokenizer defines them (tokenizer_config.json), as
     * apply_chat_template passes them */
    char bos[256] = "", eos[256] = "";
    size_t n;
    const char *s = cg_tokenizer_token_str(t, cg_tokenizer_bos(t), &n);
    if (s) snprintf(bos, sizeof bos, "%.*s", (int)n, s);
    s = cg_tokenizer_token_str(t, cg_tokenizer_eos(t), &n);
    if (s) snprintf(eos, sizeof eos, "%.*s", (int)n, s);
    cg_status st =
        cg_chat_model_new(src, bos[0] ? bos : NULL, eos[0] ? eos : NULL, &w->chat, err, sizeof err);
    free(owned);
    if (st == CG_OK) return 0;
    cg_log(CG_LOG_ERROR,
           "the chat template of %s (%s) cannot be rendered: %s; give one that can with "
           "--chat-template FILE",
           c->model, from, err);
    return -1;
}

/* Starts the HTTP API on the engine. */
static int open_api(const serve_cfg *c, parts *w)
{
    cg_worker_api_params ap = cg_worker_api_default_params();
    ap.engine = w->engine;
    ap.separator = c->separator;
    ap.max_segments = (size_t)c->max_segments;
    ap.default_max_tokens = (uint32_t)c->default_max_tokens;
    ap.kv_sources = (const char *const *)c->kv_source.v;
    ap.n_kv_sources = c->kv_source.n;
    ap.tp = (int)c->tp;
    ap.kv_timeout_ms = (long)c->kv_timeout_ms;
    ap.kv_request_source = (int)c->kv_request_source;
    ap.kv_max_pulls = (int)c->kv_max_pulls;
    ap.recompute_ratio = c->recompute_ratio;
    ap.recompute_select = (cg_select)c->recompute_select;
    ap.canary_rate = c->canary_rate;
    ap.canary_tokens = (uint32_t)c->canary_tokens;
    ap.canary_queue = (uint32_t)c->canary_queue;
    ap.stream_stall_ms = (int)c->stream_stall_ms;
    ap.split_special = (int)c->split_special;
    ap.api_key = c->api_key[0] ? c->api_key : NULL;
    ap.chat = w->chat;
    ap.remote_url = c->remote;
    ap.remote_id = c->remote_id;
    ap.instance_id = w->instance;
    w->api = cg_worker_api_new(ap);

    cg_http_params hp = cg_http_default_params();
    size_t n_routes = 0;
    hp.listen = c->listen;
    hp.io_threads = (unsigned)c->io_threads;
    hp.job_threads = (unsigned)c->job_threads;
    hp.max_body_bytes = c->max_body;
    hp.sndbuf_bytes = c->sndbuf;
    /* A prompt may come as up to 2^20 token ids (api_complete.c): one JSON value each. */
    hp.max_json_values = (1u << 20) + 4096;
    hp.routes = cg_worker_api_routes(&n_routes);
    hp.n_routes = n_routes;
    hp.app = w->api;
    hp.done = cg_worker_api_done;
    hp.admin_token = c->api_key[0] ? c->api_key : NULL; /* the ADMIN routes: all but /healthz */
    if (cg_http_open(&hp, &w->srv) != CG_OK) return -1; /* it logged why */
    const cg_model_config *mc = cg_model_cfg(w->model);
    char host[256], kv_sources[512] = "";
    for (size_t i = 0, off = 0; i < c->kv_source.n && off < sizeof kv_sources; i++) {
        int k = snprintf(kv_sources + off, sizeof kv_sources - off, "%s%s", i ? ", " : "",
                         c->kv_source.v[i]);
        off += k > 0 ? (size_t)k : 0;
    }
    const char *colon = strrchr(c->listen, ':');
    snprintf(host, sizeof host, "%.*s", (int)(colon - c->listen), c->listen);
    cg_log(CG_LOG_INFO,
           "model %s: %d layers, %d heads, %d kv heads, head dim %d, rope %s, %d positions, pool "
           "%lld MiB, disk %lld MiB, tp %lld%s%s",
           mc->model_id, mc->n_layers, mc->n_heads, mc->n_kv_heads, mc->head_dim,
           cg_rope_style_name(mc->rope_style), mc->max_pos, c->pool_mb, c->disk_mb, c->tp,
           c->kv_source.n ? ", kv sources " : "", c->kv_source.n ? kv_sources : "");
    cg_log(CG_LOG_INFO, "listening on %s:%u", host, (unsigned)cg_http_port(w->srv));
    return 0;
}

static void close_parts(parts *w)
{
    cg_http_close(&w->srv);
    cg_worker_api_free(&w->api);
    cg_chat_model_unref(&w->chat);
    cg_events_unload(w->events); /* its load is the engine's scheduler */
    cg_engine_close(&w->engine);
    cg_remote_close(&w->remote); /* after the engine: it drains what the engine queued */
    cg_events_close(&w->events); /* after both: they emit events until they close */
    cg_model_close(&w->model);
}

/* After the last request: every RAM chunk goes to the disk tier (--disk-flush-on-exit). */
static void flush_on_exit(const serve_cfg *c, cg_engine *e)
{
    if (!c->disk_flush_on_exit || !cg_engine_disk(e)) return;
    uint64_t t0 = cg_now_ms();
    cg_pool_stats ps = cg_pool_get_stats(cg_engine_pool(e));
    size_t n = cg_engine_flush(e, cg_now_ms());
    cg_log(CG_LOG_INFO, "flushed %zu of %zu RAM chunks to the disk tier in %llu ms", n, ps.chunks,
           (unsigned long long)(cg_now_ms() - t0));
}

static int cmd_serve(int argc, char **argv)
{
    serve_cfg c;
    memset(&c, 0, sizeof c);
    int rc;
    parts w = {0};

    if ((rc = parse_args("serve", "--model DIR", serve_opts, CG_ARRAY_LEN(serve_opts), &c, argc,
                         argv)) >= 0)
        goto out;
    if ((rc = check_serve_cfg(&c)) != 0 || (rc = load_api_key(&c)) != 0) goto out;
    rc = 1;
    cg_key_set_hash((cg_key_hash)c.key_hash); /* before any thread computes a key */
    cg_log_init("chunkgate-worker", (cg_log_level)c.log_level);
    cg_signals_block_stop(); /* before any thread starts; taken below */
    if (open_events(&c, &w) != 0 || open_remote(&c, &w) != 0 || open_engine(&c, &w) != 0 ||
        open_chat(&c, &w) != 0 || open_api(&c, &w) != 0 || start_events(&c, &w) != 0)
        goto out;

    cg_signals_wait_stop();
    /* No request may run while RAM is written out: stop serving first. */
    cg_http_close(&w.srv);
    flush_on_exit(&c, w.engine);
    rc = 0;
out:
    close_parts(&w);
    cg_config_free(serve_opts, CG_ARRAY_LEN(serve_opts), &c);
    return rc;
}

int main(int argc, char **argv)
{
    if (argc < 2 || !strcmp(argv[1], "--help") || !strcmp(argv[1], "-h") ||
        !strcmp(argv[1], "help")) {
        usage(argc < 2 ? stderr : stdout);
        return argc < 2 ? 2 : 0;
    }
    if (!strcmp(argv[1], "generate-model")) return cmd_generate(argc - 1, argv + 1);
    if (!strcmp(argv[1], "serve")) {
        int rc;
        /* libgomp reads its wait policy when it loads, before main. A thread that finishes
         * its share of a parallel region waits for the next one: spinning for good (libgomp's
         * "active") starves the request and streaming threads on a small machine, sleeping at
         * once ("passive") costs a futex wake-up per region, hundreds per decoded token (a
         * fifth of a 0.5B model's decode time at 4-bit). So the server restarts itself once
         * with a bounded spin (CG_WORKER_SPINCOUNT), then sleep: it covers the gaps between
         * one token's regions (docs/worker.md, bench/README.md). An operator's own
         * OMP_WAIT_POLICY or GOMP_SPINCOUNT is kept as it is. */
        if (!getenv("OMP_WAIT_POLICY") && !getenv("GOMP_SPINCOUNT")) {
            setenv("OMP_WAIT_POLICY", "active", 1);
            setenv("GOMP_SPINCOUNT", CG_WORKER_SPINCOUNT, 1);
            execv("/proc/self/exe", argv);
            /* exec failed: go on with the default policy */
        }
        /* As the gateway does: buffers of 256 KiB and more (request bodies, tokenized
         * prompts, /tokenize answers) get their own mappings and go back to the system when
         * freed, instead of leaving a large request's peak on the heap for good; smaller
         * frees are returned by the HTTP layer's heap trim. */
        mallopt(M_MMAP_THRESHOLD, 256 * 1024);
        mallopt(M_TRIM_THRESHOLD, 64 * 1024 * 1024);
        /* before any thread: the backend role's rank threads use libcurl */
        curl_global_init(CURL_GLOBAL_DEFAULT);
        rc = cmd_serve(argc - 1, argv + 1);
        curl_global_cleanup();
        return rc;
    }
    fprintf(stderr, "chunkgate-worker: unknown subcommand '%s'\n", argv[1]);
    usage(stderr);
    return 2;
}

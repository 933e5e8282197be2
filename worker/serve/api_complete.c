/* The worker's POST /v1/completions: from an assembly (local or pulled), a "# #" prompt or a
 * plain prompt (text or token ids), as JSON or an SSE stream, with the OpenAI and vLLM
 * conventions clients rely on: stop sequences, seed, logprobs, echo (with prompt logprobs, as
 * lm-evaluation-harness asks for them), return_tokens_as_token_ids,
 * stream_options.include_usage. Parameters it cannot honour are refused by name. A request
 * decoded from an assembly may be compared with a plain causal forward (quality_probe, or
 * sampled by --canary-rate): a probe's result goes out as chunk_cache.quality after the last
 * token, a sampled one only to the metrics, after the answer. */
#include "worker/serve/api_complete.h"

#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/random.h>

#include "base/json.h"
#include "cache/chatreq.h"
#include "worker/serve/api_common.h"
#include "worker/serve/kvpull.h"

#define STREAM_BUFFER (256u << 10)
/* Most top_logprobs entries per token (vLLM's default limit is 20). */
#define LOGPROBS_MAX CG_SCHED_TOP_MAX
/* Stop sequences: at most this many, each at most STOP_BYTES bytes. */
#define STOP_MAX 16
#define STOP_BYTES 256
/* Token ids of a prompt given as ids. */
#define PROMPT_IDS_MAX (1u << 20)

/* ---- the request ---- */

typedef struct creq {
    long long max_tokens, seed, logprobs;
    int max_tokens_given;
    double temperature, top_p;
    int stream, include_usage, echo, return_ids;
    const char *stops[STOP_MAX];
    size_t stop_lens[STOP_MAX], stop_max;
    int n_stops;
    const char *assembly_id, *worker; /* kv_transfer_params */
    int local;                        /* assembly_id is one this worker holds */
    const char *text;                 /* the prompt as text, or: */
    size_t text_len;
    int32_t *ids; /* owned: the prompt as token ids */
    size_t n_ids;
    cg_api_opts o;
    const char *separator;
    int quality_probe; /* the client asked for chunk_cache.quality */
    int sampled;       /* chosen by --canary-rate: compared in the background */
    int chat; /* a chat request: without max_tokens it decodes until EOS or the context ends */
} creq;

static int parse_sampling(cg_worker_api *a, cg_http_req *req, json_t *body, creq *c)
{
    cg_status st;
    long long maxpos = cg_api_cfg(a)->max_pos, n_choices;
    c->max_tokens_given =
        json_object_get(body, "max_tokens") && !json_is_null(json_object_get(body, "max_tokens"));
    if ((st = cg_json_get_int(body, "max_tokens", c->chat ? maxpos : a->p.default_max_tokens, 0,
                              maxpos, &c->max_tokens)) != CG_OK) {
        cg_api_field_error(req, st, "max_tokens", "an integer between 0 and the context length");
        return 0;
    }
    if ((st = cg_json_get_number(body, "temperature", 1.0, 0.0, 2.0, &c->temperature)) != CG_OK) {
        cg_api_field_error(req, st, "temperature", "a number in [0, 2]");
        return 0;
    }
    if ((st = cg_json_get_number(body, "top_p", 1.0, 0.0, 1.0, &c->top_p)) != CG_OK ||
        c->top_p <= 0.0) {
        cg_api_field_error(req, st == CG_OK ? CG_E_VALUE : st, "top_p", "a number in (0, 1]");
        return 0;
    }
    uint64_t rnd;
    if (getrandom(&rnd, sizeof rnd, 0) != (ssize_t)sizeof rnd) rnd = cg_now_ns();
    if ((st = cg_json_get_int(body, "seed", (long long)(rnd >> 2), -(1LL << 62), 1LL << 62,
                              &c->seed)) != CG_OK) {
        cg_api_field_error(req, st, "seed", "an integer");
        return 0;
    }
    if ((st = cg_json_get_int(body, "n", 1, 1, 1, &n_choices)) != CG_OK) {
        cg_api_field_error(req, st, "n", "1 (one choice per request)");
        return 0;
    }
    c->logprobs = -1;
    json_t *lp = json_object_get(body, "logprobs");
    if (lp && !json_is_null(lp) &&
        (st = cg_json_get_int(body, "logprobs", -1, 0, LOGPROBS_MAX, &c->logprobs)) != CG_OK) {
        cg_api_field_error(req, st, "logprobs", "an integer in [0, 20] or null");
        return 0;
    }
    return 1;
}

static int parse_flags(cg_http_req *req, json_t *body, creq *c)
{
    struct {
        const char *name;
        int def, *out;
    } f[] = {{"stream", 0, &c->stream},
             {"echo", 0, &c->echo},
             {"return_tokens_as_token_ids", 0, &c->return_ids},
             {"quality_probe", 0, &c->quality_probe}};
    for (size_t i = 0; i < CG_ARRAY_LEN(f); i++) {
        cg_status st = cg_json_get_bool(body, f[i].name, f[i].def, f[i].out);
        if (st != CG_OK) {
            cg_api_field_error(req, st, f[i].name, "a boolean");
            return 0;
        }
    }
    json_t *so = json_object_get(body, "stream_options");
    if (so && !json_is_null(so)) {
        cg_status st = json_is_object(so)
                           ? cg_json_get_bool(so, "include_usage", 0, &c->include_usage)
                           : CG_E_TYPE;
        if (st != CG_OK) {
            cg_api_field_error(req, st, "stream_options", "an object {include_usage: boolean}");
            return 0;
        }
    }
    return 1;
}

/* Parameters the worker does not implement are refused by name, never ignored: a client that
 * sets them expects an effect. Their neutral values are accepted. */
static int refuse_unsupported(cg_http_req *req, json_t *body)
{
    /* neutral: the number that changes nothing (NAN: only null, or absent or empty, is
     * neutral); a boolean's neutral value is NEUTRAL_FALSE or NEUTRAL_TRUE */
    enum { NEUTRAL_FALSE = 1000, NEUTRAL_TRUE };
    static const struct {
        const char *name;
        double neutral;
    } params[] = {
        {"best_of", 1},
        {"presence_penalty", 0},
        {"frequency_penalty", 0},
        {"repetition_penalty", 1},
        {"min_tokens", 0},
        {"top_k", -1},
        {"min_p", 0},
        {"suffix", NAN},
        {"logit_bias", NAN},
        {"tools", NAN},
        {"functions", NAN},
        {"function_call", NAN},
        {"response_format", NAN},
        {"guided_json", NAN},
        {"guided_regex", NAN},
        {"guided_choice", NAN},
        {"guided_grammar", NAN},
        {"structured_outputs", NAN},
        {"stop_token_ids", NAN},
        {"allowed_token_ids", NAN},
        {"bad_words", NAN},
        {"prompt_logprobs", NAN},
        {"prediction", NAN},
        {"modalities", NAN},
        {"audio", NAN},
        {"reasoning_effort", NAN},
        {"ignore_eos", NEUTRAL_FALSE},
        {"use_beam_search", NEUTRAL_FALSE},
        {"include_stop_str_in_output", NEUTRAL_FALSE},
        {"skip_special_tokens", NEUTRAL_TRUE},
    };
    for (size_t i = 0; i < CG_ARRAY_LEN(params); i++) {
        json_t *v = json_object_get(body, params[i].name);
        if (!v || json_is_null(v)) continue;
        if (json_is_boolean(v) && params[i].neutral >= NEUTRAL_FALSE &&
            json_is_true(v) == (params[i].neutral == NEUTRAL_TRUE))
            continue;
        if (params[i].neutral < NEUTRAL_FALSE && json_is_number(v) &&
            json_number_value(v) == params[i].neutral)
            continue;
        if ((json_is_object(v) && json_object_size(v) == 0) ||
            (json_is_string(v) && json_string_length(v) == 0) ||
            (json_is_array(v) && json_array_size(v) == 0))
            continue;
        if (!strcmp(params[i].name, "top_k") && json_is_integer(v) && json_integer_value(v) == 0)
            continue;
        char msg[160];
        snprintf(msg, sizeof msg,
                 "%s is not supported by chunkgate-worker; remove it or use its "
                 "neutral value",
                 params[i].name);
        cg_http_reply_error(req, CG_E_VALUE, params[i].name, msg);
        return 0;
    }
    return 1;
}

/* stop: a string or an array of strings (OpenAI allows 4; vLLM any number). */
static int parse_stops(cg_http_req *req, json_t *body, creq *c)
{
    json_t *stop = json_object_get(body, "stop");
    if (!stop || json_is_null(stop)) return 1;
    json_t *one[1] = {stop};
    size_t n = json_is_array(stop) ? json_array_size(stop) : 1;
    if (n > STOP_MAX) {
        cg_http_reply_error(req, CG_E_VALUE, "stop", "stop holds at most 16 sequences");
        return 0;
    }
    for (size_t i = 0; i < n; i++) {
        json_t *s = json_is_array(stop) ? json_array_get(stop, i) : one[0];
        if (!json_is_string(s) || json_string_length(s) == 0 ||
            json_string_length(s) > STOP_BYTES) {
            cg_http_reply_error(req, json_is_string(s) ? CG_E_VALUE : CG_E_TYPE, "stop",
                                "stop must be a non-empty string of at most 256 bytes, or an "
                                "array of them");
            return 0;
        }
        c->stops[c->n_stops] = json_string_value(s);
        c->stop_lens[c->n_stops++] = json_string_length(s);
        c->stop_max = CG_MAX(c->stop_max, json_string_length(s));
    }
    return 1;
}

/* The --kv-source entry that url names, or NULL when it is not on the allow-list. */
static const char *listed_source(const cg_worker_api *a, const char *url)
{
    for (size_t i = 0; i < a->p.n_kv_sources; i++)
        if (cg_kvpull_url_same(a->p.kv_sources[i], url)) return a->p.kv_sources[i];
    return NULL;
}

/* kv_transfer_params: {assembly_id, worker?}; a worker on the --kv-source list, or any with
 * --kv-request-source 1. c->local must be set. */
static int parse_kv_source(cg_worker_api *a, cg_http_req *req, json_t *body, creq *c)
{
    json_t *ktp = NULL;
    cg_status st;
    if ((st = cg_json_get(body, "kv_transfer_params", JSON_OBJECT, 0, &ktp)) != CG_OK) {
        cg_api_field_error(req, st, "kv_transfer_params", "an object {assembly_id, worker?}");
        return 0;
    }
    if (ktp && (st = cg_json_get_string(ktp, "assembly_id", 1, &c->assembly_id)) != CG_OK) {
        cg_api_field_error(req, st, "kv_transfer_params.assembly_id", "a string");
        return 0;
    }
    if (ktp && (st = cg_json_get_string(ktp, "worker", 0, &c->worker)) != CG_OK) {
        cg_api_field_error(req, st, "kv_transfer_params.worker",
                           "a string (the worker's base URL)");
        return 0;
    }
    /* The allow-list is the SSRF guard: a name not on it makes this worker connect nowhere.
     * An assembly held here needs no pull, so what it names does not matter. */
    if (c->worker && !c->local && !a->p.kv_request_source && !listed_source(a, c->worker)) {
        cg_http_reply_error(req, CG_E_FORBIDDEN, "kv_transfer_params.worker",
                            "kv_transfer_params.worker is not one of this worker's --kv-source "
                            "workers; it pulls KV only from those");
        return 0;
    }
    if (c->worker && !cg_kvpull_url_ok(c->worker)) {
        cg_http_reply_error(req, CG_E_VALUE, "kv_transfer_params.worker",
                            "kv_transfer_params.worker must be an http:// or https:// base URL");
        return 0;
    }
    return 1;
}

/* prompt: a string, an array of one string, or token ids (an array of integers, or an array
 * of one such array). */
static int parse_prompt(cg_http_req *req, json_t *body, creq *c)
{
    json_t *p = json_object_get(body, "prompt");
    if (json_is_array(p) && json_array_size(p) == 1 &&
        (json_is_string(json_array_get(p, 0)) || json_is_array(json_array_get(p, 0))))
        p = json_array_get(p, 0);
    if (c->assembly_id && (!p || json_is_null(p))) return 1;
    if (!p || json_is_null(p)) {
        cg_api_field_error(req, CG_E_MISSING, "prompt", "a string");
        return 0;
    }
    if (json_is_string(p)) {
        c->text = json_string_value(p);
        c->text_len = json_string_length(p);
        return 1;
    }
    size_t n = json_is_array(p) ? json_array_size(p) : 0;
    for (size_t i = 0; i < n && json_is_integer(json_array_get(p, i)); i++) {
        if (i == 0) c->ids = cg_malloc(n * sizeof *c->ids);
        json_int_t v = json_integer_value(json_array_get(p, i));
        c->ids[i] = v < 0 || v > INT32_MAX ? -1 : (int32_t)v;
        c->n_ids = i + 1;
    }
    if (n == 0 || c->n_ids != n || n > PROMPT_IDS_MAX) {
        cg_free(&c->ids);
        cg_api_field_error(req, CG_E_TYPE, "prompt",
                           "a string, an array of one string, or an array of token ids");
        return 0;
    }
    return 1;
}

/* The chat fields a completion would ignore (a chat request's reach here converted). */
static int refuse_chat_fields(cg_http_req *req, json_t *body)
{
    static const char *const chat[] = {"messages", "documents"};
    for (size_t i = 0; i < CG_ARRAY_LEN(chat); i++) {
        json_t *v = json_object_get(body, chat[i]);
        if (!v || json_is_null(v)) continue;
        char msg[200];
        snprintf(msg, sizeof msg,
                 "%s is a field of /v1/chat/completions; a completion takes its documents in "
                 "the prompt, separated by the chunk separator",
                 chat[i]);
        cg_http_reply_error(req, CG_E_VALUE, chat[i], msg);
        return 0;
    }
    return 1;
}

/* Every field of the body; replies 4xx and returns 0 on the first bad one. */
static int parse_request(cg_worker_api *a, cg_http_req *req, json_t *body, creq *c)
{
    cg_status st;
    if (!cg_api_model_ok(a, req, body) || !refuse_chat_fields(req, body) ||
        !parse_sampling(a, req, body, c) || !parse_flags(req, body, c) ||
        !refuse_unsupported(req, body) || !parse_stops(req, body, c) ||
        !parse_kv_source(a, req, body, c) ||
        !cg_api_parse_opts(a, req, body, "chunk_mode", &c->o) || !parse_prompt(req, body, c))
        return 0;
    if ((st = cg_json_get_string(body, "chunk_separator", 0, &c->separator)) != CG_OK ||
        (c->separator && !c->separator[0])) {
        cg_api_field_error(req, st == CG_OK ? CG_E_VALUE : st, "chunk_separator",
                           "a non-empty string");
        return 0;
    }
    if (!c->separator) c->separator = a->p.separator;
    return 1;
}

/* ---- where the KV comes from ---- */

typedef struct kvsrc {
    cg_split_result sr;
    cg_engine_seg *segs;
    cg_assembly_info info;
    cg_kvpull_result pulled;
} kvsrc;

static void kvsrc_free(kvsrc *k)
{
    cg_split_result_free(&k->sr);
    free(k->segs);
    cg_assembly_info_free(&k->info);
}

/* Backend role: an assembly this worker does not hold lives on the worker that built it; its
 * KV is pulled here (at most kv_max_pulls at once). Replies on failure. */
static int pull(cg_worker_api *a, cg_http_req *req, const creq *c, const char *src, kvsrc *k,
                cg_complete_req *cr)
{
    char err[512];
    if (__atomic_add_fetch(&a->pulls, 1, __ATOMIC_ACQ_REL) > a->p.kv_max_pulls) {
        __atomic_sub_fetch(&a->pulls, 1, __ATOMIC_ACQ_REL);
        cg_metrics_inc(a->metrics, P "kv_pulls_total",
                       "Assemblies pulled from a worker (backend role), by result",
                       "result=\"busy\"", 1);
        cg_http_add_header(req, "Retry-After", "1");
        cg_http_reply_error(req, CG_E_UNAVAILABLE, "kv_transfer_params",
                            "too many KV pulls in flight; retry shortly");
        return 0;
    }
    cg_kvpull_params pp = cg_kvpull_default_params();
    pp.worker = src;
    pp.assembly_id = c->assembly_id;
    pp.tp = a->p.tp;
    pp.timeout_ms = a->p.kv_timeout_ms;
    pp.api_key = a->p.api_key;
    pp.decode_tokens = c->max_tokens_given ? (uint32_t)c->max_tokens : 0;
    cg_status st = cg_kvpull_assembly(a->e, &pp, cg_now_ms(), &k->pulled, err, sizeof err);
    __atomic_sub_fetch(&a->pulls, 1, __ATOMIC_ACQ_REL);
    cg_metrics_inc(a->metrics, P "kv_pulls_total",
                   "Assemblies pulled from a worker (backend role), by result",
                   st == CG_OK ? "result=\"ok\"" : "result=\"error\"", 1);
    cg_metrics_inc(a->metrics, P "kv_pull_requests_total",
                   "KV requests made by tensor-parallel ranks", NULL, k->pulled.kv_requests);
    cg_metrics_inc(a->metrics, P "kv_pull_bytes_total", "KV bytes pulled from workers", NULL,
                   (double)k->pulled.kv_bytes);
    if (st != CG_OK) {
        cg_log(CG_LOG_WARN, "kv pull of assembly %.64s from %s failed: %s", c->assembly_id, src,
               err);
        cg_api_engine_error(req, st,
                            st == CG_E_NOT_FOUND ? "kv_transfer_params.assembly_id"
                            : st == CG_E_CONTEXT ? "max_tokens"
                                                 : "kv_transfer_params",
                            err);
        return 0;
    }
    cg_metric_observe(cg_metrics_histogram(a->metrics, P "kv_pull_seconds",
                                           "Time to pull an assembly's KV", NULL,
                                           cg_metrics_latency_buckets, cg_metrics_latency_n),
                      k->pulled.seconds);
    cr->assembly_id = k->pulled.id;
    return 1;
}

/* A "# #" prompt is split like the gateway splits it and assembled here. */
static int assemble(cg_worker_api *a, cg_http_req *req, const creq *c, kvsrc *k,
                    cg_complete_req *cr)
{
    char err[512];
    k->segs = cg_calloc(k->sr.n, sizeof *k->segs);
    for (size_t i = 0; i < k->sr.n; i++)
        k->segs[i] = (cg_engine_seg){k->sr.segs[i].role, c->text + k->sr.segs[i].off,
                                     k->sr.segs[i].len, NULL};
    cg_assemble_req ar = {.segs = k->segs,
                          .n_segs = k->sr.n,
                          .mode = c->o.mode,
                          .salt = c->o.salt,
                          .salt_len = c->o.salt_len,
                          .recompute_prefix_tokens = (uint32_t)c->o.recompute,
                          .recompute_ratio = (float)c->o.recompute_ratio,
                          .recompute_select = c->o.recompute_select,
                          .reserve_tokens = c->o.reserve,
                          .no_bos = !c->o.add_special,
                          .split_special = c->o.split_special,
                          .cancelled = cg_api_client_left,
                          .cancel_ud = req,
                          .path = CG_PATH_CACHED,
                          .internal = 1,
                          .decode_tokens = c->max_tokens_given ? (uint32_t)c->max_tokens : 0};
    cg_status st = cg_engine_assemble(a->e, &ar, cg_now_ms(), &k->info, err, sizeof err);
    if (st != CG_OK) {
        /* the prompt alone, or the prompt and max_tokens together, beyond the context */
        cg_api_engine_error(req, st,
                            st == CG_E_CONTEXT && ar.decode_tokens &&
                                    strstr(err, "for the completion")
                                ? "max_tokens"
                                : "prompt",
                            err);
        return 0;
    }
    cr->assembly_id = k->info.id;
    return 1;
}

/* Fills the source of cr: an assembly (pulled when it lives elsewhere), an assembled "# #"
 * prompt, or the plain prompt. Replies on failure. */
static int resolve_kv(cg_worker_api *a, cg_http_req *req, const creq *c, kvsrc *k,
                      cg_complete_req *cr)
{
    if (c->assembly_id) {
        cr->assembly_id = c->assembly_id;
        /* Ids are 128 random bits, so a local id is never a remote one. */
        /* the listed spelling of a named source (parse_kv_source checked the name), a name
         * trusted by --kv-request-source 1, or the first source */
        const char *src = c->worker               ? listed_source(a, c->worker)
                          : a->p.n_kv_sources > 0 ? a->p.kv_sources[0]
                                                  : NULL;
        if (c->worker && !src) src = c->worker;
        if (src && !c->local) {
            /* a pulled assembly arrives as KV and logits, without its tokens */
            if (c->echo) {
                cg_http_reply_error(req, CG_E_VALUE, "echo",
                                    "echo needs the prompt's tokens, which an assembly pulled "
                                    "from another worker does not carry");
                return 0;
            }
            return pull(a, req, c, src, k, cr);
        }
        return 1;
    }
    if (c->ids) {
        cr->prompt_tokens = c->ids;
        cr->n_prompt_tokens = c->n_ids;
        return 1;
    }
    cg_split_params sp = cg_split_default_params();
    sp.separator = c->separator;
    sp.max_segments = a->p.max_segments;
    cg_status st = cg_split_prompt(c->text, c->text_len, &sp, &k->sr);
    if (st != CG_OK) {
        cg_api_engine_error(req, st, "prompt", NULL);
        return 0;
    }
    if (!k->sr.passthrough) {
        if (c->echo && c->logprobs >= 0) {
            cg_http_reply_error(req, CG_E_VALUE, "echo",
                                "echo with logprobs scores every prompt token with a full "
                                "forward pass; send the prompt without separators");
            return 0;
        }
        return assemble(a, req, c, k, cr);
    }
    cr->prompt = c->text;
    cr->prompt_len = c->text_len;
    return 1;
}

/* ---- the answer ---- */

/* One token as the answer reports it. */
typedef struct tok_entry {
    cg_tok_rec rec;
    size_t start, end; /* its bytes in the choice text */
    int prompt;        /* a prompt token (echo): logprob null for the first */
} tok_entry;

typedef struct gen {
    cg_worker_api *a;
    cg_http_req *req;
    const creq *c;
    cg_stream *s; /* created at the first streamed event */
    char id[48];
    json_int_t created;
    cg_buf text;      /* the choice text: the echoed prompt, then the generated bytes */
    size_t gen_start; /* where the generated bytes begin in text */
    size_t sent;      /* bytes of text streamed so far */
    int stopped;      /* a stop sequence matched: text ends where it began */
    tok_entry *toks;  /* every token of the choice, in order */
    size_t n_toks, cap_toks, toks_sent;
    int admitted;      /* holds an admission (cg_engine_admit) */
    int chat;          /* answer in the chat.completion shapes */
    int chunks;        /* chunks streamed so far (a chat stream's first carries the role) */
    int stall_counted; /* the stall cut was counted */
} gen;

/* Decoding is over: the request is no live work any more. It leaves before its answer goes
 * out, so that a load report read after the answer no longer counts it (DESIGN §18), and so
 * that a comparison (background work, which waits while a request is admitted) can run. */
static void gen_leave(gen *g)
{
    if (!g->admitted) return;
    cg_engine_leave(g->a->e);
    g->admitted = 0;
}

static void gen_free(gen *g)
{
    cg_buf_free(&g->text);
    free(g->toks);
    g->toks = NULL;
}

/* Ends the stream (the reply completes once its bytes are sent). */
static void gen_close(gen *g)
{
    if (!g->s) return;
    cg_stream_close(g->s);
    cg_stream_unref(&g->s);
}

static void add_entry(gen *g, const cg_tok_rec *r, size_t start, size_t end, int prompt)
{
    if (g->n_toks == g->cap_toks) {
        g->cap_toks = g->cap_toks ? g->cap_toks * 2 : 64;
        g->toks = cg_realloc(g->toks, g->cap_toks * sizeof *g->toks);
    }
    g->toks[g->n_toks++] = (tok_entry){*r, start, end, prompt};
}

/* A token's text in logprobs: its bytes (sanitized), or "token_id:N". */
static json_t *token_json(gen *g, int32_t id)
{
    if (g->c->return_ids) {
        char b[32];
        snprintf(b, sizeof b, "token_id:%d", (int)id);
        return json_string(b);
    }
    char b[CG_TOKEN_MAX_BYTES];
    size_t n = cg_tok_decode(cg_engine_model(g->a->e), id, b);
    return cg_json_text(b, n);
}

/* The logprobs object (legacy completions shape, plus token_ids) of entries [from, to). */
static json_t *logprobs_json(gen *g, size_t from, size_t to)
{
    if (g->c->logprobs < 0) return json_null();
    json_t *tokens = json_array(), *values = json_array(), *tops = json_array();
    json_t *offsets = json_array(), *ids = json_array();
    for (size_t i = from; i < to; i++) {
        const tok_entry *t = &g->toks[i];
        int none = t->prompt && i == 0; /* nothing precedes the first prompt token */
        json_array_append_new(tokens, token_json(g, t->rec.token));
        json_array_append_new(values, none ? json_null() : json_real(t->rec.logprob));
        json_t *top = none ? json_null() : json_object();
        for (int k = 0; !none && k < t->rec.n_top; k++) {
            json_t *txt = token_json(g, t->rec.top_ids[k]);
            /* several byte tokens can render as U+FFFD: the first (most likely) one stays */
            if (!json_object_get(top, json_string_value(txt)))
                json_object_set_new(top, json_string_value(txt), json_real(t->rec.top_lps[k]));
            json_decref(txt);
        }
        json_array_append_new(tops, top);
        json_array_append_new(offsets, json_integer((json_int_t)t->start));
        json_array_append_new(ids, json_integer(t->rec.token));
    }
    return json_pack("{s:o, s:o, s:o, s:o, s:o}", "tokens", tokens, "token_logprobs", values,
                     "top_logprobs", tops, "text_offset", offsets, "token_ids", ids);
}

static json_t *chunk_json(gen *g, const char *text, size_t len, json_t *logprobs,
                          const char *finish)
{
    json_t *choice =
        json_pack("{s:o, s:i, s:o, s:o}", "text", cg_json_text(text, len), "index", 0, "logprobs",
                  logprobs, "finish_reason", finish ? json_string(finish) : json_null());
    json_t *j =
        json_pack("{s:s, s:s, s:I, s:s, s:[o]}", "id", g->id, "object", "text_completion",
                  "created", g->created, "model", cg_api_cfg(g->a)->model_id, "choices", choice);
    if (g->chat) cg_chat_answer_shape(j, 1, g->chunks == 0);
    g->chunks++;
    return j;
}

static int push_event(gen *g, json_t *j)
{
    char *text = json_dumps(j, JSON_COMPACT);
    json_decref(j);
    cg_buf b;
    cg_buf_init_unbounded(&b); /* text is in memory already */
    cg_status st = cg_buf_printf(&b, "data: %s\n\n", text);
    (void)st;
    int rc = cg_stream_push(g->s, b.data, b.len);
    if (rc != 0 && cg_stream_stalled(g->s) && !g->stall_counted) {
        g->stall_counted = 1;
        __atomic_add_fetch(&g->a->stream_stalls, 1, __ATOMIC_RELAXED);
        cg_log(CG_LOG_WARN, "stream cut: its client read nothing for %d ms",
               g->a->p.stream_stall_ms);
    }
    cg_buf_free(&b);
    free(text);
    return rc;
}

static void stream_start(gen *g)
{
    if (g->s) return;
    g->s = cg_stream_new(STREAM_BUFFER, ": keep-alive\n\n");
    cg_stream_set_stall_timeout(g->s, g->a->p.stream_stall_ms);
    cg_http_reply_stream(g->req, 200, "text/event-stream", g->s);
    g->req = NULL; /* replied: the request is the server's now */
}

/* Streams the text that can no longer change: not the bytes a stop sequence may still start
 * with, not an incomplete UTF-8 sequence (unless final). The logprob entries of the tokens
 * whose bytes went out go with it. */
static int stream_text(gen *g, int final)
{
    size_t safe = g->text.len;
    if (!final && !g->stopped && g->c->stop_max > 1)
        safe = safe > g->c->stop_max - 1 ? safe - (g->c->stop_max - 1) : 0;
    if (safe < g->sent) safe = g->sent;
    cg_buf b;
    cg_buf_init_unbounded(&b); /* at most three bytes for each byte of g->text */
    size_t used = cg_utf8_sanitize(g->text.data + g->sent, safe - g->sent, final, &b);
    g->sent += used;
    size_t upto = g->toks_sent;
    while (upto < g->n_toks && g->toks[upto].end <= g->sent)
        upto++;
    if (final) upto = g->n_toks;
    int rc = 0;
    if (b.len || upto > g->toks_sent)
        rc = push_event(g, chunk_json(g, b.data ? b.data : "", b.len,
                                      logprobs_json(g, g->toks_sent, upto), NULL));
    g->toks_sent = upto;
    cg_buf_free(&b);
    return rc;
}

/* Cuts the text at the first stop sequence that a token completed: OpenAI leaves the stop
 * sequence out. Entries of tokens that lie wholly past the cut go. Returns 1 on a match. */
static int find_stop(gen *g, size_t before)
{
    const creq *c = g->c;
    size_t len = g->text.len, best = len;
    for (int i = 0; i < c->n_stops; i++) {
        size_t from = before > c->stop_lens[i] - 1 ? before - (c->stop_lens[i] - 1) : 0;
        if (from < g->gen_start) from = g->gen_start;
        const char *p = memmem(g->text.data + from, len - from, c->stops[i], c->stop_lens[i]);
        if (p && (size_t)(p - g->text.data) < best) best = (size_t)(p - g->text.data);
    }
    if (best == len) return 0;
    g->text.len = best;
    g->text.data[best] = '\0';
    while (g->n_toks && !g->toks[g->n_toks - 1].prompt && g->toks[g->n_toks - 1].start >= best)
        g->n_toks--;
    g->stopped = 1;
    return 1;
}

/* The engine's token callback (this request's thread). Non-zero stops decoding. */
static int on_token(void *ud, const cg_tok_rec *rec, const char *bytes, size_t len)
{
    gen *g = ud;
    size_t before = g->text.len;
    cg_status st = cg_buf_append(&g->text, bytes, len);
    (void)st; /* an unbounded buffer */
    add_entry(g, rec, before, g->text.len, 0);
    int stop = g->c->n_stops && find_stop(g, before);
    /* With echo the prompt goes first, and its logprobs come with the answer: such a stream
     * is sent when decoding ends. */
    /* A client that left a non-streamed (or echoed) request gets nothing: stop decoding. */
    if (!g->c->stream || g->c->echo) return stop || cg_http_req_gone(g->req);
    stream_start(g);
    int rc = stream_text(g, 0);
    return stop || rc != 0 || cg_stream_cancelled(g->s);
}

/* Echo: the prompt text first, and with logprobs its tokens' entries. */
static void echo_prompt(gen *g, const cg_complete_result *res)
{
    const creq *c = g->c;
    cg_status st = CG_OK;
    if (c->text) {
        st = cg_buf_append(&g->text, c->text, c->text_len);
    } else if (c->ids) {
        st = cg_tokenizer_decode(cg_model_tokenizer(cg_engine_model(g->a->e)), c->ids, c->n_ids, 0,
                                 &g->text);
    } else if (res->prompt_ids) { /* a live assembly's: the tokens it was built from */
        st = cg_tokenizer_decode(cg_model_tokenizer(cg_engine_model(g->a->e)), res->prompt_ids,
                                 res->n_prompt, 0, &g->text);
    }
    (void)st;
    if (res->prompt_lp) {
        size_t off = 0;
        for (size_t i = 0; i < res->n_prompt; i++) {
            cg_tok_rec r = {.token = res->prompt_ids[i],
                            .logprob = res->prompt_lp[i],
                            .n_top = i ? res->prompt_top_k : 0};
            for (int k = 0; k < r.n_top; k++) {
                r.top_ids[k] = res->prompt_top_ids[i * (size_t)res->prompt_top_k + (size_t)k];
                r.top_lps[k] = res->prompt_top_lps[i * (size_t)res->prompt_top_k + (size_t)k];
            }
            char b[CG_TOKEN_MAX_BYTES];
            size_t n = cg_tok_decode(cg_engine_model(g->a->e), r.token, b);
            add_entry(g, &r, CG_MIN(off, g->text.len), CG_MIN(off + n, g->text.len), 1);
            off += n;
        }
    }
    g->gen_start = g->text.len;
}

static json_t *usage_json(const cg_complete_result *r)
{
    return json_pack("{s:i, s:i, s:i, s:{s:i}}", "prompt_tokens", (int)r->prompt_tokens,
                     "completion_tokens", (int)r->completion_tokens, "total_tokens",
                     (int)(r->prompt_tokens + r->completion_tokens), "prompt_tokens_details",
                     "cached_tokens", (int)r->cached_tokens);
}

/* The end of a stream: the rest of the text, the finish reason, usage when asked for (in a
 * chunk of its own with no choice, as OpenAI sends it). [DONE] follows (stream_done). */
static void stream_end(gen *g, const cg_complete_result *res, const char *finish)
{
    stream_start(g);
    int rc = stream_text(g, 1);
    rc |= push_event(g, chunk_json(g, "", 0, json_null(), finish));
    if (g->c->include_usage) {
        json_t *u = chunk_json(g, "", 0, json_null(), NULL);
        json_object_set_new(u, "choices", json_array());
        json_object_set_new(u, "usage", usage_json(res));
        rc |= push_event(g, u);
    }
    (void)rc;
}

/* A probed stream's last event before [DONE]: no choice, chunk_cache (taken over). */
static void stream_chunk_cache(gen *g, json_t *cc)
{
    json_t *ev = chunk_json(g, "", 0, json_null(), NULL);
    json_object_set_new(ev, "choices", json_array());
    json_object_set_new(ev, "chunk_cache", cc);
    int rc = push_event(g, ev);
    (void)rc;
}

static void stream_done(gen *g)
{
    int rc = cg_stream_push(g->s, "data: [DONE]\n\n", 14);
    (void)rc;
}

/* chunk_cache of a probed answer: {recomputed_tokens, quality}, quality null when the request
 * was not decoded from an assembly built here or the comparison failed. The comparison runs
 * here, after the last token went out. */
static json_t *probe_chunk_cache(gen *g, const cg_complete_result *res)
{
    json_t *quality = json_null();
    cg_quality q;
    if (res->probe && cg_canary_run(g->a->canary, res->probe, &q) == CG_OK)
        quality = cg_canary_quality_json(&q);
    return json_pack("{s:i, s:o}", "recomputed_tokens", (int)res->recomputed_tokens, "quality",
                     quality);
}

static void reply_json(gen *g, const cg_complete_result *res, const char *finish)
{
    json_t *choice = json_pack(
        "{s:o, s:i, s:o, s:s}", "text", cg_json_text(g->text.data ? g->text.data : "", g->text.len),
        "index", 0, "logprobs", logprobs_json(g, 0, g->n_toks), "finish_reason", finish);
    json_t *j = json_pack("{s:s, s:s, s:I, s:s, s:[o], s:o}", "id", g->id, "object",
                          "text_completion", "created", g->created, "model",
                          cg_api_cfg(g->a)->model_id, "choices", choice, "usage", usage_json(res));
    if (g->c->quality_probe) json_object_set_new(j, "chunk_cache", probe_chunk_cache(g, res));
    if (g->chat) cg_chat_answer_shape(j, 0, 1);
    cg_http_reply_json(g->req, 200, j);
}

/* Decodes and answers (JSON, or the stream started at the first token). */
static void generate(cg_worker_api *a, const creq *c, cg_complete_req *cr, gen *g)
{
    char err[512];
    cg_complete_result res = {0};
    cr->on_token = on_token;
    cr->ud = g;
    cr->prompt_logprobs = c->echo && c->logprobs >= 0 && !cr->assembly_id ? (int)c->logprobs : -1;
    cg_status st = cg_engine_complete(a->e, cr, cg_now_ms(), &res, err, sizeof err);
    gen_leave(g);
    if (st != CG_OK) {
        if (!g->s) {
            /* the prompt alone too long: the message says "the prompt has" */
            const char *param = st == CG_E_NOT_FOUND ? "kv_transfer_params.assembly_id"
                                : st == CG_E_CONTEXT
                                    ? (strstr(err, "the prompt has") ? "prompt" : "max_tokens")
                                    : NULL;
            cg_api_engine_error(g->req, st, param, err);
        } else { /* too late for a status code: the error goes out as an event */
            int rc = push_event(g, cg_http_error_json(st, NULL, err[0] ? err : NULL));
            rc |= cg_stream_push(g->s, "data: [DONE]\n\n", 14);
            (void)rc;
        }
        return;
    }
    if (res.cancelled && !g->stopped)
        cg_log(CG_LOG_INFO, "client left; decoding stopped after %zu tokens", res.n_tokens);
    const char *finish = g->stopped ? "stop" : res.finish_reason;
    if (c->echo) { /* the prompt goes before what was generated */
        gen pre = *g;
        cg_buf_init_unbounded(&pre.text); /* the capped body's prompt, then g->text */
        pre.toks = NULL;
        pre.n_toks = pre.cap_toks = 0;
        echo_prompt(&pre, &res);
        cg_status s2 = cg_buf_append(&pre.text, g->text.data ? g->text.data : "", g->text.len);
        (void)s2;
        for (size_t i = 0; i < g->n_toks; i++) {
            tok_entry t = g->toks[i];
            add_entry(&pre, &t.rec, t.start + pre.gen_start, t.end + pre.gen_start, 0);
        }
        gen_free(g);
        *g = pre;
    }
    if (c->stream) {
        stream_end(g, &res, finish);
        if (c->quality_probe) stream_chunk_cache(g, probe_chunk_cache(g, &res));
        stream_done(g);
    } else {
        reply_json(g, &res, finish);
    }
    /* A sampled comparison runs in the background once the answer is out. */
    if (c->sampled && !c->quality_probe) cg_canary_submit(g->a->canary, &res.probe);
    cg_complete_result_free(&res);
}

void cg_api_completions(cg_http_req *req, void *app)
{
    json_t *body = cg_http_req_json(req);
    if (body) cg_api_complete_body(app, req, body, 0);
}

void cg_api_complete_body(cg_worker_api *a, cg_http_req *req, json_t *body, int chat)
{
    creq c = {.chat = chat};
    kvsrc k = {0};
    gen g = {.a = a, .req = req, .c = &c, .chat = chat};
    cg_buf_init_unbounded(&g.text); /* max_tokens tokens, which the context bounds */
    /* A completion of an assembly this worker holds is admitted whatever the load: its
     * prefill is done, and refusing it would waste it (max_running still bounds decoding). */
    json_t *ktp = json_object_get(body, "kv_transfer_params");
    const char *aid = json_string_value(json_object_get(ktp, "assembly_id"));
    int local = aid && cg_engine_has_assembly(a->e, aid, cg_now_ms());
    if (!cg_api_admit(a, req, local)) goto out_unadmitted;
    g.admitted = 1;
    c.local = local;
    if (!parse_request(a, req, body, &c)) goto out;
    cg_complete_req cr = {.temperature = (float)c.temperature,
                          .top_p = (float)c.top_p,
                          .seed = (uint64_t)c.seed,
                          .max_tokens = (uint32_t)c.max_tokens,
                          .clamp_max_tokens = !c.max_tokens_given,
                          .no_bos = !c.o.add_special,
                          .split_special = c.o.split_special,
                          .cancelled = cg_api_client_left,
                          .cancel_ud = req,
                          .logprobs = c.logprobs >= 0 ? (int)c.logprobs : -1};
    if (!resolve_kv(a, req, &c, &k, &cr)) goto out;
    /* Only what was decoded from an assembly has reuse to compare. */
    if (cr.assembly_id) {
        c.sampled = !c.quality_probe && cg_canary_sample(a->canary);
        cr.probe = c.quality_probe || c.sampled;
        cr.probe_tokens = a->p.canary_tokens;
    }
    snprintf(g.id, sizeof g.id, chat ? "chatcmpl-" : "cmpl-");
    cg_api_random_hex(g.id + strlen(g.id), 12);
    g.created = (json_int_t)(cg_wall_ms() / 1000);
    generate(a, &c, &cr, &g);
out:
    gen_leave(&g);
out_unadmitted:
    gen_close(&g);
    gen_free(&g);
    kvsrc_free(&k);
    free(c.ids);
    json_decref(body);
}

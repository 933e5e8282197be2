/* Completions and chat handlers: validate the request, split it into segments, key the
 * cacheable ones, record them in the index with one batched lookup, and hand the request to
 * the dispatcher (server/orchestrate.c: main path, fallback or pass-through). */
#include "server/infer.h"

#include <stdio.h>
#include <string.h>
#include "backends/worker_client.h"
#include "server/fields.h"
#include "server/gwstate.h"
#include "server/orchestrate.h"
#include "server/segments.h"

/* ---------------------------------------------------------------- handlers */

/* What a field must be, for the message of a wrong type (a field absent here is a string). */
static const char *field_type(const char *param)
{
    static const struct {
        const char *name, *type;
    } T[] = {
        {"stream", "a boolean"},
        {"echo", "a boolean"},
        {"add_special_tokens", "a boolean"},
        {"add_generation_prompt", "a boolean"},
        {"quality_probe", "a boolean"},
        {"chat_template_kwargs", "an object"},
        {"stream_options", "an object {include_usage: boolean}"},
        {"messages", "an array of message objects"},
        {"documents", "an array of strings"},
    };
    for (size_t i = 0; i < CG_ARRAY_LEN(T); i++)
        if (!strcmp(param, T[i].name)) return T[i].type;
    return "a string";
}

/* stream_options: null, or an object whose include_usage is a boolean (what the worker and
 * OpenAI accept); anything else is refused here rather than forwarded. */
static cg_status check_stream_options(json_t *body)
{
    json_t *so = json_object_get(body, "stream_options");
    if (!so || json_is_null(so)) return CG_OK;
    int usage;
    return json_is_object(so) ? cg_json_get_bool(so, "include_usage", 0, &usage) : CG_E_TYPE;
}

static void handle(cg_http_req *req, cg_gateway *g, int chat)
{
    cg_gw_segments segs;
    cg_gw_segments_init(&segs);
    cg_index_entry *ent = NULL;
    char msg[256] = "";
    const char *param = NULL, *model = NULL;
    int stream = 0;
    long long ll;
    cg_status st;
    json_t *body = cg_http_req_json(req);
    if (!body) goto out; /* replied */

    param = "model";
    if ((st = cg_json_get_string(body, "model", 1, &model)) != CG_OK) goto bad;
    if (!*model) {
        st = CG_E_VALUE;
        snprintf(msg, sizeof msg, "model must not be empty");
        goto bad;
    }
    param = "stream";
    if ((st = cg_json_get_bool(body, "stream", 0, &stream)) != CG_OK) goto bad;
    param = "stream_options";
    if ((st = check_stream_options(body)) != CG_OK) goto bad;
    param = "max_tokens";
    if ((st = cg_json_get_int(body, "max_tokens", 0, 0, 1LL << 31, &ll)) != CG_OK) goto bad;
    if (chat) {
        param = "max_completion_tokens";
        if ((st = cg_json_get_int(body, "max_completion_tokens", 0, 0, 1LL << 31, &ll)) != CG_OK)
            goto bad;
    }
    if (!chat && json_object_get(body, "documents")) {
        /* Stripping it would silently drop the documents: say where they go instead. */
        param = "documents";
        st = CG_E_VALUE;
        snprintf(msg, sizeof msg,
                 "documents is a /v1/chat/completions extension; in a completion "
                 "put the documents in the prompt between separators");
        goto bad;
    }
    /* Fields only the gateway sets on its upstream requests. A client's copy would steer
     * the worker (kv_transfer_params names an assembly and, on some backends, a host to pull
     * KV from), so it is refused rather than silently dropped. */
    const char *only = cg_gw_gateway_only_field(body);
    if (only) {
        param = only;
        st = CG_E_VALUE;
        snprintf(msg, sizeof msg, "%s is set by the gateway only; remove it from the request",
                 param);
        goto bad;
    }
    segs.tenant = cg_gw_tenant(g, req);
    if ((st = cg_gw_segment_request(g, body, model, chat, &segs, &param, msg, sizeof msg)) != CG_OK)
        goto bad;
    /* A chat is answered through /v1/completions when a worker may take it (the main path, or
     * any chat without --backend); only --backend gets the chat itself. What has no
     * completions equivalent is refused by name, never dropped (server/fields.h). */
    if (chat &&
        (!g->has_backend || (!segs.split.passthrough && cg_workers_count(g->workers) > 0)) &&
        (st = cg_gw_check_chat_fields(body, &param, msg, sizeof msg)) != CG_OK)
        goto bad;
    /* echo with logprobs scores every prompt token with one causal forward; an assembled
     * prompt has no such forward, so the worker would answer without the prompt's logprobs.
     * Refused as the worker refuses it, never silently dropped. */
    if (!chat && !segs.split.passthrough && cg_workers_count(g->workers) > 0) {
        int echo = 0;
        json_t *lp = json_object_get(body, "logprobs");
        param = "echo";
        if ((st = cg_json_get_bool(body, "echo", 0, &echo)) != CG_OK) goto bad;
        if (echo && lp && !json_is_null(lp)) {
            st = CG_E_VALUE;
            snprintf(msg, sizeof msg,
                     "echo with logprobs scores every prompt token with a full forward pass; "
                     "send the prompt without separators");
            goto bad;
        }
    }
    if (!g->has_backend && !cg_workers_count(g->workers)) {
        cg_http_reply_error(req, CG_E_UNAVAILABLE, NULL,
                            "no backend (--backend) and no worker (--worker) is configured");
        goto out;
    }

    /* Record every cacheable segment (queued; the writer commits in batches) and read what
     * the index knows about them, in one read. */
    int64_t now = (int64_t)cg_wall_ms();
    if (segs.n_keys) {
        ent = cg_calloc(segs.n_keys, sizeof *ent);
        if (cg_index_lookup(g->index, segs.keys, segs.n_keys, ent) != CG_OK) {
            cg_log(CG_LOG_WARN, "index lookup failed; answering without token counts");
            cg_free(&ent);
        }
        for (size_t k = 0; k < segs.n_keys; k++)
            cg_index_chunk_seen(g->index, &segs.keys[k], model, segs.mode,
                                (int64_t)segs.split.segs[segs.key_seg[k]].len, now);
    }
    cg_gw_orchestrate(g, req, body, &segs, ent, chat, stream);
    body = NULL;
    ent = NULL;
    goto out;
bad:
    if (!msg[0]) {
        if (st == CG_E_MISSING)
            snprintf(msg, sizeof msg, "%s is required", param);
        else if (st == CG_E_TYPE && !strcmp(param, "stream"))
            snprintf(msg, sizeof msg, "stream must be a boolean");
        else if (st == CG_E_TYPE && !strncmp(param, "max_", 4))
            snprintf(msg, sizeof msg, "%s must be an integer", param);
        else if (st == CG_E_VALUE && !strncmp(param, "max_", 4))
            snprintf(msg, sizeof msg, "%s must be between 0 and 2^31", param);
        else if (st == CG_E_TYPE)
            snprintf(msg, sizeof msg, "%s must be %s", param, field_type(param));
    }
    cg_gw_reply_error(req, st, param, msg);
out:
    free(ent);
    cg_gw_segments_free(&segs);
    json_decref(body);
}

void cg_gw_completions(cg_http_req *req, void *app)
{
    handle(req, app, 0);
}
void cg_gw_chat_completions(cg_http_req *req, void *app)
{
    handle(req, app, 1);
}

/* ---------------------------------------------------------------- tokenize */

/* POST /tokenize and /detokenize: the workers' tokenizer is the model's, so the body goes to
 * the least-loaded healthy worker unchanged and its answer comes back as it is. */
static void to_worker(cg_http_req *req, cg_gateway *g, const char *path)
{
    cg_worker *w = cg_workers_pick_any(g->workers, NULL, 0);
    if (!w) {
        cg_gw_reply_error(req, CG_E_UNAVAILABLE, NULL, "no healthy worker to tokenize with");
        return;
    }
    size_t len = 0;
    char *body = cg_http_req_take_body(req, &len), err[256];
    long http = 0;
    json_t *ans = NULL;
    cg_status st = cg_wc_call_sync(g->client, cg_worker_url(w), "POST", path, body, len,
                                   g->cfg->worker_timeout_ms, &http, &ans, err, sizeof err);
    if (st != CG_OK || !ans) {
        cg_failkind kind =
            st != CG_OK ? cg_failkind_of(st, CG_FAIL_STATUS) : CG_FAIL_INVALID; /* not JSON */
        cg_workers_error(g->workers, w, kind, st != CG_OK ? err : "answer is not JSON");
        cg_gw_reply_error(req, st == CG_E_TIMEOUT ? CG_E_TIMEOUT : CG_E_BAD_GATEWAY, NULL,
                          "the worker did not answer the tokenizer request");
        json_decref(ans);
    } else {
        cg_http_reply_json(req, (int)http, ans);
    }
    cg_workers_release(g->workers, &w);
}

void cg_gw_tokenize(cg_http_req *req, void *app)
{
    to_worker(req, app, "/tokenize");
}
void cg_gw_detokenize(cg_http_req *req, void *app)
{
    to_worker(req, app, "/detokenize");
}

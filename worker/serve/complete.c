/* Decoding of the assembly engine: from a live assembly (which it consumes) or from a plain
 * prompt (worker/serve/engine.h, cg_engine_complete). The tokens are computed by the
 * scheduler, together with every other running sequence; this thread hands them to the
 * caller. */
#include "worker/serve/engine_state.h"

#include <math.h>
#include <stdlib.h>
#include <string.h>

#include "base/base.h"

void cg_complete_result_free(cg_complete_result *r)
{
    if (!r) return;
    cg_free(&r->text);
    cg_free(&r->tokens);
    cg_free(&r->prompt_ids);
    cg_free(&r->prompt_lp);
    cg_free(&r->prompt_top_ids);
    cg_free(&r->prompt_top_lps);
    cg_probe_free(&r->probe);
    r->text_len = r->n_tokens = r->text_cap = r->n_prompt = 0;
}

/* The plain prompt's tokens: given, or its text tokenized whole. */
static cg_status prompt_tokens(cg_engine *e, const cg_complete_req *req, cg_tokens *t, char *err,
                               size_t errlen)
{
    const cg_model_config *cfg = cg_model_cfg(e->m);
    if (req->prompt_tokens) {
        for (size_t i = 0; i < req->n_prompt_tokens; i++)
            if (req->prompt_tokens[i] < 0 || req->prompt_tokens[i] >= cfg->vocab_size) {
                cg_seterr(err, errlen, "prompt token %d is outside the vocabulary of %d",
                          (int)req->prompt_tokens[i], cfg->vocab_size);
                return CG_E_VALUE;
            }
        t->ids = cg_malloc((req->n_prompt_tokens + 1) * sizeof *t->ids);
        memcpy(t->ids, req->prompt_tokens, req->n_prompt_tokens * sizeof *t->ids);
        t->n = t->cap = req->n_prompt_tokens;
    } else if (cg_tokenizer_encode_opts(cg_model_tokenizer(e->m), req->prompt ? req->prompt : "",
                                        req->prompt ? req->prompt_len : 0,
                                        &(cg_encode_opts){.add_special = !req->no_bos,
                                                          .split_special = req->split_special,
                                                          .cancelled = req->cancelled,
                                                          .cancel_ud = req->cancel_ud},
                                        t) != CG_OK) {
        if (req->cancelled && req->cancelled(req->cancel_ud)) {
            cg_seterr(err, errlen, "the client left while the prompt was tokenized");
            return CG_E_UNAVAILABLE;
        }
        cg_seterr(err, errlen, "the prompt cannot be tokenized (invalid UTF-8)");
        return CG_E_UTF8;
    }
    if (t->n == 0 || t->n > (size_t)cfg->max_pos) {
        cg_seterr(err, errlen, "the prompt has %zu tokens; the model holds %d positions", t->n,
                  cfg->max_pos);
        return t->n ? CG_E_CONTEXT : CG_E_VALUE;
    }
    return CG_OK;
}

/* With prompt logprobs: the arrays the forward fills (row i scores token i + 1). */
static void want_prompt_logprobs(const cg_complete_req *req, const int32_t *ids, uint32_t n,
                                 cg_fwd_seq *q, int32_t **next, cg_complete_result *out)
{
    if (req->prompt_logprobs < 0) return;
    size_t k = (size_t)req->prompt_logprobs;
    *next = cg_malloc(n * sizeof **next);
    for (uint32_t i = 0; i < n; i++)
        (*next)[i] = i + 1 < n ? ids[i + 1] : -1;
    out->prompt_lp = cg_malloc(((size_t)n + 1) * sizeof(float));
    out->prompt_top_ids = cg_calloc(((size_t)n + 1) * (k ? k : 1), sizeof(int32_t));
    out->prompt_top_lps = cg_calloc(((size_t)n + 1) * (k ? k : 1), sizeof(float));
    out->prompt_top_k = (int)k;
    q->next = *next;
    /* row i's entry belongs to token i + 1: store from index 1 */
    q->row_lp = out->prompt_lp + 1;
    q->row_top_ids = out->prompt_top_ids + k;
    q->row_top_lps = out->prompt_top_lps + k;
    q->row_top_k = (int)k;
}

/* A live assembly's prompt tokens (cg_live_with). */
static void tokens_of(const cg_assembly *a, void *ud)
{
    *(uint32_t *)ud = a->n_tokens;
}

/* The prompt and the completion must fit the model's positions (as OpenAI and vLLM answer). */
static cg_status fit_context(cg_engine *e, cg_complete_req *r, uint32_t n_prompt, char *err,
                             size_t errlen)
{
    const uint64_t max_pos = (uint64_t)cg_model_cfg(e->m)->max_pos;
    if ((uint64_t)n_prompt + r->max_tokens <= max_pos) return CG_OK;
    if (r->clamp_max_tokens) {
        r->max_tokens = (uint32_t)(max_pos > n_prompt ? max_pos - n_prompt : 0);
        return CG_OK;
    }
    return cg_engine_fits((int)max_pos, n_prompt, r->max_tokens, err, errlen);
}

cg_status cg_engine_fits(int max_pos, uint64_t n_prompt, uint64_t max_tokens, char *err,
                         size_t errlen)
{
    if (n_prompt + max_tokens <= (uint64_t)max_pos) return CG_OK;
    if (n_prompt >= (uint64_t)max_pos) {
        cg_seterr(err, errlen,
                  "This model's maximum context length is %d tokens. However, the prompt has "
                  "%llu tokens. Please reduce the prompt.",
                  max_pos, (unsigned long long)n_prompt);
        return CG_E_CONTEXT;
    }
    cg_seterr(err, errlen,
              "This model's maximum context length is %d tokens. However, you requested %llu "
              "tokens (%llu in the prompt, %llu for the completion). Please reduce the prompt or "
              "max_tokens.",
              max_pos, (unsigned long long)(n_prompt + max_tokens), (unsigned long long)n_prompt,
              (unsigned long long)max_tokens);
    return CG_E_CONTEXT;
}

/* The KV of a plain prompt: one causal forward, no cache. */
static cg_status plain_prompt(cg_engine *e, const cg_complete_req *req, cg_assembly **out,
                              cg_complete_result *res, char *err, size_t errlen)
{
    const cg_model_config *cfg = cg_model_cfg(e->m);
    cg_tokens t = {0};
    int32_t *next = NULL;
    *out = NULL;
    cg_status st = prompt_tokens(e, req, &t, err, errlen);
    if (st != CG_OK) {
        cg_tokens_free(&t);
        return st;
    }
    uint32_t n = (uint32_t)t.n;
    cg_complete_req fit = *req; /* refused before the prefill, not after it */
    if ((st = fit_context(e, &fit, n, err, errlen)) != CG_OK) {
        cg_tokens_free(&t);
        return st;
    }
    uint64_t cap = CG_MIN((uint64_t)n + e->p.reserve_tokens, (uint64_t)cfg->max_pos);
    cg_assembly *a = cg_live_prepare(e->live, n, (uint32_t)cap, 0);
    st = CG_E_INTERNAL;
    if (a) {
        a->tokens = t.ids; /* taken over */
        t.ids = NULL;
        cg_attn_span span = {0, n, 0, 0};
        cg_fwd_seq q = {.kv = a->kv,
                        .tokens = a->tokens,
                        .n = n,
                        .spans = &span,
                        .n_spans = 1,
                        .logits = a->logits};
        want_prompt_logprobs(req, a->tokens, n, &q, &next, res);
        st = cg_sched_prefill(e->sched, &q, NULL);
    }
    free(next);
    cg_tokens_free(&t);
    if (st != CG_OK) {
        cg_live_discard(e->live, &a, 0);
        return st;
    }
    if (res->prompt_lp) res->prompt_lp[0] = NAN;
    cg_engine_stats add = {.tokens_computed = n, .prefill_tokens = n};
    cg_engine_count(e, &add);
    *out = a;
    return CG_OK;
}

/* Appends token tok (and its bytes) to the result. */
static void append_token(cg_complete_result *out, int32_t tok, const char *bytes, size_t nb)
{
    if ((out->n_tokens & (out->n_tokens - 1)) == 0) /* 0, 1, 2, 4, ...: grow */
        out->tokens =
            cg_realloc(out->tokens, (out->n_tokens ? out->n_tokens * 2 : 1) * sizeof *out->tokens);
    out->tokens[out->n_tokens++] = tok;
    if (out->text_len + nb + 1 > out->text_cap) {
        out->text_cap = CG_MAX(out->text_cap * 2, out->text_len + nb + 1);
        out->text = cg_realloc(out->text, out->text_cap);
    }
    memcpy(out->text + out->text_len, bytes, nb);
    out->text_len += nb;
    out->text[out->text_len] = '\0';
}

typedef struct grow_ctx {
    cg_engine *e;
    cg_assembly *a;
} grow_ctx;

/* The scheduler ran past the assembly's reserve: a bigger KV (on the scheduler thread). */
static cg_kv *grow(void *ud, cg_kv *kv, uint32_t pos, uint32_t need)
{
    grow_ctx *g = ud;
    const cg_model_config *cfg = cg_model_cfg(g->e->m);
    uint64_t cap =
        CG_MIN(CG_MAX((uint64_t)cg_kv_cap(kv) * 2, (uint64_t)need + g->e->p.reserve_tokens),
               (uint64_t)cfg->max_pos);
    cg_live_grow(g->e->live, g->a, pos, (uint32_t)CG_MAX(cap, need));
    return g->a->kv;
}

/* A quality probe of assembly a: its prompt, and room for the distributions of the prompt's
 * end and of probe_tokens generated tokens (filled by the scheduler, see finish_probe). */
static cg_probe *start_probe(cg_engine *e, const cg_complete_req *req, const cg_assembly *a)
{
    if (!req->probe || !a->assembled || !a->tokens) return NULL;
    const size_t V = (size_t)cg_model_cfg(e->m)->vocab_size;
    const uint32_t rows = CG_MIN(req->probe_tokens, CG_MAX(req->max_tokens, 1u) - 1) + 1;
    cg_probe *p = cg_calloc(1, sizeof *p);
    p->tokens = cg_malloc(((size_t)a->n_tokens + rows) * sizeof *p->tokens);
    memcpy(p->tokens, a->tokens, (size_t)a->n_tokens * sizeof *p->tokens);
    p->n_prompt = a->n_tokens;
    p->n_rows = rows; /* capacity until finish_probe */
    p->logits = cg_malloc((size_t)rows * V * sizeof(float));
    p->mode = a->mode;
    p->recompute_ratio = a->recompute_ratio;
    p->recompute_select = a->recompute_select;
    p->recompute_prefix_tokens = a->recompute_prefix;
    p->recomputed_tokens = a->recomputed;
    return p;
}

/* After decoding: the captured samples become the probe's rows; sample i was drawn from the
 * distribution after i generated tokens, and the first n - 1 of those are fed to the
 * comparison. Without any sample (max_tokens 0) the prompt's end alone is compared. */
static void finish_probe(cg_engine *e, cg_probe *p, const cg_dseq *d, const float *logits)
{
    const size_t V = (size_t)cg_model_cfg(e->m)->vocab_size;
    if (!d || !d->cap_n) {
        memcpy(p->logits, logits, V * sizeof(float));
        p->n_rows = 1;
        return;
    }
    p->n_rows = d->cap_n;
    memcpy(p->tokens + p->n_prompt, d->cap_tokens, (d->cap_n - 1) * sizeof *p->tokens);
}

/* Decodes from a's KV and last prompt logits; the scheduler computes, this thread delivers. */
static cg_status decode(cg_engine *e, const cg_complete_req *req, cg_assembly *a,
                        cg_complete_result *out, char *err, size_t errlen)
{
    const cg_tokenizer *tok = cg_model_tokenizer(e->m);
    out->finish_reason = "length";
    out->text_cap = 64;
    out->text = cg_malloc(out->text_cap);
    out->text[0] = '\0';
    out->probe = start_probe(e, req, a);
    if (req->max_tokens == 0) {
        if (out->probe) finish_probe(e, out->probe, NULL, a->logits);
        return CG_OK;
    }
    grow_ctx gc = {e, a};
    cg_dseq d = {.kv = a->kv,
                 .pos = a->n_tokens,
                 .logits = a->logits,
                 .sampler = {req->temperature, req->top_p, req->seed},
                 .max_tokens = req->max_tokens,
                 .top_k = req->logprobs,
                 .grow = grow,
                 .grow_ud = &gc};
    int32_t *cap_tokens = NULL;
    if (out->probe) {
        cap_tokens = cg_malloc(out->probe->n_rows * sizeof *cap_tokens);
        d.cap_logits = out->probe->logits;
        d.cap_tokens = cap_tokens;
        d.cap_max = out->probe->n_rows;
    }
    float *first = NULL; /* the prompt's distribution, in case nothing is sampled */
    if (out->probe) {
        first = cg_malloc((size_t)cg_model_cfg(e->m)->vocab_size * sizeof(float));
        memcpy(first, a->logits, (size_t)cg_model_cfg(e->m)->vocab_size * sizeof(float));
    }
    cg_sched_join(e->sched, &d);
    cg_tok_rec rec;
    cg_dseq_state state;
    while (cg_sched_next(e->sched, &d, &rec, &state)) {
        /* tokens the scheduler made before it saw the cancel are drained, not answered */
        if (out->cancelled) continue;
        size_t nb = 0;
        const char *bytes = "";
        if (!cg_tokenizer_is_special(tok, rec.token)) {
            bytes = cg_tokenizer_token_bytes(tok, rec.token, &nb);
            if (!bytes) bytes = "", nb = 0;
        }
        append_token(out, rec.token, bytes, nb);
        if (req->on_token && req->on_token(req->ud, &rec, bytes, nb) != 0) {
            out->cancelled = 1;
            cg_sched_cancel(e->sched, &d);
        }
    }
    cg_sched_leave(e->sched, &d);
    a->kv = d.kv;
    if (out->probe) finish_probe(e, out->probe, &d, first);
    free(cap_tokens);
    free(first);
    if (out->cancelled || state == CG_DSEQ_EOS || state == CG_DSEQ_CANCELLED)
        out->finish_reason = "stop";
    if (state == CG_DSEQ_FAILED) {
        cg_seterr(err, errlen, "a decode step failed at position %u", d.pos);
        return CG_E_INTERNAL;
    }
    return CG_OK;
}

cg_status cg_engine_complete(cg_engine *e, const cg_complete_req *req, uint64_t now,
                             cg_complete_result *out, char *err, size_t errlen)
{
    cg_assembly *a = NULL;
    cg_status st = CG_OK;
    memset(out, 0, sizeof *out);
    if (err && errlen) err[0] = '\0';
    cg_complete_req r = *req;
    if (req->assembly_id) {
        /* the context is checked before the assembly is consumed: a request refused for its
         * max_tokens can be sent again with fewer */
        uint32_t n = 0;
        if (cg_live_with(e->live, req->assembly_id, now, tokens_of, &n) == CG_OK &&
            (st = fit_context(e, &r, n, err, errlen)) != CG_OK)
            return st;
        a = cg_live_take(e->live, req->assembly_id, now); /* consumed: DELETE and the reaper
                                                             no longer see it */
        if (!a) {
            cg_seterr(err, errlen, "assembly '%.64s' is unknown, expired or already consumed",
                      req->assembly_id);
            return CG_E_NOT_FOUND;
        }
    } else {
        st = plain_prompt(e, req, &a, out, err, errlen);
        if (st != CG_OK) {
            cg_complete_result_free(out);
            return st;
        }
    }
    st = fit_context(e, &r, a->n_tokens, err, errlen);
    if (st == CG_OK) st = decode(e, &r, a, out, err, errlen);
    if (st == CG_OK && a->tokens) {
        out->prompt_ids = cg_malloc(((size_t)a->n_tokens + 1) * sizeof *out->prompt_ids);
        memcpy(out->prompt_ids, a->tokens, (size_t)a->n_tokens * sizeof *out->prompt_ids);
        out->n_prompt = a->n_tokens;
    }
    if (st == CG_OK) {
        out->prompt_tokens = a->n_tokens;
        out->completion_tokens = (uint32_t)out->n_tokens;
        out->cached_tokens = a->cached_tokens;
        out->recomputed_tokens = a->recomputed;
        cg_engine_stats add = {.decode_tokens = out->n_tokens};
        cg_engine_count(e, &add);
    }
    cg_live_discard(e->live, &a, now);
    if (st != CG_OK) cg_complete_result_free(out);
    return st;
}

cg_status cg_engine_admit(cg_engine *e, int force)
{
    return cg_sched_admit(e->sched, force);
}

void cg_engine_leave(cg_engine *e)
{
    cg_sched_release(e->sched);
}

cg_sched_stats cg_engine_sched_stats(cg_engine *e)
{
    return cg_sched_get_stats(e->sched);
}

cg_sched *cg_engine_sched(cg_engine *e)
{
    return e->sched;
}

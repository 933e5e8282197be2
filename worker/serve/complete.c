/* Decoding of the assembly engine: from a live assembly (which it consumes) or from a plain
 * prompt (worker/serve/engine.h, cg_engine_complete). */
#include "worker/serve/engine_state.h"

#include <stdlib.h>
#include <string.h>

#include "base/base.h"

void cg_complete_result_free(cg_complete_result *r)
{
    if (!r) return;
    cg_free(&r->text);
    cg_free(&r->tokens);
    r->text_len = r->n_tokens = 0;
}

/* Runs one forward (one at a time: it uses both cores) and counts its tokens. */
static cg_status fwd_one(cg_engine *e, cg_kv *kv, const int32_t *t, uint32_t n, uint32_t slot,
                         cg_attn_span span, float *logits)
{
    pthread_mutex_lock(&e->mu);
    cg_status st = cg_model_forward(e->m, kv, t, n, slot, slot, &span, 1, logits);
    pthread_mutex_unlock(&e->mu);
    return st;
}

/* One decode token at pos, on the batch-invariant decode kernels. */
static cg_status decode_step(cg_engine *e, cg_kv *kv, int32_t tok, uint32_t pos, float *logits)
{
    cg_attn_span span = {pos, 1, 0, 0};
    cg_fwd_seq q = {.kv = kv, .tokens = &tok, .n = 1, .slot0 = pos, .pos0 = pos,
                    .spans = &span, .n_spans = 1, .logits = logits};
    pthread_mutex_lock(&e->mu);
    cg_status st = cg_model_forward_batch(e->m, &q, 1, CG_FWD_DECODE, NULL);
    pthread_mutex_unlock(&e->mu);
    return st;
}

/* The KV of a plain prompt: BOS + its tokens, one causal forward, no cache. */
static cg_status plain_prompt(cg_engine *e, const char *text, size_t len, cg_assembly **out,
                              char *err, size_t errlen)
{
    const cg_model_config *cfg = cg_model_cfg(e->m);
    *out = NULL;
    if (len + 1 > (size_t)cfg->max_pos) {
        cg_seterr(err, errlen, "the prompt needs %zu positions; the model holds %d", len + 1,
                  cfg->max_pos);
        return CG_E_CONTEXT;
    }
    int32_t *t = cg_malloc((len + 2) * sizeof *t);
    uint32_t n = (uint32_t)cg_tok_encode(e->m, text, len, 1, t);
    if (!n) {
        free(t);
        cg_seterr(err, errlen, "the prompt cannot be tokenized (invalid UTF-8)");
        return CG_E_UTF8;
    }
    uint64_t cap = CG_MIN((uint64_t)n + e->p.reserve_tokens, (uint64_t)cfg->max_pos);
    cg_assembly *a = cg_live_prepare(e->live, n, (uint32_t)cap, 0);
    cg_status st = a ? fwd_one(e, a->kv, t, n, 0, (cg_attn_span){0, n, 0, 0}, a->logits)
                     : CG_E_INTERNAL;
    free(t);
    if (st != CG_OK) {
        cg_live_discard(e->live, &a, 0);
        return st;
    }
    cg_engine_stats add = {.tokens_computed = n, .prefill_tokens = n};
    cg_engine_count(e, &add);
    *out = a;
    return CG_OK;
}

/* Appends token tok (and its bytes) to the result. */
static void append_token(cg_complete_result *out, size_t *cap_tok, int32_t tok, const char *bytes,
                         size_t nb)
{
    if (out->n_tokens == *cap_tok) {
        *cap_tok = *cap_tok ? *cap_tok * 2 : 64;
        out->tokens = cg_realloc(out->tokens, *cap_tok * sizeof *out->tokens);
    }
    if (out->text_len + nb + 1 > out->text_cap) {
        out->text_cap = CG_MAX(out->text_cap * 2, out->text_len + nb + 1);
        out->text = cg_realloc(out->text, out->text_cap);
    }
    out->tokens[out->n_tokens++] = tok;
    memcpy(out->text + out->text_len, bytes, nb);
    out->text_len += nb;
    out->text[out->text_len] = '\0';
}

/* The decode loop over a's KV from its last prompt token's logits. */
static cg_status decode(cg_engine *e, const cg_complete_req *req, cg_assembly *a,
                        cg_complete_result *out, char *err, size_t errlen)
{
    const cg_model_config *cfg = cg_model_cfg(e->m);
    cg_sampler smp = {req->temperature, req->top_p, req->seed};
    float *logits = cg_malloc((size_t)cfg->vocab_size * sizeof(float));
    memcpy(logits, a->logits, (size_t)cfg->vocab_size * sizeof(float));
    uint32_t pos = a->n_tokens;
    size_t cap_tok = 0;
    cg_status st = CG_OK;
    out->finish_reason = "length";
    out->text_cap = 64;
    out->text = cg_malloc(out->text_cap);
    out->text[0] = '\0';
    for (uint32_t i = 0; i < req->max_tokens; i++) {
        if (req->on_logits) req->on_logits(req->ud, logits, cfg->vocab_size);
        int32_t tok = cg_sample(&smp, logits, cfg->vocab_size);
        if (cg_model_config_is_eos(cfg, tok)) {
            out->finish_reason = "stop";
            break;
        }
        char bytes[CG_TOKEN_MAX_BYTES];
        size_t nb = cg_tok_decode(e->m, tok, bytes);
        append_token(out, &cap_tok, tok, bytes, nb);
        if (req->on_token && req->on_token(req->ud, tok, bytes, nb) != 0) {
            out->cancelled = 1;
            out->finish_reason = "stop";
            break;
        }
        if (i + 1 == req->max_tokens) break;
        if (pos >= (uint32_t)cfg->max_pos) break; /* no position left: "length" */
        if (pos >= cg_kv_cap(a->kv)) {
            uint64_t cap = CG_MIN(CG_MAX((uint64_t)cg_kv_cap(a->kv) * 2,
                                         (uint64_t)pos + e->p.reserve_tokens),
                                  (uint64_t)cfg->max_pos);
            cg_live_grow(e->live, a, pos, (uint32_t)cap);
        }
        if ((st = decode_step(e, a->kv, tok, pos, logits)) != CG_OK) {
            cg_seterr(err, errlen, "decode step at position %u failed", pos);
            break;
        }
        pos++;
    }
    free(logits);
    return st;
}

cg_status cg_engine_complete(cg_engine *e, const cg_complete_req *req, uint64_t now,
                             cg_complete_result *out, char *err, size_t errlen)
{
    cg_assembly *a = NULL;
    cg_status st = CG_OK;
    memset(out, 0, sizeof *out);
    if (err && errlen) err[0] = '\0';
    if (req->assembly_id) {
        a = cg_live_take(e->live, req->assembly_id, now); /* consumed: DELETE and the reaper
                                                             no longer see it */
        if (!a) {
            cg_seterr(err, errlen, "assembly '%.64s' is unknown, expired or already consumed",
                      req->assembly_id);
            return CG_E_NOT_FOUND;
        }
    } else {
        st = plain_prompt(e, req->prompt ? req->prompt : "", req->prompt ? req->prompt_len : 0, &a,
                          err, errlen);
        if (st != CG_OK) return st;
    }
    st = decode(e, req, a, out, err, errlen);
    if (st == CG_OK) {
        out->prompt_tokens = a->n_tokens;
        out->completion_tokens = (uint32_t)out->n_tokens;
        out->cached_tokens = a->cached_tokens;
        cg_engine_stats add = {.decode_tokens = out->n_tokens};
        cg_engine_count(e, &add);
    }
    cg_live_discard(e->live, &a, now);
    if (st != CG_OK) cg_complete_result_free(out);
    return st;
}

/* Chat requests as JSON: parsing, the two renderings and the chat <-> completions shapes
 * (cache/chatreq.h). */
#include "cache/chatreq.h"

#include <stdio.h>
#include <string.h>

/* ---------------------------------------------------------------- parsing */

/* One message's content: a string, null, or text parts joined with '\n' into part. Only an
 * assistant turn may go without (its tool calls stand for it), as in OpenAI's API. */
static cg_status get_content(json_t *c, size_t i, cg_chat_msg *row, cg_buf *part, int *non_text,
                             char *msg, size_t msglen)
{
    if (!c || json_is_null(c)) {
        if (!strcmp(row->role, "assistant")) return CG_OK;
        snprintf(msg, msglen, "messages[%zu].content is required for role %.32s", i, row->role);
        return CG_E_MISSING;
    }
    if (json_is_string(c)) {
        row->content = json_string_value(c);
        row->content_len = json_string_length(c);
        return CG_OK;
    }
    if (!json_is_array(c)) {
        snprintf(msg, msglen, "messages[%zu].content must be a string or an array of parts", i);
        return CG_E_TYPE;
    }
    size_t j;
    json_t *p;
    json_array_foreach(c, j, p)
    {
        json_t *type = json_is_object(p) ? json_object_get(p, "type") : NULL;
        if (!json_is_string(type)) {
            snprintf(msg, msglen, "messages[%zu].content[%zu] must be an object with a type", i, j);
            return CG_E_TYPE;
        }
        if (strcmp(json_string_value(type), "text") != 0) {
            *non_text = 1;
            continue;
        }
        json_t *text = json_object_get(p, "text");
        if (!json_is_string(text)) {
            snprintf(msg, msglen, "messages[%zu].content[%zu].text must be a string", i, j);
            return CG_E_TYPE;
        }
        cg_status st = CG_OK;
        if (part->len) st = cg_buf_append(part, "\n", 1);
        if (st == CG_OK)
            st = cg_buf_append(part, json_string_value(text), json_string_length(text));
        (void)st; /* an unbounded buffer; the body cap bounds it */
    }
    row->content = part->len ? part->data : NULL;
    row->content_len = part->len;
    return CG_OK;
}

static cg_status get_messages(json_t *body, cg_chat_req *r, char *msg, size_t msglen)
{
    json_t *ms = json_object_get(body, "messages");
    if (!ms || json_is_null(ms)) {
        snprintf(msg, msglen, "messages is required");
        return CG_E_MISSING;
    }
    if (!json_is_array(ms)) {
        snprintf(msg, msglen, "messages must be an array");
        return CG_E_TYPE;
    }
    size_t n = json_array_size(ms);
    if (!n) {
        snprintf(msg, msglen, "messages must not be empty");
        return CG_E_VALUE;
    }
    r->msgs = cg_calloc(n, sizeof *r->msgs);
    r->parts = cg_calloc(n, sizeof *r->parts);
    r->n_msgs = n;
    for (size_t i = 0; i < n; i++)
        cg_buf_init_unbounded(&r->parts[i]); /* text parts of the capped body */
    for (size_t i = 0; i < n; i++) {
        json_t *m = json_array_get(ms, i);
        if (!json_is_object(m)) {
            snprintf(msg, msglen, "messages[%zu] must be an object", i);
            return CG_E_TYPE;
        }
        json_t *role = json_object_get(m, "role");
        if (!json_is_string(role) || !json_string_length(role)) {
            snprintf(msg, msglen, "messages[%zu].role must be a non-empty string", i);
            return role ? CG_E_TYPE : CG_E_MISSING;
        }
        r->msgs[i].role = json_string_value(role);
        cg_status st = get_content(json_object_get(m, "content"), i, &r->msgs[i], &r->parts[i],
                                   &r->non_text, msg, msglen);
        if (st != CG_OK) return st;
    }
    return CG_OK;
}

static cg_status get_documents(json_t *body, cg_chat_req *r, char *msg, size_t msglen)
{
    json_t *d = json_object_get(body, "documents");
    if (!d || json_is_null(d)) return CG_OK;
    if (!json_is_array(d)) {
        snprintf(msg, msglen, "documents must be an array of strings");
        return CG_E_TYPE;
    }
    size_t k = json_array_size(d);
    r->docs = cg_calloc(k ? k : 1, sizeof *r->docs);
    r->doc_lens = cg_calloc(k ? k : 1, sizeof *r->doc_lens);
    for (size_t i = 0; i < k; i++) {
        json_t *s = json_array_get(d, i);
        if (!json_is_string(s)) {
            snprintf(msg, msglen, "documents[%zu] must be a string", i);
            return CG_E_TYPE;
        }
        r->docs[i] = json_string_value(s);
        r->doc_lens[i] = json_string_length(s);
    }
    r->n_docs = k;
    return CG_OK;
}

cg_status cg_chat_req_parse(json_t *body, cg_chat_req *out, const char **param, char *msg,
                            size_t msglen)
{
    memset(out, 0, sizeof *out);
    msg[0] = '\0';
    *param = "messages";
    cg_status st = get_messages(body, out, msg, msglen);
    if (st != CG_OK) return st;
    *param = "documents";
    if ((st = get_documents(body, out, msg, msglen)) != CG_OK) return st;
    *param = NULL;
    return CG_OK;
}

void cg_chat_req_free(cg_chat_req *r)
{
    if (!r) return;
    for (size_t i = 0; r->parts && i < r->n_msgs; i++)
        cg_buf_free(&r->parts[i]);
    free(r->parts);
    free(r->msgs);
    free(r->docs);
    free(r->doc_lens);
    memset(r, 0, sizeof *r);
}

/* ---------------------------------------------------------------- renderings */

cg_status cg_chat_req_render_flat(const cg_chat_req *r, cg_buf *out)
{
    cg_status st = CG_OK;
    for (size_t i = 0; i < r->n_msgs && st == CG_OK; i++) {
        st = cg_buf_printf(out, "%s: ", r->msgs[i].role);
        if (st == CG_OK && r->msgs[i].content_len)
            st = cg_buf_append(out, r->msgs[i].content, r->msgs[i].content_len);
        if (st == CG_OK) st = cg_buf_append(out, "\n", 1);
    }
    if (st == CG_OK) st = cg_buf_append(out, "assistant:", 10);
    return st;
}

struct cg_chat_model {
    cg_chat_template *tpl;
    char *src, *bos, *eos;
    int refs; /* atomic */
};

cg_status cg_chat_model_new(const char *src, const char *bos, const char *eos, cg_chat_model **out,
                            char *err, size_t errlen)
{
    *out = NULL;
    cg_chat_template *t = NULL;
    cg_status st = cg_chat_template_new(src, strlen(src), NULL, &t, err, errlen);
    if (st != CG_OK) return st;
    cg_chat_model *m = cg_calloc(1, sizeof *m);
    m->tpl = t;
    m->src = cg_strdup(src);
    m->bos = bos ? cg_strdup(bos) : NULL;
    m->eos = eos ? cg_strdup(eos) : NULL;
    m->refs = 1;
    *out = m;
    return CG_OK;
}

cg_chat_model *cg_chat_model_ref(cg_chat_model *m)
{
    if (m) __atomic_add_fetch(&m->refs, 1, __ATOMIC_RELAXED);
    return m;
}

void cg_chat_model_unref(cg_chat_model **mp)
{
    if (!mp || !*mp) return;
    cg_chat_model *m = *mp;
    *mp = NULL;
    if (__atomic_sub_fetch(&m->refs, 1, __ATOMIC_ACQ_REL)) return;
    cg_chat_template_free(&m->tpl);
    free(m->src);
    free(m->bos);
    free(m->eos);
    free(m);
}

const char *cg_chat_model_source(const cg_chat_model *m)
{
    return m->src;
}

/* The system message's content with the documents after it: "<sys> <sep> <doc> ... <sep> ",
 * or "<sep> <doc> ... <sep> " without one. */
static void docs_into(cg_buf *b, const char *sys, size_t sys_len, const cg_chat_req *r,
                      const char *sep)
{
    cg_status st = cg_buf_append(b, sys ? sys : "", sys_len);
    for (size_t i = 0; i < r->n_docs && st == CG_OK; i++) {
        st = cg_buf_printf(b, "%s%s ", sys_len || i ? " " : "", sep);
        if (st == CG_OK) st = cg_buf_append(b, r->docs[i], r->doc_lens[i]);
    }
    if (st == CG_OK) st = cg_buf_printf(b, " %s ", sep);
    (void)st; /* an unbounded buffer; the body cap bounds it */
}

/* The template's messages: {role, content} rows, the documents in the system message. */
static json_t *template_messages(const cg_chat_req *r, const char *sep)
{
    json_t *msgs = json_array();
    int placed = r->n_docs == 0;
    if (!placed) {
        int has_system = 0;
        for (size_t i = 0; i < r->n_msgs; i++)
            has_system |= !strcmp(r->msgs[i].role, "system");
        if (!has_system) {
            cg_buf b;
            cg_buf_init_unbounded(&b); /* documents of the capped body */
            docs_into(&b, NULL, 0, r, sep);
            json_array_append_new(
                msgs, json_pack("{s:s, s:s%}", "role", "system", "content", b.data, b.len));
            cg_buf_free(&b);
            placed = 1;
        }
    }
    for (size_t i = 0; i < r->n_msgs; i++) {
        const cg_chat_msg *m = &r->msgs[i];
        json_t *content = m->content ? json_stringn(m->content, m->content_len) : json_null();
        if (!placed && !strcmp(m->role, "system")) {
            cg_buf b;
            cg_buf_init_unbounded(&b); /* a system message and documents of the capped body */
            docs_into(&b, m->content, m->content_len, r, sep);
            json_decref(content);
            content = json_stringn(b.data, b.len);
            cg_buf_free(&b);
            placed = 1;
        }
        json_array_append_new(msgs, json_pack("{s:s, s:o}", "role", m->role, "content", content));
    }
    return msgs;
}

cg_status cg_chat_kwargs_check(const json_t *kwargs, char *msg, size_t n)
{
    size_t k = json_object_size(kwargs);
    if (k <= CG_CHAT_MAX_KWARGS) return CG_OK;
    snprintf(msg, n, "chat_template_kwargs has %zu keys; at most %d are accepted", k,
             CG_CHAT_MAX_KWARGS);
    return CG_E_VALUE;
}

cg_status cg_chat_model_render(const cg_chat_model *m, const cg_chat_req *r,
                               const cg_chat_render_opts *o, cg_buf *out, char *err, size_t errlen)
{
    if (r->non_text) {
        snprintf(err, errlen, "only text content parts can be rendered with the chat template");
        return CG_E_UNSUPPORTED;
    }
    cg_status kst = cg_chat_kwargs_check(o->kwargs, err, errlen);
    if (kst != CG_OK) return kst;
    json_t *vars = json_object();
    if (o->kwargs) json_object_update(vars, (json_t *)o->kwargs);
    json_object_set_new(vars, "messages", template_messages(r, o->separator));
    json_object_set_new(vars, "add_generation_prompt", json_boolean(o->add_generation_prompt));
    json_object_set_new(vars, "bos_token", json_string(m->bos ? m->bos : ""));
    json_object_set_new(vars, "eos_token", json_string(m->eos ? m->eos : ""));
    cg_status st = cg_chat_template_render(m->tpl, vars, out, err, errlen);
    json_decref(vars);
    return st;
}

/* ---------------------------------------------------------------- shapes */

/* Sampling fields that mean the same in chat and completions requests. */
static const char *const CHAT_COPY[] = {"temperature",
                                        "top_p",
                                        "seed",
                                        "stop",
                                        "n",
                                        "stream",
                                        "stream_options",
                                        "presence_penalty",
                                        "frequency_penalty",
                                        "logit_bias",
                                        "user"};

json_t *cg_chat_as_completion(json_t *body, const char *prompt, size_t prompt_len)
{
    json_t *o = json_object();
    json_object_set(o, "model", json_object_get(body, "model"));
    json_object_set_new(o, "prompt", json_stringn(prompt ? prompt : "", prompt_len));
    json_t *mt = json_object_get(body, "max_completion_tokens");
    if (!mt || json_is_null(mt)) mt = json_object_get(body, "max_tokens");
    if (mt && !json_is_null(mt)) json_object_set(o, "max_tokens", mt);
    for (size_t i = 0; i < CG_ARRAY_LEN(CHAT_COPY); i++) {
        json_t *v = json_object_get(body, CHAT_COPY[i]);
        if (v) json_object_set(o, CHAT_COPY[i], v);
    }
    if (json_is_true(json_object_get(body, "logprobs"))) {
        json_t *k = json_object_get(body, "top_logprobs");
        json_object_set_new(o, "logprobs",
                            json_integer(json_is_number(k) ? (json_int_t)json_number_value(k) : 0));
    }
    return o;
}

static json_t *bytes_of(const char *s)
{
    json_t *a = json_array();
    for (const unsigned char *p = (const unsigned char *)(s ? s : ""); *p; p++)
        json_array_append_new(a, json_integer(*p));
    return a;
}

/* Completions logprobs {tokens, token_logprobs, top_logprobs} as chat's {content: [...]}. */
static json_t *chat_logprobs(json_t *lp)
{
    json_t *tokens = json_object_get(lp, "tokens");
    json_t *values = json_object_get(lp, "token_logprobs");
    json_t *tops = json_object_get(lp, "top_logprobs");
    if (!json_is_array(tokens)) return json_null();
    json_t *content = json_array();
    for (size_t i = 0; i < json_array_size(tokens); i++) {
        const char *tok = json_string_value(json_array_get(tokens, i));
        json_t *top = json_array(), *v;
        const char *k;
        json_object_foreach(json_array_get(tops, i), k, v) json_array_append_new(
            top, json_pack("{s:s, s:O, s:o}", "token", k, "logprob", v, "bytes", bytes_of(k)));
        json_t *lpv = json_array_get(values, i);
        json_array_append_new(content, json_pack("{s:s, s:O, s:o, s:o}", "token", tok ? tok : "",
                                                 "logprob", lpv ? lpv : json_null(), "bytes",
                                                 bytes_of(tok), "top_logprobs", top));
    }
    return json_pack("{s:o}", "content", content);
}

void cg_chat_answer_shape(json_t *obj, int stream, int first)
{
    const char *id = json_string_value(json_object_get(obj, "id"));
    if (id && strncmp(id, "chatcmpl-", 9) != 0) {
        char nid[160];
        snprintf(nid, sizeof nid, "chatcmpl-%s", strncmp(id, "cmpl-", 5) ? id : id + 5);
        json_object_set_new(obj, "id", json_string(nid));
    }
    json_object_set_new(obj, "object",
                        json_string(stream ? "chat.completion.chunk" : "chat.completion"));
    size_t i;
    json_t *ch;
    json_array_foreach(json_object_get(obj, "choices"), i, ch)
    {
        if (!json_is_object(ch)) continue;
        json_t *text = json_object_get(ch, "text");
        json_t *m = json_object();
        if (!stream || first) json_object_set_new(m, "role", json_string("assistant"));
        if (!stream)
            json_object_set(m, "content", json_is_string(text) ? text : json_null());
        else if (json_is_string(text) && (first || json_string_length(text)))
            json_object_set(m, "content", text);
        json_object_set_new(ch, stream ? "delta" : "message", m);
        json_object_del(ch, "text");
        json_t *lp = json_object_get(ch, "logprobs");
        json_object_set_new(ch, "logprobs", json_is_object(lp) ? chat_logprobs(lp) : json_null());
    }
}

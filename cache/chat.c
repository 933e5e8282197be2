/* Chat rendering: messages + documents[] into "system <sep> chunk ... <sep> question" with the
 * segment offsets, checked to split back identically. The rule is in chat.h and README. */
#include "cache/chat.h"

#include <string.h>

/* Whitespace tried, in order, as the padding around the separator in the rendered prompt. */
static const char PADS[] = " \n\t\r\f\v";

int cg_chat_is_system_role(const char *role)
{
    return role && (strcmp(role, "system") == 0 || strcmp(role, "developer") == 0);
}

static int is_space(unsigned char c)
{
    return c == ' ' || c == '\t' || c == '\n' || c == '\r' || c == '\v' || c == '\f';
}

/* Leftmost occurrence of sep in s[from..len), or len. Message contents are small next to a
 * completion prompt, so memmem (linear, no worst case) is fast enough here. */
static size_t find_sep(const char *s, size_t len, size_t from, const char *sep, size_t sep_len)
{
    if (sep_len > len || from > len - sep_len) return len;
    const char *q = memmem(s + from, len - from, sep, sep_len);
    return q ? (size_t)(q - s) : len;
}

/* Iterates the non-empty trimmed parts of one content split by the separator. */
typedef struct part_iter {
    const char *s;
    size_t len;
    size_t pos; /* start of the next raw part */
    int done;
    int count_empty; /* count empty parts: set for documents and for contents with a separator */
    size_t *empties;
} part_iter;

static void part_iter_init(part_iter *it, const char *s, size_t len, int has_sep, int is_document,
                           size_t *empties)
{
    it->s = s;
    it->len = len;
    it->pos = 0;
    it->done = 0;
    it->count_empty = has_sep || is_document;
    it->empties = empties;
}

/* Returns 1 and the next non-empty part, or 0 when the content is exhausted. */
static int part_next(part_iter *it, const char *sep, size_t sep_len, const char **part,
                     size_t *part_len)
{
    while (!it->done) {
        size_t at = find_sep(it->s, it->len, it->pos, sep, sep_len);
        size_t a = it->pos, b = at;
        if (at == it->len)
            it->done = 1;
        else
            it->pos = at + sep_len;
        while (a < b && is_space((unsigned char)it->s[a]))
            a++;
        while (b > a && is_space((unsigned char)it->s[b - 1]))
            b--;
        if (a == b) {
            if (it->count_empty) (*it->empties)++;
            continue;
        }
        *part = it->s + a;
        *part_len = b - a;
        return 1;
    }
    return 0;
}

typedef struct render {
    const cg_split_params *p;
    const char *sep;
    size_t sep_len;
    char pad; /* '\0': no padding */
    cg_buf *text;
    cg_split_result *segs;
} render;

/* Appends the joiner before every segment but the first, and returns the segment's offset. */
static cg_status begin_segment(render *r, size_t *off)
{
    cg_status st = CG_OK;
    if (r->p->max_segments && r->segs->n == r->p->max_segments) return CG_E_SEGMENTS;
    if (r->segs->n > 0) {
        if (r->pad) st = cg_buf_append(r->text, &r->pad, 1);
        if (st == CG_OK) st = cg_buf_append(r->text, r->sep, r->sep_len);
        if (st == CG_OK && r->pad) st = cg_buf_append(r->text, &r->pad, 1);
    }
    *off = r->text->len;
    return st;
}

static void end_segment(render *r, size_t off)
{
    cg_split_result *s = r->segs;
    if (s->n == s->cap) {
        s->cap = s->cap ? s->cap * 2 : 16;
        s->segs = cg_realloc(s->segs, s->cap * sizeof *s->segs);
    }
    s->segs[s->n].off = off;
    s->segs[s->n].len = r->text->len - off;
    s->segs[s->n].role = CG_ROLE_CHUNK;
    s->n++;
}

static cg_status add_segment(render *r, const char *part, size_t len)
{
    size_t off;
    cg_status st = begin_segment(r, &off);
    if (st == CG_OK) st = cg_buf_append(r->text, part, len);
    if (st == CG_OK) end_segment(r, off);
    return st;
}

static void reset_segs(cg_split_result *s)
{
    s->n = 0;
    s->empty_skipped = 0;
    s->passthrough = 0;
}

/* Checks the arguments that are not text: NULLs where bytes are promised, empty roles. */
static int args_ok(const cg_chat_msg *msgs, size_t n_msgs, const char *const *docs,
                   const size_t *doc_lens, size_t n_docs)
{
    if (n_msgs && !msgs) return 0;
    if (n_docs && (!docs || !doc_lens)) return 0;
    for (size_t i = 0; i < n_msgs; i++) {
        if (!msgs[i].role || !msgs[i].role[0]) return 0;
        if (!msgs[i].content && msgs[i].content_len) return 0;
    }
    for (size_t i = 0; i < n_docs; i++)
        if (!docs[i] && doc_lens[i]) return 0;
    return 1;
}

static int texts_utf8(const cg_chat_msg *msgs, size_t n_msgs, const char *const *docs,
                      const size_t *doc_lens, size_t n_docs)
{
    for (size_t i = 0; i < n_msgs; i++) {
        if (!cg_utf8_valid(msgs[i].role, strlen(msgs[i].role))) return 0;
        if (!cg_utf8_valid(msgs[i].content, msgs[i].content_len)) return 0;
    }
    for (size_t i = 0; i < n_docs; i++)
        if (!cg_utf8_valid(docs[i], doc_lens[i])) return 0;
    return 1;
}

/* The rendered text must split back into exactly the segments we recorded; a separator that
 * can form across a joint (or inside a role name) would silently change the chunks. */
static int splits_back(const render *r)
{
    cg_split_params vp = *r->p;
    vp.check_utf8 = 0;
    vp.max_segments = 0;
    vp.max_segment_bytes = 0;
    cg_split_result chk = {0};
    int same = 0;
    if (cg_split_prompt(r->text->data, r->text->len, &vp, &chk) != CG_OK) goto out;
    if (chk.passthrough || chk.n != r->segs->n) goto out;
    for (size_t i = 0; i < chk.n; i++)
        if (chk.segs[i].off != r->segs->segs[i].off || chk.segs[i].len != r->segs->segs[i].len)
            goto out;
    same = 1;
out:
    cg_split_result_free(&chk);
    return same;
}

cg_status cg_chat_render(const cg_chat_msg *msgs, size_t n_msgs, const char *const *docs,
                         const size_t *doc_lens, size_t n_docs, const cg_split_params *params,
                         cg_buf *text_out, cg_split_result *segs_out)
{
    cg_split_params defaults = cg_split_default_params();
    const cg_split_params *p = params ? params : &defaults;
    cg_status st = CG_OK;
    const char **last = NULL; /* per message: its last part, which goes into the question */
    size_t *last_len = NULL;
    unsigned char *has_sep = NULL;
    render r = {.p = p, .text = text_out, .segs = segs_out};
    size_t longest = 0;
    const char *part;
    size_t part_len;
    part_iter it;

    cg_buf_reset(text_out);
    reset_segs(segs_out);
    if (!p->separator || !p->separator[0] || !args_ok(msgs, n_msgs, docs, doc_lens, n_docs)) {
        st = CG_E_VALUE;
        goto out;
    }
    if (p->check_utf8 && !texts_utf8(msgs, n_msgs, docs, doc_lens, n_docs)) {
        st = CG_E_UTF8;
        goto out;
    }
    r.sep = p->separator;
    r.sep_len = strlen(r.sep);

    int any_sep = 0;
    has_sep = cg_calloc(n_msgs ? n_msgs : 1, 1);
    for (size_t i = 0; i < n_msgs; i++) {
        has_sep[i] = find_sep(msgs[i].content, msgs[i].content_len, 0, r.sep, r.sep_len) <
                     msgs[i].content_len;
        any_sep |= has_sep[i];
    }
    if (!any_sep && n_docs == 0) {
        segs_out->passthrough = 1;
        goto out;
    }
    for (const char *c = PADS; *c; c++) {
        if (!memchr(r.sep, *c, r.sep_len)) {
            r.pad = *c;
            break;
        }
    }

    /* 1. all parts of system/developer messages: the first becomes the system segment. */
    for (size_t i = 0; i < n_msgs; i++) {
        if (!cg_chat_is_system_role(msgs[i].role)) continue;
        part_iter_init(&it, msgs[i].content, msgs[i].content_len, has_sep[i], 0,
                       &segs_out->empty_skipped);
        while (part_next(&it, r.sep, r.sep_len, &part, &part_len))
            if ((st = add_segment(&r, part, part_len)) != CG_OK) goto out;
    }
    /* 2. documents[], each possibly split further by the separator. */
    for (size_t i = 0; i < n_docs; i++) {
        part_iter_init(&it, docs[i], doc_lens[i], 0, 1, &segs_out->empty_skipped);
        while (part_next(&it, r.sep, r.sep_len, &part, &part_len))
            if ((st = add_segment(&r, part, part_len)) != CG_OK) goto out;
    }
    /* 3. the conversation: every part but the last is a chunk, the last goes to the question. */
    last = cg_calloc(n_msgs ? n_msgs : 1, sizeof *last);
    last_len = cg_calloc(n_msgs ? n_msgs : 1, sizeof *last_len);
    for (size_t i = 0; i < n_msgs; i++) {
        if (cg_chat_is_system_role(msgs[i].role)) continue;
        part_iter_init(&it, msgs[i].content, msgs[i].content_len, has_sep[i], 0,
                       &segs_out->empty_skipped);
        while (part_next(&it, r.sep, r.sep_len, &part, &part_len)) {
            if (last[i] && (st = add_segment(&r, last[i], last_len[i])) != CG_OK) goto out;
            last[i] = part;
            last_len[i] = part_len;
        }
    }
    /* 4. the question: one "<role>: <text>" line per conversation message, then the cue. */
    size_t q_off;
    if ((st = begin_segment(&r, &q_off)) != CG_OK) goto out;
    for (size_t i = 0; i < n_msgs && st == CG_OK; i++) {
        if (cg_chat_is_system_role(msgs[i].role)) continue;
        st = cg_buf_append(text_out, msgs[i].role, strlen(msgs[i].role));
        if (st == CG_OK) st = cg_buf_append(text_out, ":", 1);
        if (st == CG_OK && last[i]) st = cg_buf_append(text_out, " ", 1);
        if (st == CG_OK && last[i]) st = cg_buf_append(text_out, last[i], last_len[i]);
        if (st == CG_OK) st = cg_buf_append(text_out, "\n", 1);
    }
    if (st == CG_OK) st = cg_buf_append(text_out, "assistant:", 10);
    if (st != CG_OK) goto out;
    end_segment(&r, q_off);

    if (segs_out->n < 2) {
        /* Only a question (documents all empty, no system message): nothing to cache. */
        cg_buf_reset(text_out);
        reset_segs(segs_out);
        segs_out->passthrough = 1;
        goto out;
    }
    for (size_t i = 0; i < segs_out->n; i++)
        if (segs_out->segs[i].len > longest) longest = segs_out->segs[i].len;
    if (p->max_segment_bytes && longest > p->max_segment_bytes) {
        st = CG_E_SEGMENT_SIZE;
        goto out;
    }
    segs_out->segs[0].role = CG_ROLE_SYSTEM;
    segs_out->segs[segs_out->n - 1].role = CG_ROLE_QUESTION;
    if (!splits_back(&r)) st = CG_E_VALUE;

out:
    if (st != CG_OK) {
        cg_buf_reset(text_out);
        reset_segs(segs_out);
    }
    cg_free(&last);
    cg_free(&last_len);
    cg_free(&has_sep);
    return st;
}

/* Fuzz target for the chat renderer (cache/chat.c): messages and documents[] into one prompt.
 * Input: [sep][max_segments][max_segment_bytes][flags][text_max][fields...], fields separated
 * by 0xFF, each [kind][bytes...]: kind % 8 = 0 document, 1 system, 2 developer, 3 user,
 * 4 assistant, 5 tool, 6 custom role (role = bytes up to a 0xFE, then the content), 7 a user
 * message with a NULL content. sep < 0xC0 picks from SEPS, else (sep & 0x1F) + 1 bytes follow.
 * flags bit 0: check_utf8 off; bit 1: text_out capped at text_max * 8 bytes.
 * Invariant: the status, the rendered text, the segments and empty_skipped equal those of a
 * reference renderer written from the rule in chat.h; every segment is in bounds, trimmed,
 * non-empty, roles positional; the text splits back into the same segments. */
#include "fuzz_common.h"

#include "base/base.h"
#include "cache/chat.h"

static const char *const SEPS[] = {
    "# #", "##",    "\n",           " ",   " \n\t\r\f\v", "\n\n", "aa",
    "::",  "user:", "\xE2\x80\x94", "---", "<doc>"};
static const char *const ROLES[] = {"system", "developer", "user", "assistant", "tool"};
static const char PADS[] = " \n\t\r\f\v";

#define MAX_FIELDS 64
#define MAX_REF_SEGS 4096

typedef struct span {
    const char *p;
    size_t n;
} span;

typedef struct ref {
    span segs[MAX_REF_SEGS];
    size_t n, empties;
    int too_many; /* more segments than MAX_REF_SEGS: compare counts only */
    char *q;      /* the question text (owned) */
    size_t q_len;
} ref;

static size_t find(const char *s, size_t len, size_t from, const char *sep, size_t sl)
{
    for (size_t j = from; j + sl <= len; j++)
        if (memcmp(s + j, sep, sl) == 0) return j;
    return len;
}

/* The non-empty trimmed parts of s split by sep, appended to out (up to cap); the number of
 * parts returned, empty ones counted into *empties when count_empty. */
static size_t parts_of(const char *s, size_t len, const char *sep, size_t sl, int count_empty,
                       size_t *empties, span *out, size_t cap)
{
    size_t start = 0, n = 0;
    for (;;) {
        size_t at = find(s, len, start, sep, sl);
        size_t a = start, b = at;
        while (a < b && fuzz_is_space((uint8_t)s[a]))
            a++;
        while (b > a && fuzz_is_space((uint8_t)s[b - 1]))
            b--;
        if (a == b) {
            if (count_empty) (*empties)++;
        } else {
            if (n < cap) out[n] = (span){s + a, b - a};
            n++;
        }
        if (at == len) break;
        start = at + sl;
    }
    return n;
}

static void push(ref *r, const char *p, size_t n)
{
    if (r->n < MAX_REF_SEGS)
        r->segs[r->n] = (span){p, n};
    else
        r->too_many = 1;
    r->n++;
}

static void append(char **buf, size_t *len, const char *p, size_t n)
{
    *buf = realloc(*buf, *len + n + 1);
    if (!*buf) abort();
    if (n) memcpy(*buf + *len, p, n);
    *len += n;
}

/* Pushes parts[0..n) of one content; parts past MAX_REF_SEGS were not stored (too_many). */
static void push_parts(ref *r, const span *parts, size_t n)
{
    for (size_t j = 0; j < n; j++) {
        if (j < MAX_REF_SEGS)
            push(r, parts[j].p, parts[j].n);
        else
            push(r, "", 0);
    }
}

/* The segment list the rule in chat.h gives (before limits). */
static void ref_segments(const cg_chat_msg *m, size_t nm, const char *const *docs, const size_t *dl,
                         size_t nd, const char *sep, ref *r)
{
    size_t sl = strlen(sep);
    static span tmp[MAX_REF_SEGS];
    memset(r, 0, sizeof *r);
    for (size_t i = 0; i < nm; i++) {
        if (!cg_chat_is_system_role(m[i].role)) continue;
        int has = find(m[i].content, m[i].content_len, 0, sep, sl) < m[i].content_len;
        size_t k =
            parts_of(m[i].content, m[i].content_len, sep, sl, has, &r->empties, tmp, MAX_REF_SEGS);
        push_parts(r, tmp, k);
    }
    for (size_t i = 0; i < nd; i++) {
        size_t k = parts_of(docs[i], dl[i], sep, sl, 1, &r->empties, tmp, MAX_REF_SEGS);
        push_parts(r, tmp, k);
    }
    for (size_t i = 0; i < nm; i++) {
        if (cg_chat_is_system_role(m[i].role)) continue;
        int has = find(m[i].content, m[i].content_len, 0, sep, sl) < m[i].content_len;
        size_t k =
            parts_of(m[i].content, m[i].content_len, sep, sl, has, &r->empties, tmp, MAX_REF_SEGS);
        push_parts(r, tmp, k ? k - 1 : 0);
        append(&r->q, &r->q_len, m[i].role, strlen(m[i].role));
        append(&r->q, &r->q_len, ":", 1);
        if (k) {
            span last = k <= MAX_REF_SEGS ? tmp[k - 1] : (span){"", 0};
            append(&r->q, &r->q_len, " ", 1);
            append(&r->q, &r->q_len, last.p, last.n);
        }
        append(&r->q, &r->q_len, "\n", 1);
    }
    append(&r->q, &r->q_len, "assistant:", 10);
    push(r, r->q, r->q_len);
}

static int all_utf8(const cg_chat_msg *m, size_t nm, const char *const *docs, const size_t *dl,
                    size_t nd)
{
    for (size_t i = 0; i < nm; i++)
        if (!fuzz_utf8_naive((const uint8_t *)m[i].role, strlen(m[i].role)) ||
            !fuzz_utf8_naive((const uint8_t *)m[i].content, m[i].content_len))
            return 0;
    for (size_t i = 0; i < nd; i++)
        if (!fuzz_utf8_naive((const uint8_t *)docs[i], dl[i])) return 0;
    return 1;
}

/* Checks one cg_chat_render call against the reference. */
static void check(const cg_chat_msg *m, size_t nm, const char *const *docs, const size_t *dl,
                  size_t nd, const cg_split_params *p, size_t text_max)
{
    cg_buf text;
    if (text_max)
        cg_buf_init(&text, text_max);
    else
        cg_buf_init_unbounded(&text);
    cg_split_result res = {0};
    cg_status st = cg_chat_render(m, nm, docs, dl, nd, p, &text, &res);
    ref r;
    size_t sl = strlen(p->separator);

    if (st != CG_OK || res.passthrough) FUZZ_CHECK(text.len == 0 && res.n == 0);
    if (st != CG_OK) FUZZ_CHECK(!res.passthrough && res.empty_skipped == 0);

    int bad_role = 0;
    for (size_t i = 0; i < nm; i++)
        bad_role |= !m[i].role[0];
    if (!sl || bad_role) {
        FUZZ_CHECK(st == CG_E_VALUE);
        goto out;
    }
    if (p->check_utf8 && !all_utf8(m, nm, docs, dl, nd)) {
        FUZZ_CHECK(st == CG_E_UTF8);
        goto out;
    }
    int any_sep = 0;
    for (size_t i = 0; i < nm; i++)
        any_sep |= find(m[i].content, m[i].content_len, 0, p->separator, sl) < m[i].content_len;
    if (!any_sep && nd == 0) {
        FUZZ_CHECK(st == CG_OK && res.passthrough && res.empty_skipped == 0);
        goto out;
    }

    ref_segments(m, nm, docs, dl, nd, p->separator, &r);
    char pad = 0;
    for (const char *c = PADS; *c; c++)
        if (!memchr(p->separator, *c, sl)) {
            pad = *c;
            break;
        }
    size_t joint = sl + (pad ? 2 : 0), total = 0, longest = 0;
    for (size_t i = 0; i < r.n && !r.too_many; i++) {
        total += r.segs[i].n;
        if (r.segs[i].n > longest) longest = r.segs[i].n;
    }
    total += (r.n - 1) * joint;
    int over_segs = p->max_segments && r.n > p->max_segments;
    int over_text = text_max && total > text_max;
    if (st == CG_E_SEGMENTS) {
        FUZZ_CHECK(over_segs);
        goto out_ref;
    }
    if (st == CG_E_TOO_LARGE) {
        FUZZ_CHECK(over_text || r.too_many);
        goto out_ref;
    }
    FUZZ_CHECK(!over_segs && !over_text);
    if (r.too_many) goto out_ref; /* only the limits above are checked for giant renderings */
    if (r.n < 2) {
        FUZZ_CHECK(st == CG_OK && res.passthrough && res.empty_skipped == 0);
        goto out_ref;
    }
    if (p->max_segment_bytes && longest > p->max_segment_bytes) {
        FUZZ_CHECK(st == CG_E_SEGMENT_SIZE);
        goto out_ref;
    }

    /* The reference rendering, and whether it splits back into its own segments. */
    char *want = NULL;
    size_t want_len = 0, offs[MAX_REF_SEGS];
    for (size_t i = 0; i < r.n; i++) {
        if (i) {
            if (pad) append(&want, &want_len, &pad, 1);
            append(&want, &want_len, p->separator, sl);
            if (pad) append(&want, &want_len, &pad, 1);
        }
        offs[i] = want_len;
        append(&want, &want_len, r.segs[i].p, r.segs[i].n);
    }
    cg_split_params vp = *p;
    vp.check_utf8 = 0;
    vp.max_segments = 0;
    vp.max_segment_bytes = 0;
    cg_split_result back = {0};
    int same =
        cg_split_prompt(want, want_len, &vp, &back) == CG_OK && !back.passthrough && back.n == r.n;
    for (size_t i = 0; same && i < r.n; i++)
        same = back.segs[i].off == offs[i] && back.segs[i].len == r.segs[i].n;
    cg_split_result_free(&back);
    if (!same) {
        FUZZ_CHECK(st == CG_E_VALUE);
    } else {
        FUZZ_CHECK(st == CG_OK && !res.passthrough);
        FUZZ_CHECK(res.empty_skipped == r.empties);
        FUZZ_CHECK(text.len == want_len && memcmp(text.data, want, want_len) == 0);
        FUZZ_CHECK(res.n == r.n);
        for (size_t i = 0; i < res.n; i++) {
            const cg_segment *s = &res.segs[i];
            FUZZ_CHECK(s->off == offs[i] && s->len == r.segs[i].n && s->len > 0);
            FUZZ_CHECK(s->off <= text.len && s->len <= text.len - s->off);
            FUZZ_CHECK(!fuzz_is_space((uint8_t)text.data[s->off]) &&
                       !fuzz_is_space((uint8_t)text.data[s->off + s->len - 1]));
            cg_role role = i == 0           ? CG_ROLE_SYSTEM
                           : i + 1 == res.n ? CG_ROLE_QUESTION
                                            : CG_ROLE_CHUNK;
            FUZZ_CHECK(s->role == role);
        }
    }
    free(want);
out_ref:
    free(r.q);
out:
    cg_split_result_free(&res);
    cg_buf_free(&text);
}

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size)
{
    fuzz_in in = {data, size};
    uint8_t sel = fuzz_u8(&in), ms = fuzz_u8(&in), mb = fuzz_u8(&in), flags = fuzz_u8(&in),
            tmax = fuzz_u8(&in);
    char *sep;
    if (sel < 0xC0) {
        const char *s = SEPS[sel % CG_ARRAY_LEN(SEPS)];
        sep = fuzz_strndup(s, strlen(s));
    } else {
        size_t got;
        const uint8_t *s = fuzz_bytes(&in, (size_t)(sel & 0x1F) + 1, &got);
        sep = fuzz_strndup(s, got);
    }
    cg_split_params p = cg_split_default_params();
    p.separator = sep;
    p.max_segments = ms >= 0x80 ? 0 : ms;
    p.max_segment_bytes = mb;
    p.check_utf8 = !(flags & 1);
    size_t text_max = flags & 2 ? (size_t)tmax * 8 : 0;

    cg_chat_msg msgs[MAX_FIELDS];
    const char *docs[MAX_FIELDS];
    size_t doc_lens[MAX_FIELDS], nm = 0, nd = 0;
    char *owned[MAX_FIELDS * 2];
    size_t n_owned = 0;
    while (in.n && nm + nd < MAX_FIELDS) {
        size_t len;
        const uint8_t *f = fuzz_field(&in, 0xFF, &len);
        uint8_t kind = len ? f[0] % 8 : 3;
        const uint8_t *body = len ? f + 1 : f;
        size_t blen = len ? len - 1 : 0;
        /* Contents are heap copies of their exact size, so overreads show under ASan. */
        char *c = fuzz_dup(body, blen);
        owned[n_owned++] = c;
        if (kind == 0) {
            docs[nd] = c;
            doc_lens[nd++] = blen;
            continue;
        }
        cg_chat_msg *m = &msgs[nm++];
        if (kind == 6) {
            const uint8_t *e = memchr(body, 0xFE, blen);
            size_t rl = e ? (size_t)(e - body) : blen;
            char *role = fuzz_strndup(body, rl);
            owned[n_owned++] = role;
            m->role = role;
            m->content = c + (e ? rl + 1 : blen);
            m->content_len = e ? blen - rl - 1 : 0;
        } else if (kind == 7) {
            m->role = "user";
            m->content = NULL;
            m->content_len = 0;
        } else {
            m->role = ROLES[kind - 1];
            m->content = c;
            m->content_len = blen;
        }
    }
    check(msgs, nm, docs, doc_lens, nd, &p, text_max);
    for (size_t i = 0; i < n_owned; i++)
        free(owned[i]);
    free(sep);
    return 0;
}

/* Fuzz target for the SSE relay parser (backends/sse.c).
 * Input: [caps][seed][stream...]. caps low nibble: max_line = nibble * 8 (0 = default 1 MiB),
 * high nibble: max_event = nibble * 32 (0 = default 4 MiB). seed drives the piece sizes.
 * The stream is parsed three ways: in one cg_sse_feed, in pieces of pseudo-random sizes (1 byte
 * at a time when seed is 0), and by a naive whole-buffer reference parser.
 * Invariants: the three agree on every event's fields and on the status; the raw bytes agree
 * too, except that a CR ending a block at a piece boundary dispatches at once and the LF that
 * follows in the next piece is dropped (documented in sse.c, allowed here and nowhere else);
 * no event is larger than max_event, no line longer than max_line; after an error the parser
 * keeps refusing input; after cg_sse_finish it parses a new stream. */
#include "fuzz_common.h"

#include "backends/sse.h"
#include "base/base.h"

typedef struct ev {
    char *event, *data, *id, *raw;
    size_t event_len, data_len, id_len, raw_len, n_comments;
    int has_data, has_id;
    long long retry;
} ev;

typedef struct evlist {
    ev *v;
    size_t n, cap;
    size_t max_line, max_event;
} evlist;

static void ev_push(evlist *l, const ev *e)
{
    if (l->n == l->cap) {
        l->cap = l->cap ? l->cap * 2 : 16;
        l->v = realloc(l->v, l->cap * sizeof *l->v);
        if (!l->v) abort();
    }
    l->v[l->n++] = *e;
}

static void evlist_free(evlist *l)
{
    for (size_t i = 0; i < l->n; i++) {
        free(l->v[i].event);
        free(l->v[i].data);
        free(l->v[i].id);
        free(l->v[i].raw);
    }
    free(l->v);
    memset(l, 0, sizeof *l);
}

/* Callback: copies the event and checks what holds for any single event. */
static void on_event(void *arg, const cg_sse_event *e)
{
    evlist *l = arg;
    FUZZ_CHECK(e->event && e->data && e->id && e->raw);
    FUZZ_CHECK(e->raw_len > 0 && e->raw_len <= l->max_event);
    FUZZ_CHECK(e->data_len <= e->raw_len && e->event_len <= e->raw_len && e->id_len <= e->raw_len);
    FUZZ_CHECK(e->has_data || e->data_len == 0);
    FUZZ_CHECK(e->has_id || e->id_len == 0);
    FUZZ_CHECK(e->raw[e->raw_len - 1] == '\n' || e->raw[e->raw_len - 1] == '\r');
    /* every line of the block within max_line */
    size_t run = 0;
    for (size_t i = 0; i < e->raw_len; i++) {
        if (e->raw[i] == '\n' || e->raw[i] == '\r')
            run = 0;
        else
            FUZZ_CHECK(++run <= l->max_line);
    }
    ev c = {
        .event = fuzz_dup(e->event, e->event_len),
        .event_len = e->event_len,
        .data = fuzz_dup(e->data, e->data_len),
        .data_len = e->data_len,
        .id = fuzz_dup(e->id, e->id_len),
        .id_len = e->id_len,
        .raw = fuzz_dup(e->raw, e->raw_len),
        .raw_len = e->raw_len,
        .n_comments = e->n_comments,
        .has_data = e->has_data,
        .has_id = e->has_id,
        .retry = e->retry,
    };
    ev_push(l, &c);
}

static int span_eq(const char *a, size_t an, const char *b, size_t bn)
{
    return an == bn && (an == 0 || memcmp(a, b, an) == 0);
}

/* Same event; raw_exact = 0 allows b's raw to be a's without its final LF after a CR. */
static int ev_eq(const ev *a, const ev *b, int raw_exact)
{
    if (!span_eq(a->event, a->event_len, b->event, b->event_len) ||
        !span_eq(a->data, a->data_len, b->data, b->data_len) ||
        !span_eq(a->id, a->id_len, b->id, b->id_len) || a->has_data != b->has_data ||
        a->has_id != b->has_id || a->retry != b->retry || a->n_comments != b->n_comments)
        return 0;
    if (span_eq(a->raw, a->raw_len, b->raw, b->raw_len)) return 1;
    return !raw_exact && a->raw_len >= 2 && b->raw_len == a->raw_len - 1 &&
           memcmp(a->raw, b->raw, b->raw_len) == 0 && a->raw[a->raw_len - 2] == '\r' &&
           a->raw[a->raw_len - 1] == '\n';
}

/* ---- reference: the whole buffer at once, written from the header's description ---- */

typedef struct refblk {
    char *data, *event, *id;
    size_t data_len, event_len, id_len, n_lines, n_comments;
    int has_data, has_id;
    long long retry;
} refblk;

static void set_span(char **dst, size_t *dn, const char *v, size_t vn)
{
    free(*dst);
    *dst = fuzz_dup(v, vn);
    *dn = vn;
}

static void ref_line(refblk *b, const char *line, size_t n)
{
    b->n_lines++;
    if (line[0] == ':') {
        b->n_comments++;
        return;
    }
    size_t name = 0;
    while (name < n && line[name] != ':')
        name++;
    const char *v = line + name + (name < n);
    size_t vn = (size_t)(line + n - v);
    if (vn && v[0] == ' ') v++, vn--;
    if (span_eq(line, name, "data", 4)) {
        b->data = realloc(b->data, b->data_len + vn + 2);
        if (!b->data) abort();
        if (b->has_data) b->data[b->data_len++] = '\n';
        if (vn) memcpy(b->data + b->data_len, v, vn);
        b->data_len += vn;
        b->has_data = 1;
    } else if (span_eq(line, name, "event", 5)) {
        set_span(&b->event, &b->event_len, v, vn);
    } else if (span_eq(line, name, "id", 2)) {
        if (!memchr(v, '\0', vn)) {
            set_span(&b->id, &b->id_len, v, vn);
            b->has_id = 1;
        }
    } else if (span_eq(line, name, "retry", 5)) {
        /* All digits, and at most 9223372036854775799: sse.c stops before a step that could
         * overflow, so it takes every value up to LLONG_MAX - 8 (leading zeros allowed). */
        int ok = vn > 0;
        unsigned __int128 r = 0;
        for (size_t i = 0; i < vn && ok; i++) {
            ok = v[i] >= '0' && v[i] <= '9';
            if (r <= (unsigned __int128)1 << 100) r = r * 10 + (unsigned)(v[i] - '0');
        }
        if (ok && r <= 9223372036854775799ull) b->retry = (long long)r;
    }
}

static void refblk_reset(refblk *b)
{
    free(b->data);
    free(b->event);
    free(b->id);
    memset(b, 0, sizeof *b);
    b->retry = -1;
}

/* Returns the status; events into out; *partial = finish's answer. cut: NULL for one feed, or
 * cut[k] = 1 where a piece ends after byte k-1: a blank line's CR that ends a piece dispatches
 * at once, and an LF starting the next piece is then dropped (sse.c's documented rule). */
static cg_status ref_parse(const char *s, size_t len, const uint8_t *cut, evlist *out, int *partial)
{
    refblk b;
    memset(&b, 0, sizeof b);
    refblk_reset(&b);
    cg_status st = CG_OK;
    size_t i = 0, bom = 0;
    while (bom < 3 && bom < len && (uint8_t)s[bom] == (uint8_t) "\xEF\xBB\xBF"[bom])
        bom++;
    *partial = 0;
    if (bom == len && bom > 0 && bom < 3) { /* still waiting for the rest of a BOM */
        *partial = 1;
        goto out;
    }
    if (bom == 3) i = 3;
    size_t block = i; /* start of the current block's raw bytes */
    while (i < len) {
        size_t j = i;
        while (j < len && s[j] != '\r' && s[j] != '\n')
            j++;
        size_t n = j - i;
        if (n > out->max_line || (i - block) + n > out->max_event) {
            st = CG_E_TOO_LARGE;
            goto out;
        }
        if (j == len) { /* unfinished line */
            *partial = len > block;
            goto out;
        }
        size_t term = s[j] == '\r' && j + 1 < len && s[j + 1] == '\n' ? 2 : 1;
        size_t skip = 0; /* a dropped LF: in no block */
        if (term == 2 && n == 0 && cut && cut[j + 1]) term = 1, skip = 1;
        if ((j - block) + term > out->max_event) {
            st = CG_E_TOO_LARGE;
            goto out;
        }
        if (n) {
            ref_line(&b, s + i, n);
        } else {
            if (b.n_lines) {
                ev e = {
                    .event = fuzz_dup(b.event, b.event_len),
                    .event_len = b.event_len,
                    .data = fuzz_dup(b.data, b.data_len),
                    .data_len = b.data_len,
                    .id = fuzz_dup(b.id, b.id_len),
                    .id_len = b.id_len,
                    .raw = fuzz_dup(s + block, j + term - block),
                    .raw_len = j + term - block,
                    .n_comments = b.n_comments,
                    .has_data = b.has_data,
                    .has_id = b.has_id,
                    .retry = b.retry,
                };
                ev_push(out, &e);
            }
            refblk_reset(&b);
            block = j + term + skip;
        }
        i = j + term + skip;
    }
    *partial = len > block;
out:
    refblk_reset(&b);
    free(b.data);
    return st;
}

static uint64_t rng_next(uint64_t *s)
{
    *s ^= *s << 13;
    *s ^= *s >> 7;
    *s ^= *s << 17;
    return *s;
}

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size)
{
    fuzz_in in = {data, size};
    uint8_t caps = fuzz_u8(&in), seed = fuzz_u8(&in);
    cg_sse_params p = {.max_line = (size_t)(caps & 0x0F) * 8,
                       .max_event = (size_t)(caps >> 4) * 32};
    cg_sse_params d = cg_sse_default_params();
    const char *s = (const char *)in.p;
    size_t len = in.n;

    evlist one = {.max_line = p.max_line ? p.max_line : d.max_line,
                  .max_event = p.max_event ? p.max_event : d.max_event};
    evlist pieces = one, ref = one, ref_pieces = one;

    cg_sse_parser *a = cg_sse_new(p);
    cg_status st_one = cg_sse_feed(a, s, len, on_event, &one);
    FUZZ_CHECK(cg_sse_events(a) == one.n);
    if (st_one != CG_OK) FUZZ_CHECK(cg_sse_feed(a, "data: x\n\n", 9, on_event, &one) == st_one);
    int partial_one = cg_sse_finish(a);
    /* after finish the parser is new again */
    evlist after = one;
    after.v = NULL, after.n = after.cap = 0;
    FUZZ_CHECK(cg_sse_feed(a, "data: x\n\n", 9, on_event, &after) == CG_OK && after.n == 1);
    FUZZ_CHECK(after.v[0].data_len == 1 && after.v[0].data[0] == 'x');
    evlist_free(&after);
    cg_sse_free(&a);
    FUZZ_CHECK(a == NULL);

    cg_sse_parser *b = cg_sse_new(p);
    uint8_t *cut = calloc(len + 2, 1);
    if (!cut) abort();
    uint64_t rs = 0x9E3779B97F4A7C15ull ^ seed;
    size_t max_piece = 1 + seed % 23, off = 0;
    cg_status st_pieces = CG_OK;
    while (off < len) {
        size_t k = seed ? 1 + (size_t)(rng_next(&rs) % max_piece) : 1;
        if (k > len - off) k = len - off;
        cg_status st = cg_sse_feed(b, s + off, k, on_event, &pieces);
        if (st_pieces != CG_OK) FUZZ_CHECK(st == st_pieces); /* refused for good */
        st_pieces = st;
        off += k;
        cut[off] = 1;
    }
    if (seed & 0x80) FUZZ_CHECK(cg_sse_feed(b, s, 0, on_event, &pieces) == st_pieces);
    int partial_pieces = cg_sse_finish(b);
    cg_sse_free(&b);

    int partial_ref = 0, partial_ref_pieces = 0;
    cg_status st_ref = ref_parse(s, len, NULL, &ref, &partial_ref);
    cg_status st_ref_pieces = ref_parse(s, len, cut, &ref_pieces, &partial_ref_pieces);

    /* one feed against the reference */
    FUZZ_CHECK(st_one == st_ref);
    FUZZ_CHECK(one.n == ref.n);
    for (size_t i = 0; i < one.n; i++)
        FUZZ_CHECK(ev_eq(&ref.v[i], &one.v[i], 1));
    if (st_one == CG_OK) FUZZ_CHECK(partial_one == partial_ref);

    /* pieces against the reference given the same cuts */
    FUZZ_CHECK(st_pieces == st_ref_pieces);
    FUZZ_CHECK(pieces.n == ref_pieces.n);
    for (size_t i = 0; i < pieces.n; i++)
        FUZZ_CHECK(ev_eq(&ref_pieces.v[i], &pieces.v[i], 1));
    if (st_pieces == CG_OK) FUZZ_CHECK(partial_pieces == partial_ref_pieces);

    /* and the two runs against each other: the same events but for the dropped LF (which can
     * also decide a block that is exactly max_event bytes without it) */
    if (st_one == CG_OK && st_pieces == CG_OK) {
        FUZZ_CHECK(pieces.n == one.n && partial_pieces == partial_one);
        for (size_t i = 0; i < one.n; i++)
            FUZZ_CHECK(ev_eq(&one.v[i], &pieces.v[i], 0));
    }
    free(cut);
    evlist_free(&ref_pieces);
    evlist_free(&one);
    evlist_free(&pieces);
    evlist_free(&ref);
    return 0;
}

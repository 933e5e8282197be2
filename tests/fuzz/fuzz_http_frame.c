/* Fuzz target for the raw HTTP request framing check (base/http_frame.c): request line,
 * headers, Content-Length / Transfer-Encoding, chunked bodies and trailers, pipelining.
 * Input: [l0][l1][l2][l3][l4][seed][bytes a client sent...]. The limits are small so the
 * fuzzer reaches them: max_target = 1 + l0 % 64, max_header_bytes = l1 * 4 (0 = none),
 * max_head_bytes = 16 + l2 * 8, max_headers = 1 + l3 % 16, max_body_bytes = l4 * 16 (0 =
 * none). seed drives the piece sizes.
 * The bytes are checked three ways: in one cg_http_frame_feed, byte by byte, and in
 * pseudo-random pieces; and by a reference written differently (whole buffer, line by line).
 * Invariants: the three feeds give the same status, the same count of complete requests and
 * the same idle / closing state; the reference agrees on accepted vs refused, on the count of
 * complete requests and, when accepted, on whether the input ends between requests; the
 * refused request's start is where the complete requests end (the bytes passed on before it
 * are whole requests, which the reference accepts alone); a refusal has a message and sticks. */
#include "fuzz_common.h"

#include "base/base.h"
#include "base/http_frame.h"

/* ---------------------------------------------------------------- reference */

typedef struct ref_result {
    int refused;
    uint64_t requests;
    int idle;    /* the input ends between requests */
    int closing; /* a request that closes the connection was complete */
} ref_result;

static int r_tchar(uint8_t c)
{
    return (c >= 'a' && c <= 'z') || (c >= 'A' && c <= 'Z') || (c >= '0' && c <= '9') ||
           (c && strchr("!#$%&'*+-.^_`|~", c));
}

static int r_vchar(uint8_t c)
{
    return c == '\t' || (c >= 0x20 && c != 0x7f);
}

/* One line starting at pos: content [pos, pos + len) without its CR/LF; complete when its LF
 * is in the buffer (next: the byte after it); ended when complete or when the buffer ends in
 * its CR (what the CR ends is checked, what the LF does is not done yet). A CR elsewhere than
 * right before the LF is an error. */
typedef struct line {
    const uint8_t *p;
    size_t len, next;
    int complete, ended, bad_cr;
} line;

static line get_line(const uint8_t *b, size_t n, size_t pos)
{
    line l = {b + pos, 0, n, 0, 0, 0};
    const uint8_t *lf = memchr(b + pos, '\n', n - pos);
    size_t end = lf ? (size_t)(lf - b) : n;
    l.complete = l.ended = lf != NULL;
    l.next = lf ? end + 1 : n;
    l.len = end - pos;
    if (l.len && b[end - 1] == '\r') { /* before the LF, or pending at the end */
        l.len--;
        l.ended = 1;
    }
    l.bad_cr = memchr(l.p, '\r', l.len) != NULL;
    return l;
}

typedef struct head_state {
    unsigned n_cl, n_te, n_host;
    uint64_t cl;
    int chunked, close, keep_alive, minor;
} head_state;

static int ieq(const uint8_t *p, size_t n, const char *s)
{
    return n == strlen(s) && !strncasecmp((const char *)p, s, n);
}

/* A field line (header or trailer). Returns 0 when it breaks a rule. */
static int ref_field(const line *l, const cg_http_frame_limits *lim, size_t *field_bytes,
                     head_state *h, int trailer)
{
    const uint8_t *p = l->p;
    size_t n = l->len, i = 0;
    while (i < n && p[i] != ':') {
        if (!r_tchar(p[i])) return 0;
        i++;
    }
    if (i == n) return !l->ended; /* no colon yet: fine only while the line goes on */
    if (i == 0) return 0;
    size_t name = i++;
    while (i < n && (p[i] == ' ' || p[i] == '\t'))
        i++;
    size_t vb = i;
    for (; i < n; i++)
        if (!r_vchar(p[i])) return 0;
    if (!l->complete) return 1;
    size_t ve = n;
    while (ve > vb && (p[ve - 1] == ' ' || p[ve - 1] == '\t'))
        ve--;
    *field_bytes += name + (ve - vb);
    if (lim->max_header_bytes && *field_bytes > lim->max_header_bytes) return 0;
    if (trailer) return 1;
    const uint8_t *v = p + vb;
    size_t vl = ve - vb;
    int framing = ieq(p, name, "content-length") || ieq(p, name, "transfer-encoding");
    if (framing && ve != n) return 0; /* whitespace after a framing value: refused */
    if (ieq(p, name, "content-length")) {
        if (vl < 1 || vl > 19) return 0;
        uint64_t x = 0;
        for (size_t k = 0; k < vl; k++) {
            if (v[k] < '0' || v[k] > '9') return 0;
            x = x * 10 + (uint64_t)(v[k] - '0');
        }
        if (h->n_cl++ && x != h->cl) return 0;
        h->cl = x;
    } else if (ieq(p, name, "transfer-encoding")) {
        if (h->n_te++ || !ieq(v, vl, "chunked")) return 0;
        h->chunked = 1;
    } else if (ieq(p, name, "host")) {
        h->n_host++;
    } else if (ieq(p, name, "connection")) {
        size_t k = 0, kept = vl < 128 ? vl : 128;
        while (k < kept) {
            while (k < kept && (v[k] == ',' || v[k] == ' ' || v[k] == '\t'))
                k++;
            size_t t = k;
            while (k < kept && v[k] != ',' && v[k] != ' ' && v[k] != '\t')
                k++;
            if (ieq(v + t, k - t, "close")) h->close = 1;
            if (ieq(v + t, k - t, "keep-alive")) h->keep_alive = 1;
        }
    }
    return 1;
}

/* The request line (possibly incomplete). Returns 0 when it breaks a rule. */
static int ref_request_line(const line *l, const cg_http_frame_limits *lim, head_state *h)
{
    const uint8_t *p = l->p;
    size_t n = l->len, i = 0;
    if (!n) return 1; /* an empty line before the request, its CR so far */
    while (i < n && p[i] != ' ') {
        if (!r_tchar(p[i]) || i >= 32) return 0;
        i++;
    }
    if (i == 0 && n) return 0;
    if (i == n) return !l->ended;
    size_t t = ++i;
    while (i < n && p[i] != ' ') {
        if (p[i] <= 0x20 || p[i] >= 0x7f) return 0;
        if (i == t && !strchr("/*hH", p[i])) return 0;
        if (i - t + 1 > lim->max_target) return 0;
        i++;
    }
    if (i == n) return !l->ended;
    if (i == t) return 0; /* two spaces */
    size_t vlen = n - (i + 1);
    const uint8_t *v = p + i + 1;
    if (vlen > 8) return 0;
    if (!l->ended) return 1;
    if (vlen != 8 || memcmp(v, "HTTP/", 5) || v[5] < '0' || v[5] > '9' || v[6] != '.' ||
        v[7] < '0' || v[7] > '9' || v[5] != '1')
        return 0;
    h->minor = v[7] == '0' ? 0 : 1;
    return 1;
}

/* The field lines of a head (trailer 0) or of a trailer section (1) from *pos: 1 once the
 * empty line that ends them is complete, 0 when the input ends first, -1 when they are refused.
 * *bytes counts their raw bytes against max_head_bytes. */
static int ref_fields(const uint8_t *b, size_t n, size_t *pos, const cg_http_frame_limits *lim,
                      size_t *bytes, head_state *h, int trailer)
{
    size_t field_bytes = 0;
    unsigned fields = 0;
    for (;;) {
        if (*pos == n) return 0;
        line l = get_line(b, n, *pos);
        size_t raw = l.next - *pos;
        if (l.len && (l.p[0] == ' ' || l.p[0] == '\t')) return -1;
        if (l.len && ++fields > lim->max_headers) return -1;
        if (*bytes + raw > lim->max_head_bytes || l.bad_cr) return -1;
        *bytes += raw;
        *pos = l.next;
        if (!l.len) return l.complete ? 1 : 0; /* the end of the section, or its CR so far */
        if (!ref_field(&l, lim, &field_bytes, h, trailer)) return -1;
        if (!l.complete) return 0;
    }
}

static ref_result ref_parse(const uint8_t *b, size_t n, const cg_http_frame_limits *lim)
{
    ref_result r = {0, 0, 1, 0};
    size_t pos = 0;
    while (pos < n) {
        r.idle = 0;
        head_state h;
        memset(&h, 0, sizeof h);
        size_t head = 0;
        /* empty lines, then the request line */
        line l;
        for (;;) {
            l = get_line(b, n, pos);
            size_t raw = l.next - pos;
            if (head + raw > lim->max_head_bytes || l.bad_cr) goto refused;
            head += raw;
            pos = l.next;
            if (l.len || !l.complete) break;
            if (pos == n) return r; /* only empty lines so far */
        }
        if (!ref_request_line(&l, lim, &h)) goto refused;
        if (!l.complete) return r;
        int f = ref_fields(b, n, &pos, lim, &head, &h, 0);
        if (f < 0) goto refused;
        if (f == 0) return r;
        if ((h.n_te && h.n_cl) || (h.n_te && h.minor == 0)) goto refused;
        if (h.minor == 1 ? h.n_host != 1 : h.n_host > 1) goto refused;
        if (h.chunked) {
            uint64_t total = 0;
            for (;;) {
                if (pos == n) return r;
                l = get_line(b, n, pos);
                if (l.bad_cr) goto refused;
                size_t i = 0;
                uint64_t size = 0;
                while (i < l.len && i < 17 && strchr("0123456789abcdefABCDEF", l.p[i]) && l.p[i]) {
                    if (i == 16) goto refused;
                    uint8_t c = l.p[i];
                    size = size * 16 + (uint64_t)(c <= '9' ? c - '0' : (c | 0x20) - 'a' + 10);
                    if (lim->max_body_bytes && size > lim->max_body_bytes - total) goto refused;
                    i++;
                }
                if (i < l.len) {
                    if (i == 0 || l.p[i] != ';' || l.len - i - 1 > 4096) goto refused;
                    for (size_t k = i + 1; k < l.len; k++)
                        if (!r_vchar(l.p[k])) goto refused;
                } else if (l.ended && i == 0) {
                    goto refused;
                }
                if (!l.complete) return r;
                pos = l.next;
                total += size;
                if (size == 0) break;
                if (n - pos < size) return r;
                pos += size;
                if (pos == n) return r;
                if (b[pos] == '\n') {
                    pos++;
                } else if (b[pos] == '\r') {
                    if (pos + 1 == n) return r;
                    if (b[pos + 1] != '\n') goto refused;
                    pos += 2;
                } else {
                    goto refused;
                }
            }
            size_t trailer = 0;
            f = ref_fields(b, n, &pos, lim, &trailer, &h, 1);
            if (f < 0) goto refused;
            if (f == 0) return r;
        } else if (h.cl) {
            if (n - pos < h.cl) return r;
            pos += h.cl;
        }
        r.requests++;
        r.idle = 1;
        if (h.close || (h.minor == 0 && !h.keep_alive)) {
            r.closing = 1;
            return r;
        }
    }
    return r;
refused:
    r.refused = 1;
    r.idle = 0;
    return r;
}

/* ---------------------------------------------------------------- the check, three ways */

typedef struct run {
    cg_status st;
    uint64_t requests;
    size_t start;
    int idle, closing;
} run;

static uint64_t rng_next(uint64_t *s)
{
    *s ^= *s << 13;
    *s ^= *s >> 7;
    *s ^= *s << 17;
    return *s;
}

static run feed(const cg_http_frame_limits *lim, const uint8_t *b, size_t n, int mode, uint8_t seed)
{
    cg_http_frame *f = cg_http_frame_new(lim);
    run r = {CG_OK, 0, SIZE_MAX, 0, 0};
    uint64_t rs = 0x9E3779B97F4A7C15ull ^ seed;
    size_t off = 0;
    while (off < n) {
        size_t k = mode == 0 ? n : mode == 1 ? 1 : 1 + (size_t)(rng_next(&rs) % (1 + seed % 29));
        if (k > n - off) k = n - off;
        size_t start;
        cg_status st = cg_http_frame_feed(f, b + off, k, &start);
        if (st != CG_OK) {
            r.st = st;
            FUZZ_CHECK(start == SIZE_MAX || start <= k);
            r.start = start == SIZE_MAX ? SIZE_MAX : off + start;
            FUZZ_CHECK(cg_http_frame_message(f)[0] != '\0');
            FUZZ_CHECK(cg_http_frame_feed(f, b, n, NULL) == st); /* sticks */
            break;
        }
        off += k;
    }
    r.requests = cg_http_frame_requests(f);
    r.idle = cg_http_frame_idle(f);
    r.closing = cg_http_frame_closing(f);
    cg_http_frame_free(&f);
    FUZZ_CHECK(f == NULL);
    return r;
}

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size)
{
    fuzz_in in = {data, size};
    uint8_t l0 = fuzz_u8(&in), l1 = fuzz_u8(&in), l2 = fuzz_u8(&in), l3 = fuzz_u8(&in);
    uint8_t l4 = fuzz_u8(&in), seed = fuzz_u8(&in);
    cg_http_frame_limits lim = {.max_target = 1 + l0 % 64u,
                                .max_header_bytes = (size_t)l1 * 4,
                                .max_head_bytes = 16 + (size_t)l2 * 8,
                                .max_headers = 1 + l3 % 16u,
                                .max_body_bytes = (uint64_t)l4 * 16};
    /* a heap copy of exactly the input, so ASan sees any overread */
    uint8_t *b = (uint8_t *)fuzz_dup(in.p, in.n);
    size_t n = in.n;

    run whole = feed(&lim, b, n, 0, seed);
    run bytes = feed(&lim, b, n, 1, seed);
    run pieces = feed(&lim, b, n, 2, seed);
    FUZZ_CHECK(bytes.st == whole.st && pieces.st == whole.st);
    FUZZ_CHECK(bytes.requests == whole.requests && pieces.requests == whole.requests);
    FUZZ_CHECK(bytes.idle == whole.idle && pieces.idle == whole.idle);
    FUZZ_CHECK(bytes.closing == whole.closing && pieces.closing == whole.closing);
    FUZZ_CHECK(whole.st == CG_OK || whole.st == CG_E_HTTP_FRAMING || whole.st == CG_E_TOO_LARGE ||
               whole.st == CG_E_URI_TOO_LONG || whole.st == CG_E_HEADERS_TOO_LARGE ||
               whole.st == CG_E_HTTP_VERSION || whole.st == CG_E_NOT_IMPLEMENTED);
    if (whole.st == CG_E_TOO_LARGE) FUZZ_CHECK(lim.max_body_bytes > 0);

    ref_result ref = ref_parse(b, n, &lim);
    FUZZ_CHECK(ref.refused == (whole.st != CG_OK));
    FUZZ_CHECK(ref.requests == whole.requests);
    if (!ref.refused) {
        FUZZ_CHECK(ref.idle == (whole.idle || whole.closing));
        FUZZ_CHECK(ref.closing == whole.closing);
    } else {
        /* what went on before the refused request is whole requests, and nothing more */
        FUZZ_CHECK(whole.start != SIZE_MAX && whole.start <= n);
        ref_result before = ref_parse(b, whole.start, &lim);
        FUZZ_CHECK(!before.refused && before.requests == whole.requests && before.idle);
        if (bytes.start != SIZE_MAX) FUZZ_CHECK(bytes.start == whole.start);
        if (pieces.start != SIZE_MAX) FUZZ_CHECK(pieces.start == whole.start);
    }
    free(b);
    return 0;
}

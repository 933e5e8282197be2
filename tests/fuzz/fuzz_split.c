/* Fuzz target for the prompt splitter (cache/split.c) and its UTF-8 validator.
 * Input: [sep][max_segments][max_segment_bytes][flags][custom separator bytes][prompt...]
 *  - sep < 0xC0 picks a separator from SEPS; otherwise (sep & 0x3F) + 1 bytes that follow are
 *    the separator (cut at a NUL, so an empty one tests CG_E_VALUE);
 *  - max_segments: 0x80.. = no limit, 0xFF = 256, else the byte; max_segment_bytes: the byte
 *    (0 = no limit); flags bit 0: check_utf8 off, bit 1: params NULL (defaults), bit 2: split
 *    twice into the same result (reuse must reset it).
 * Invariants: every segment in bounds, trimmed, non-empty, in order; roles positional; the
 * result and status equal those of a naive reference splitter; cg_utf8_valid agrees with a
 * naive decoder on the prompt and on its short prefixes and suffixes. */
#include "fuzz_common.h"

#include "base/base.h"
#include "cache/split.h"

static const char *const SEPS[] = {
    "# #",
    "##",
    "#",
    "\n\n",
    "aa",
    "aba",
    "---",
    " ",
    "\xC3\xA9",
    "<sep>",
    /* 32 bytes: the last length searched with memchr+memcmp */
    "0123456789abcdef0123456789abcdef",
    /* 33 and 40 bytes: memmem; the second one overlaps itself */
    "0123456789abcdef0123456789abcdefX",
    "<<<<<<<<<<<<<<<<<<<<<<<<<<<<<<<<<<<<<<<<",
};

typedef struct ref_result {
    cg_status st;
    size_t n, empty, off[1024], len[1024];
    int passthrough, overflow;
} ref_result;

static int any_nonspace(const uint8_t *t, size_t n)
{
    for (size_t i = 0; i < n; i++)
        if (!fuzz_is_space(t[i])) return 1;
    return 0;
}

/* The splitter spelled out with plain loops: leftmost non-overlapping matches, trim, skip
 * empties, then the limits in the order the contract gives. */
static void ref_split(const uint8_t *t, size_t len, const char *sep, size_t max_segments,
                      size_t max_bytes, int check_utf8, ref_result *r)
{
    size_t sl = strlen(sep), start = 0, longest = 0, count = 0;
    memset(r, 0, sizeof *r);
    if (!sl) {
        r->st = CG_E_VALUE;
        return;
    }
    if (check_utf8 && !fuzz_utf8_naive(t, len)) {
        r->st = CG_E_UTF8;
        return;
    }
    int any = 0;
    for (;;) {
        size_t at = len;
        for (size_t j = start; j + sl <= len; j++) {
            if (memcmp(t + j, sep, sl) == 0) {
                at = j;
                break;
            }
        }
        if (at == len && !any) {
            r->passthrough = 1;
            return;
        }
        any = 1;
        size_t a = start, b = at;
        while (a < b && fuzz_is_space(t[a]))
            a++;
        /* the text after the last separator keeps its trailing whitespace */
        while (b > a && fuzz_is_space(t[b - 1]) && (at != len || !any_nonspace(t + a, b - a)))
            b--;
        if (a == b) {
            r->empty++;
        } else {
            if (count < (sizeof r->off / sizeof r->off[0])) {
                r->off[count] = a;
                r->len[count] = b - a;
            } else {
                r->overflow = 1;
            }
            count++;
            if (b - a > longest) longest = b - a;
        }
        if (at == len) break;
        start = at + sl;
    }
    if (max_segments && count > max_segments) {
        r->st = CG_E_SEGMENTS;
        return;
    }
    if (count < 2) {
        r->passthrough = 1;
        r->empty = 0;
        return;
    }
    if (max_bytes && longest > max_bytes) {
        r->st = CG_E_SEGMENT_SIZE;
        r->empty = 0;
        return;
    }
    r->n = count;
}

static void check_against_ref(const uint8_t *t, size_t len, const cg_split_result *res,
                              cg_status st, const ref_result *ref)
{
    FUZZ_CHECK(st == ref->st);
    if (st != CG_OK) {
        FUZZ_CHECK(res->n == 0 && !res->passthrough && res->empty_skipped == 0);
        return;
    }
    FUZZ_CHECK(res->passthrough == ref->passthrough);
    FUZZ_CHECK(res->empty_skipped == ref->empty);
    if (res->passthrough) {
        FUZZ_CHECK(res->n == 0);
        return;
    }
    FUZZ_CHECK(res->n == ref->n && res->n >= 2);
    size_t prev_end = 0;
    for (size_t i = 0; i < res->n; i++) {
        const cg_segment *s = &res->segs[i];
        FUZZ_CHECK(s->len > 0 && s->off <= len && s->len <= len - s->off);
        FUZZ_CHECK(s->off >= prev_end);
        prev_end = s->off + s->len;
        FUZZ_CHECK(!fuzz_is_space(t[s->off]));
        FUZZ_CHECK(i + 1 == res->n || !fuzz_is_space(t[s->off + s->len - 1]));
        cg_role want = i == 0 ? CG_ROLE_SYSTEM : i + 1 == res->n ? CG_ROLE_QUESTION : CG_ROLE_CHUNK;
        FUZZ_CHECK(s->role == want);
        if (!ref->overflow) FUZZ_CHECK(s->off == ref->off[i] && s->len == ref->len[i]);
    }
}

static void check_utf8(const uint8_t *t, size_t len)
{
    FUZZ_CHECK(cg_utf8_valid((const char *)t, len) == fuzz_utf8_naive(t, len));
    /* Short prefixes and suffixes move the end and the start against the 16/64-byte blocks. */
    for (size_t k = 1; k <= 16 && k <= len; k++) {
        FUZZ_CHECK(cg_utf8_valid((const char *)t + k, len - k) == fuzz_utf8_naive(t + k, len - k));
        FUZZ_CHECK(cg_utf8_valid((const char *)t, len - k) == fuzz_utf8_naive(t, len - k));
    }
}

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size)
{
    fuzz_in in = {data, size};
    uint8_t sel = fuzz_u8(&in), ms = fuzz_u8(&in), mb = fuzz_u8(&in), flags = fuzz_u8(&in);
    char *sep;
    if (sel < 0xC0) {
        sep = fuzz_strndup(SEPS[sel % CG_ARRAY_LEN(SEPS)], strlen(SEPS[sel % CG_ARRAY_LEN(SEPS)]));
    } else {
        size_t got;
        const uint8_t *s = fuzz_bytes(&in, (size_t)(sel & 0x3F) + 1, &got);
        sep = fuzz_strndup(s, got); /* an embedded NUL cuts it, as a C string would */
    }
    cg_split_params p = cg_split_default_params();
    p.separator = sep;
    p.max_segments = ms == 0xFF ? 256 : ms >= 0x80 ? 0 : ms;
    p.max_segment_bytes = mb;
    p.check_utf8 = !(flags & 1);
    const cg_split_params *pp = &p;
    if (flags & 2) {
        p = cg_split_default_params();
        pp = NULL;
    }

    const uint8_t *text = in.p;
    size_t len = in.n;
    static ref_result ref;
    ref_split(text, len, p.separator, p.max_segments, p.max_segment_bytes, p.check_utf8, &ref);

    cg_split_result res = {0};
    cg_status st = cg_split_prompt((const char *)text, len, pp, &res);
    check_against_ref(text, len, &res, st, &ref);
    if (flags & 4) {
        /* Reuse: a second split into the same result must give the same answer. */
        st = cg_split_prompt((const char *)text, len, pp, &res);
        check_against_ref(text, len, &res, st, &ref);
    }
    cg_split_result_free(&res);
    check_utf8(text, len);
    free(sep);
    return 0;
}

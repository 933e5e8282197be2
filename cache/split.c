/* Prompt splitter: finds the literal separator with memchr/memmem, trims, assigns roles,
 * and validates UTF-8 (SSSE3 vector path, scalar fallback with a word-at-a-time ASCII path).
 * DESIGN §3. */
#include "cache/split.h"

#include <stdlib.h>
#include <string.h>

#include "base/base.h"
#include "base/utf8.h"

/* Separators longer than this are searched with memmem (two-way, linear in the worst case):
 * memchr on the first byte plus memcmp is faster for short separators but degrades to
 * O(len * sep_len) when the first byte is frequent. */
#define LONG_SEPARATOR 32

const char *cg_role_name(cg_role r)
{
    static const char *const names[] = {
        [CG_ROLE_SYSTEM] = "system", [CG_ROLE_CHUNK] = "chunk", [CG_ROLE_QUESTION] = "question"};
    return (unsigned)r < CG_ARRAY_LEN(names) ? names[r] : "unknown";
}

cg_split_params cg_split_default_params(void)
{
    cg_split_params p = {
        .separator = CG_SPLIT_DEFAULT_SEPARATOR,
        .max_segments = 256,
        .check_utf8 = 1,
    };
    return p;
}

void cg_split_result_free(cg_split_result *r)
{
    if (!r) return;
    cg_free(&r->segs);
    r->n = r->cap = 0;
    r->empty_skipped = 0;
    r->passthrough = 0;
}

/* ---- UTF-8 ---- */

#define HIGH_BITS 0x8080808080808080ull

static uint64_t load64(const unsigned char *p)
{
    uint64_t v;
    memcpy(&v, p, sizeof v); /* unaligned-safe; compiles to one load */
    return v;
}

/* Index of the first byte with the high bit set in a little-endian word whose mask is nonzero. */
static size_t first_high_byte(uint64_t mask)
{
#if __BYTE_ORDER__ == __ORDER_LITTLE_ENDIAN__
    return (size_t)__builtin_ctzll(mask) / 8;
#else
    return (size_t)__builtin_clzll(mask) / 8;
#endif
}

/* Scalar validator: word-at-a-time over ASCII, one sequence at a time elsewhere. The fallback
 * where SSSE3 is missing, and the reference the vector path is tested against. */
__attribute__((unused)) static int utf8_valid_scalar(const unsigned char *s, size_t len)
{
    size_t i = 0;
    while (i < len) {
        /* ASCII fast path: 32 bytes per step, then 8, as long as no high bit is set. */
        while (len - i >= 32) {
            uint64_t m =
                (load64(s + i) | load64(s + i + 8) | load64(s + i + 16) | load64(s + i + 24)) &
                HIGH_BITS;
            if (m) break;
            i += 32;
        }
        while (len - i >= 8) {
            uint64_t m = load64(s + i) & HIGH_BITS;
            if (m) {
                i += first_high_byte(m);
                break;
            }
            i += 8;
        }
        if (i >= len) break;
        if (s[i] < 0x80) {
            i++;
            continue;
        }
        /* Non-ASCII text tends to come in runs: decode the run before going back to words. */
        while (i < len && s[i] >= 0x80) {
            uint32_t cp;
            size_t n = cg_utf8_decode(s + i, len - i, &cp);
            if (!n) return 0;
            i += n;
        }
    }
    return 1;
}

#if defined(__SSSE3__)
#include <tmmintrin.h>

/* Vector validator after Keiser and Lemire, "Validating UTF-8 in less than one instruction
 * per byte" (2021): each byte pair (previous byte, this byte) is classified by three 16-entry
 * nibble lookups whose AND is nonzero exactly for an invalid pair; the bits name the error.
 * A continuation after a continuation is only allowed as the 3rd/4th byte of a sequence,
 * which is known from the bytes two and three back. CJK text runs at several GB/s instead of
 * the scalar decoder's ~0.7 GB/s. */
enum {
    E_TOO_SHORT = 1 << 0,      /* lead byte not followed by a continuation */
    E_TOO_LONG = 1 << 1,       /* continuation after ASCII */
    E_OVERLONG_3 = 1 << 2,     /* E0 80..9F */
    E_TOO_LARGE = 1 << 3,      /* F4 90..BF, F5..FF */
    E_SURROGATE = 1 << 4,      /* ED A0..BF */
    E_OVERLONG_2 = 1 << 5,     /* C0, C1 */
    E_TOO_LARGE_1000 = 1 << 6, /* F5..FF 80..8F */
    E_OVERLONG_4 = 1 << 6,     /* F0 80..8F: shares the bit, the first-byte nibble tells apart */
    E_TWO_CONTS = 1 << 7,      /* continuation after continuation */
    E_CARRY = E_TOO_SHORT | E_TOO_LONG | E_TWO_CONTS,
};

/* clang-format off */
/* Error bits by the high nibble of the previous byte. */
static const uint8_t t1_high[16] __attribute__((aligned(16))) = {
    /* 0_______ ASCII */
    E_TOO_LONG, E_TOO_LONG, E_TOO_LONG, E_TOO_LONG, E_TOO_LONG, E_TOO_LONG, E_TOO_LONG, E_TOO_LONG,
    /* 10______ continuation */
    E_TWO_CONTS, E_TWO_CONTS, E_TWO_CONTS, E_TWO_CONTS,
    /* 1100____ */ E_TOO_SHORT | E_OVERLONG_2,
    /* 1101____ */ E_TOO_SHORT,
    /* 1110____ */ E_TOO_SHORT | E_OVERLONG_3 | E_SURROGATE,
    /* 1111____ */ E_TOO_SHORT | E_TOO_LARGE | E_TOO_LARGE_1000 | E_OVERLONG_4,
};
/* Error bits by the low nibble of the previous byte. */
static const uint8_t t1_low[16] __attribute__((aligned(16))) = {
    /* ____0000 C0 E0 F0 */ E_CARRY | E_OVERLONG_3 | E_OVERLONG_2 | E_OVERLONG_4,
    /* ____0001 C1 */       E_CARRY | E_OVERLONG_2,
    /* ____0010 */          E_CARRY,
    /* ____0011 */          E_CARRY,
    /* ____0100 F4 */       E_CARRY | E_TOO_LARGE,
    /* ____0101 F5 */       E_CARRY | E_TOO_LARGE | E_TOO_LARGE_1000,
    /* ____0110 */          E_CARRY | E_TOO_LARGE | E_TOO_LARGE_1000,
    /* ____0111 */          E_CARRY | E_TOO_LARGE | E_TOO_LARGE_1000,
    /* ____1000 */          E_CARRY | E_TOO_LARGE | E_TOO_LARGE_1000,
    /* ____1001 */          E_CARRY | E_TOO_LARGE | E_TOO_LARGE_1000,
    /* ____1010 */          E_CARRY | E_TOO_LARGE | E_TOO_LARGE_1000,
    /* ____1011 */          E_CARRY | E_TOO_LARGE | E_TOO_LARGE_1000,
    /* ____1100 */          E_CARRY | E_TOO_LARGE | E_TOO_LARGE_1000,
    /* ____1101 ED */       E_CARRY | E_TOO_LARGE | E_TOO_LARGE_1000 | E_SURROGATE,
    /* ____1110 */          E_CARRY | E_TOO_LARGE | E_TOO_LARGE_1000,
    /* ____1111 */          E_CARRY | E_TOO_LARGE | E_TOO_LARGE_1000,
};
/* Error bits by the high nibble of this byte. */
static const uint8_t t2_high[16] __attribute__((aligned(16))) = {
    /* 0_______ */
    E_TOO_SHORT, E_TOO_SHORT, E_TOO_SHORT, E_TOO_SHORT,
    E_TOO_SHORT, E_TOO_SHORT, E_TOO_SHORT, E_TOO_SHORT,
    /* 1000____ */ E_TOO_LONG | E_OVERLONG_2 | E_TWO_CONTS | E_OVERLONG_3 | E_TOO_LARGE_1000 |
                   E_OVERLONG_4,
    /* 1001____ */ E_TOO_LONG | E_OVERLONG_2 | E_TWO_CONTS | E_OVERLONG_3 | E_TOO_LARGE,
    /* 1010____ */ E_TOO_LONG | E_OVERLONG_2 | E_TWO_CONTS | E_SURROGATE | E_TOO_LARGE,
    /* 1011____ */ E_TOO_LONG | E_OVERLONG_2 | E_TWO_CONTS | E_SURROGATE | E_TOO_LARGE,
    /* 11______ */
    E_TOO_SHORT, E_TOO_SHORT, E_TOO_SHORT, E_TOO_SHORT,
};
/* clang-format on */

static __m128i lookup(const uint8_t table[16], __m128i nibbles)
{
    return _mm_shuffle_epi8(_mm_load_si128((const __m128i *)table), nibbles);
}

static __m128i classify_pairs(__m128i in, __m128i prev)
{
    const __m128i nib = _mm_set1_epi8(0x0F);

    __m128i prev1 = _mm_alignr_epi8(in, prev, 15);
    __m128i b1h = lookup(t1_high, _mm_and_si128(_mm_srli_epi16(prev1, 4), nib));
    __m128i b1l = lookup(t1_low, _mm_and_si128(prev1, nib));
    __m128i b2h = lookup(t2_high, _mm_and_si128(_mm_srli_epi16(in, 4), nib));
    __m128i special = _mm_and_si128(_mm_and_si128(b1h, b1l), b2h);

    /* Bit 7 set where this byte must be a 3rd or 4th byte: two back >= E0 or three back >= F0. */
    __m128i prev2 = _mm_alignr_epi8(in, prev, 14);
    __m128i prev3 = _mm_alignr_epi8(in, prev, 13);
    __m128i third = _mm_subs_epu8(prev2, _mm_set1_epi8((char)(0xE0 - 0x80)));
    __m128i fourth = _mm_subs_epu8(prev3, _mm_set1_epi8((char)(0xF0 - 0x80)));
    __m128i must23 = _mm_and_si128(_mm_or_si128(third, fourth), _mm_set1_epi8((char)0x80));
    return _mm_xor_si128(must23, special);
}

/* Nonzero where a block ends inside a sequence (a lead byte in its last 1, 2 or 3 bytes). */
static __m128i incomplete_tail(__m128i in)
{
    const __m128i max = _mm_setr_epi8(-1, -1, -1, -1, -1, -1, -1, -1, -1, -1, -1, -1, -1,
                                      (char)(0xF0 - 1), (char)(0xE0 - 1), (char)(0xC0 - 1));
    return _mm_subs_epu8(in, max);
}

static int utf8_valid_ssse3(const unsigned char *s, size_t len)
{
    __m128i prev = _mm_setzero_si128(), err = _mm_setzero_si128();
    __m128i pending = _mm_setzero_si128(); /* incomplete sequence at the end of prev */
    size_t i = 0;
    for (; len - i >= 64; i += 64) {
        __m128i a = _mm_loadu_si128((const __m128i *)(s + i));
        __m128i b = _mm_loadu_si128((const __m128i *)(s + i + 16));
        __m128i c = _mm_loadu_si128((const __m128i *)(s + i + 32));
        __m128i d = _mm_loadu_si128((const __m128i *)(s + i + 48));
        if (!_mm_movemask_epi8(_mm_or_si128(_mm_or_si128(a, b), _mm_or_si128(c, d)))) {
            err = _mm_or_si128(err, pending); /* ASCII may not follow a cut sequence */
            pending = _mm_setzero_si128();
            prev = d;
            continue;
        }
        err = _mm_or_si128(err, classify_pairs(a, prev));
        err = _mm_or_si128(err, classify_pairs(b, a));
        err = _mm_or_si128(err, classify_pairs(c, b));
        err = _mm_or_si128(err, classify_pairs(d, c));
        pending = incomplete_tail(d);
        prev = d;
    }
    for (; len - i >= 16; i += 16) {
        __m128i a = _mm_loadu_si128((const __m128i *)(s + i));
        err = _mm_or_si128(err, classify_pairs(a, prev));
        pending = incomplete_tail(a);
        prev = a;
    }
    if (i < len) {
        /* Zero padding reads as ASCII, so a sequence cut by the end shows up as TOO_SHORT. */
        unsigned char tail[16] = {0};
        memcpy(tail, s + i, len - i);
        __m128i a = _mm_loadu_si128((const __m128i *)tail);
        err = _mm_or_si128(err, classify_pairs(a, prev));
    } else {
        err = _mm_or_si128(err, pending);
    }
    return _mm_movemask_epi8(_mm_cmpeq_epi8(err, _mm_setzero_si128())) == 0xFFFF;
}
#endif

int cg_utf8_valid(const char *text, size_t len)
{
    if (!len) return 1;
#if defined(__SSSE3__)
    return utf8_valid_ssse3((const unsigned char *)text, len);
#else
    return utf8_valid_scalar((const unsigned char *)text, len);
#endif
}

/* ---- splitting ---- */

static int is_space(unsigned char c)
{
    return c == ' ' || c == '\t' || c == '\n' || c == '\r' || c == '\v' || c == '\f';
}

/* Leftmost occurrence of sep in text[from..len), or len if none. */
static size_t find_sep(const char *text, size_t len, size_t from, const char *sep, size_t sep_len)
{
    if (sep_len > len || from > len - sep_len) return len;
    if (sep_len > LONG_SEPARATOR) {
        const char *q = memmem(text + from, len - from, sep, sep_len);
        return q ? (size_t)(q - text) : len;
    }
    size_t last = len - sep_len; /* last offset where a match can start */
    while (from <= last) {
        const char *q = memchr(text + from, (unsigned char)sep[0], last - from + 1);
        if (!q) return len;
        size_t at = (size_t)(q - text);
        if (memcmp(q + 1, sep + 1, sep_len - 1) == 0) return at;
        from = at + 1;
    }
    return len;
}

static void push_segment(cg_split_result *out, size_t off, size_t len)
{
    if (out->n == out->cap) {
        out->cap = out->cap ? out->cap * 2 : 16;
        out->segs = cg_realloc(out->segs, out->cap * sizeof *out->segs);
    }
    out->segs[out->n].off = off;
    out->segs[out->n].len = len;
    out->segs[out->n].role = CG_ROLE_CHUNK;
    out->n++;
}

static void reset_result(cg_split_result *out)
{
    out->n = 0;
    out->empty_skipped = 0;
    out->passthrough = 0;
}

cg_status cg_split_prompt(const char *text, size_t len, const cg_split_params *params,
                          cg_split_result *out)
{
    cg_split_params defaults = cg_split_default_params();
    const cg_split_params *p = params ? params : &defaults;
    cg_status st = CG_OK;
    size_t longest = 0;

    reset_result(out);
    if (!p->separator || !p->separator[0]) {
        st = CG_E_VALUE;
        goto out;
    }
    if (!text && len) {
        st = CG_E_VALUE;
        goto out;
    }
    if (p->check_utf8 && !cg_utf8_valid(text, len)) {
        st = CG_E_UTF8;
        goto out;
    }

    const char *sep = p->separator;
    size_t sep_len = strlen(sep);
    size_t at = find_sep(text, len, 0, sep, sep_len);
    if (at == len) {
        out->passthrough = 1; /* no separator at all: the common non-RAG request */
        goto out;
    }

    size_t start = 0;
    for (;;) {
        size_t a = start, b = at;
        while (a < b && is_space((unsigned char)text[a]))
            a++;
        /* The last piece keeps its trailing whitespace: it is the text the model continues
         * from ("assistant\n" of a chat template, "A: " of a few-shot prompt). */
        if (at != len)
            while (b > a && is_space((unsigned char)text[b - 1]))
                b--;
        if (a == b) {
            out->empty_skipped++;
        } else {
            if (p->max_segments && out->n == p->max_segments) {
                st = CG_E_SEGMENTS;
                goto out;
            }
            push_segment(out, a, b - a);
            if (b - a > longest) longest = b - a;
        }
        if (at == len) break;
        start = at + sep_len;
        at = find_sep(text, len, start, sep, sep_len);
    }

    if (out->n < 2) {
        /* A separator with at most one non-empty segment around it ("# # hello") has no
         * system/question pair to cache; the request goes on unchanged. */
        reset_result(out);
        out->passthrough = 1;
        goto out;
    }
    /* Checked after the loop so that a passthrough prompt is never refused for its size. */
    if (p->max_segment_bytes && longest > p->max_segment_bytes) {
        st = CG_E_SEGMENT_SIZE;
        goto out;
    }
    out->segs[0].role = CG_ROLE_SYSTEM;
    out->segs[out->n - 1].role = CG_ROLE_QUESTION;

out:
    if (st != CG_OK) reset_result(out);
    return st;
}

/* Shared by the fuzz targets: the libFuzzer entry points, an invariant check that aborts (so
 * libFuzzer and the corpus replay both report it as a crash), and a reader that carves small
 * parameters off the front of an input. Header-only so each target stays one .c file. */
#ifndef CG_FUZZ_COMMON_H
#define CG_FUZZ_COMMON_H

#include <stddef.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size);
int LLVMFuzzerInitialize(int *argc, char ***argv);

/* An invariant, not an input check: a false cond is a bug in the code under test. */
#define FUZZ_CHECK(cond)                                                                           \
    do {                                                                                           \
        if (!(cond)) {                                                                             \
            fprintf(stderr, "%s:%d: invariant failed: %s\n", __FILE__, __LINE__, #cond);           \
            abort();                                                                               \
        }                                                                                          \
    } while (0)

/* Consumes an input from the front; reads past the end give zeros / empty spans, so every
 * input, however short, maps to some parameters. */
typedef struct fuzz_in {
    const uint8_t *p;
    size_t n;
} fuzz_in;

static inline uint8_t fuzz_u8(fuzz_in *in)
{
    if (!in->n) return 0;
    in->n--;
    return *in->p++;
}

static inline uint32_t fuzz_u16(fuzz_in *in)
{
    uint32_t lo = fuzz_u8(in);
    return lo | (uint32_t)fuzz_u8(in) << 8;
}

static inline uint32_t fuzz_u32(fuzz_in *in)
{
    uint32_t lo = fuzz_u16(in);
    return lo | fuzz_u16(in) << 16;
}

/* Up to n bytes; *got receives how many there were. */
static inline const uint8_t *fuzz_bytes(fuzz_in *in, size_t n, size_t *got)
{
    const uint8_t *p = in->p;
    if (n > in->n) n = in->n;
    in->p += n;
    in->n -= n;
    *got = n;
    return p;
}

/* The bytes up to the next delim (consumed, not included) or to the end. */
static inline const uint8_t *fuzz_field(fuzz_in *in, uint8_t delim, size_t *len)
{
    const uint8_t *p = in->p;
    const uint8_t *e = in->n ? memchr(p, delim, in->n) : NULL;
    size_t n = e ? (size_t)(e - p) : in->n;
    in->p += n + (e != NULL);
    in->n -= n + (e != NULL);
    *len = n;
    return p;
}

/* A heap copy of exactly n bytes (at least 1 allocated), so ASan sees any overread. */
static inline char *fuzz_dup(const void *p, size_t n)
{
    char *c = malloc(n ? n : 1);
    if (!c) abort();
    if (n) memcpy(c, p, n);
    return c;
}

/* The same bytes NUL-terminated (for APIs that take C strings). */
static inline char *fuzz_strndup(const void *p, size_t n)
{
    char *c = malloc(n + 1);
    if (!c) abort();
    if (n) memcpy(c, p, n);
    c[n] = '\0';
    return c;
}

/* Naive reference UTF-8 validator (Unicode Table 3-7), one code point at a time: the
 * differential oracle for cg_utf8_valid's vector path. */
static inline int fuzz_utf8_naive(const uint8_t *s, size_t n)
{
    size_t i = 0;
    while (i < n) {
        uint32_t c = s[i], cp, len;
        if (c < 0x80) {
            i++;
            continue;
        } else if ((c & 0xE0) == 0xC0) {
            len = 2;
            cp = c & 0x1F;
        } else if ((c & 0xF0) == 0xE0) {
            len = 3;
            cp = c & 0x0F;
        } else if ((c & 0xF8) == 0xF0) {
            len = 4;
            cp = c & 0x07;
        } else {
            return 0;
        }
        if (n - i < len) return 0;
        for (uint32_t k = 1; k < len; k++) {
            if ((s[i + k] & 0xC0) != 0x80) return 0;
            cp = cp << 6 | (s[i + k] & 0x3F);
        }
        static const uint32_t min_cp[5] = {0, 0, 0x80, 0x800, 0x10000};
        if (cp < min_cp[len] || cp > 0x10FFFF || (cp >= 0xD800 && cp <= 0xDFFF)) return 0;
        i += len;
    }
    return 1;
}

static inline int fuzz_is_space(uint8_t c)
{
    return c == ' ' || c == '\t' || c == '\n' || c == '\r' || c == '\v' || c == '\f';
}

#endif

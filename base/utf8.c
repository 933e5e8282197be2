/* UTF-8 decoding on utf8proc_iterate (see utf8.h). */
#include "base/utf8.h"

#include <string.h>
#include <utf8proc.h>

size_t cg_utf8_decode(const void *s, size_t n, uint32_t *cp)
{
    utf8proc_int32_t c;
    /* utf8proc reads at most 4 bytes; a longer n only has to say "at least 4" */
    utf8proc_ssize_t r = utf8proc_iterate(s, (utf8proc_ssize_t)(n < 4 ? n : 4), &c);
    if (r <= 0) return 0;
    *cp = (uint32_t)c;
    return (size_t)r;
}

int cg_utf8_is_prefix(const void *s, size_t n)
{
    if (n == 0 || n > 3) return 0;
    /* Complete the bytes with continuation bytes and ask utf8proc: a prefix is proper when some
     * completion decodes to a longer sequence. The second byte's allowed range always holds
     * 0x80 or 0xBF (E0: A0..BF, ED: 80..9F, F0: 90..BF, F4: 80..8F), later bytes any
     * continuation byte, so these two completions decide. */
    static const unsigned char fill[2] = {0x80, 0xBF};
    for (int f = 0; f < 2; f++) {
        unsigned char b[4];
        memset(b, fill[f], sizeof b);
        memcpy(b, s, n);
        uint32_t cp;
        if (cg_utf8_decode(b, sizeof b, &cp) > n) return 1;
    }
    return 0;
}

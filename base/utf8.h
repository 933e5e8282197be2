/* The one UTF-8 decoder of the tree, on utf8proc_iterate: what is a well-formed sequence
 * (Unicode Table 3-7: no overlongs, no surrogates, nothing above U+10FFFF) is decided in
 * utf8proc alone. The chat-template engine, the splitter's validator, the tokenizer and the
 * worker's text sanitizer all decode through it. */
#ifndef CG_UTF8_H
#define CG_UTF8_H

#include <stddef.h>
#include <stdint.h>

/* Decodes the sequence at s[0..n) (borrowed; n may exceed the sequence). Returns its length,
 * 1 to 4, with the code point in *cp; or 0 when s does not start with a well-formed sequence
 * (n == 0, an ill-formed byte, or a sequence that n cuts short), *cp then unchanged. */
size_t cg_utf8_decode(const void *s, size_t n, uint32_t *cp);
/* 1 when s[0..n) (0 < n) is a proper prefix of a well-formed sequence: a lead byte and the
 * continuation bytes it allows, the sequence not yet complete; else 0. A lossy decoder replaces
 * the longest such prefix with one U+FFFD (the "maximal subpart" of Unicode §3.9, as the
 * WHATWG decoder and Rust's from_utf8_lossy do); a streaming one waits for more bytes. */
int cg_utf8_is_prefix(const void *s, size_t n);

#endif

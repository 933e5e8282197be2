/* The tokenizer's regexes: the patterns of tokenizer.json (written for Oniguruma, which the
 * tokenizers library uses) rewritten where PCRE2 defines a class differently, compiled with
 * UTF + UCP + JIT, and matched. */
#include "worker/model/tokenizer_impl.h"

#include <stdio.h>
#include <stdlib.h>

/* ---------------------------------------------------------------------------------------------
 * Regexes (PCRE2)
 * ------------------------------------------------------------------------------------------- */

/* Rewrites a tokenizers (Oniguruma) pattern for PCRE2 with UCP. The classes that differ:
 * Oniguruma's \s is White_Space (PCRE2 adds U+180E), \w is letters, marks, numbers and
 * connector punctuation (PCRE2 lacks marks), \uHHHH is a code point (PCRE2: an error), \h is a
 * hex digit (PCRE2: horizontal space). \b, \B, \h, \H, \W inside a class, POSIX classes,
 * nested classes and class intersection are refused rather than approximated. (^ and $ are line
 * anchors in Oniguruma: rx_compile sets PCRE2_MULTILINE.) Returns NULL and sets why on refusal. */
static char *rx_rewrite(const char *p, size_t n, const char **why)
{
    static const char word[] = "\\p{L}\\p{M}\\p{N}\\p{Pc}";
    sbuf o = {0};
    bool in_class = false;
    for (size_t i = 0; i < n; i++) {
        char c = p[i];
        if (c == '\\' && i + 1 < n) {
            char d = p[i + 1];
            i++;
            switch (d) {
            case 's':
                tk_sb_add(&o, "\\p{White_Space}", 15);
                break;
            case 'S':
                tk_sb_add(&o, "\\P{White_Space}", 15);
                break;
            case 'w':
                if (in_class)
                    tk_sb_add(&o, word, sizeof word - 1);
                else {
                    tk_sb_add(&o, "[", 1);
                    tk_sb_add(&o, word, sizeof word - 1);
                    tk_sb_add(&o, "]", 1);
                }
                break;
            case 'W':
                if (in_class) {
                    *why = "\\W inside a character class";
                    goto fail;
                }
                tk_sb_add(&o, "[^", 2);
                tk_sb_add(&o, word, sizeof word - 1);
                tk_sb_add(&o, "]", 1);
                break;
            case 'b':
            case 'B':
                *why = "word boundaries (\\b, \\B)";
                goto fail;
            case 'h':
            case 'H':
                *why = "\\h and \\H";
                goto fail;
            case 'u': {
                size_t k = 0;
                while (k < 4 && i + 1 + k < n && tk_hexval(p[i + 1 + k]) >= 0)
                    k++;
                if (k != 4) {
                    *why = "\\u without four hex digits";
                    goto fail;
                }
                tk_sb_add(&o, "\\x{", 3);
                tk_sb_add(&o, p + i + 1, 4);
                tk_sb_add(&o, "}", 1);
                i += 4;
                break;
            }
            default:
                tk_sb_add(&o, p + i - 1, 2);
                /* \p{..}, \x{..} and friends pass through whole */
                break;
            }
            continue;
        }
        if (!in_class && c == '[') {
            in_class = true;
            tk_sb_add(&o, &c, 1);
            /* a ']' right after '[' or '[^' is a literal */
            if (i + 1 < n && p[i + 1] == '^') tk_sb_add(&o, p + ++i, 1);
            if (i + 1 < n && p[i + 1] == ']') tk_sb_add(&o, p + ++i, 1);
            continue;
        }
        if (in_class && c == '[' && i + 1 < n &&
            (p[i + 1] == ':' || p[i + 1] == '=' || p[i + 1] == '.')) {
            *why = "POSIX character classes";
            goto fail;
        }
        if (in_class && c == '[') {
            *why = "nested character classes";
            goto fail;
        }
        if (in_class && c == '&' && i + 1 < n && p[i + 1] == '&') {
            *why = "class intersection (&&)";
            goto fail;
        }
        if (in_class && c == ']') in_class = false;
        tk_sb_add(&o, &c, 1);
    }
    if (!o.p) tk_sb_add(&o, "", 0);
    return o.p;
fail:
    tk_sb_free(&o);
    return NULL;
}

pcre2_code *tk_rx_compile(const char *pat, size_t n, bool literal, char *why, size_t whylen,
                          cg_status *st)
{
    const char *refusal = NULL;
    char *src = literal ? cg_strndup(pat, n) : rx_rewrite(pat, n, &refusal);
    *st = CG_E_UNSUPPORTED;
    if (!src) {
        snprintf(why, whylen, "uses %s, which is not supported", refusal);
        return NULL;
    }
    *st = CG_E_VALUE;
    int ec = 0;
    PCRE2_SIZE eo = 0;
    uint32_t opt = PCRE2_UTF | (literal ? PCRE2_LITERAL : PCRE2_UCP | PCRE2_MULTILINE);
    pcre2_compile_context *cc = pcre2_compile_context_create(NULL);
    if (!cc) abort();
    pcre2_set_newline(cc, PCRE2_NEWLINE_LF); /* Oniguruma's newline, whatever PCRE2's build says */
    pcre2_code *re =
        pcre2_compile((PCRE2_SPTR)src, literal ? n : PCRE2_ZERO_TERMINATED, opt, &ec, &eo, cc);
    pcre2_compile_context_free(cc);
    free(src);
    if (!re) {
        PCRE2_UCHAR msg[160];
        pcre2_get_error_message(ec, msg, sizeof msg);
        snprintf(why, whylen, "does not compile: %s at offset %zu", (char *)msg, (size_t)eo);
        return NULL;
    }
    (void)pcre2_jit_compile(re, PCRE2_JIT_COMPLETE); /* the interpreter is the fallback */
    return re;
}

int tk_rx_match(const pcre2_code *re, const char *s, size_t n, size_t pos, uint32_t opts,
                pcre2_match_data *md, size_t *ms, size_t *me)
{
    int rc = pcre2_match(re, (PCRE2_SPTR)s, n, pos, PCRE2_NO_UTF_CHECK | opts, md, NULL);
    if (rc == PCRE2_ERROR_JIT_STACKLIMIT)
        rc = pcre2_match(re, (PCRE2_SPTR)s, n, pos, PCRE2_NO_UTF_CHECK | PCRE2_NO_JIT | opts, md,
                         NULL);
    if (rc == PCRE2_ERROR_NOMATCH) return 0;
    if (rc < 0) return -1;
    PCRE2_SIZE *ov = pcre2_get_ovector_pointer(md);
    *ms = ov[0];
    *me = ov[1];
    return 1;
}

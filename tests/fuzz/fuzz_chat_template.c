/* Fuzz target for the chat-template renderer (cache/chat_template*.c).
 * Input: [flags][template bytes]. flags & 3 picks the variables (a chat with a system prompt
 * and thinking, a tool-calling chat with tools, an empty object, none); flags & 4 caps the
 * output at 256 bytes. Invariants: parse and render return only their documented statuses,
 * with a message; a refused template leaves no template; a failed render leaves the output
 * buffer as it was; a rendered text respects the output cap and, like every error message, is
 * valid UTF-8; rendering twice gives the same status and text (templates that read the clock
 * excepted). The bounds are small, so every input finishes quickly. */
#include "fuzz_common.h"

#include <jansson.h>
#include <stdbool.h>

#include "base/base.h"
#include "cache/chat_template.h"

static json_t *VARS[3];

int LLVMFuzzerInitialize(int *argc, char ***argv)
{
    (void)argc;
    (void)argv;
    static const char *const src[3] = {
        "{\"messages\":[{\"role\":\"system\",\"content\":\"Be "
        "brief.\"},{\"role\":\"user\",\"content\":"
        "\"hi {{ x }} {% if "
        "%}\"},{\"role\":\"assistant\",\"content\":\"<think>\\nr\\n</think>\\n\\nyo\"},"
        "{\"role\":\"user\",\"content\":\"\\u00e9\\ud83d\\ude00\"}],\"add_generation_prompt\":true,"
        "\"bos_token\":\"<s>\",\"eos_token\":\"</s>\",\"enable_thinking\":false}",
        "{\"messages\":[{\"role\":\"user\",\"content\":\"w\"},{\"role\":\"assistant\",\"content\":"
        "null,"
        "\"tool_calls\":[{\"function\":{\"name\":\"f\",\"arguments\":{\"a\":1,\"2\":[1.5,true,null]"
        "}}},"
        "{\"name\":\"g\",\"arguments\":\"{}\"}]},{\"role\":\"tool\",\"content\":\"r\"}],"
        "\"tools\":[{\"type\":\"function\",\"function\":{\"name\":\"f\",\"parameters\":{}}}],"
        "\"add_generation_prompt\":false,\"x\":[1,\"a\",{\"k\":2.5}],\"d\":{\"k\":\"v\"}}",
        "{}"};
    for (int i = 0; i < 3; i++)
        FUZZ_CHECK((VARS[i] = json_loads(src[i], 0, NULL)) != NULL);
    return 0;
}

/* The template parsed, so it is valid UTF-8, as are the variables: so must the text be. */
static bool valid_utf8(const char *s, size_t n)
{
    const unsigned char *p = (const unsigned char *)s;
    for (size_t i = 0; i < n;) {
        unsigned char c = p[i];
        size_t l = c < 0x80             ? 1
                   : (c & 0xE0) == 0xC0 ? 2
                   : (c & 0xF0) == 0xE0 ? 3
                   : (c & 0xF8) == 0xF0 ? 4
                                        : 0;
        if (!l || i + l > n) return false;
        uint32_t cp = l == 1 ? c : c & (0x7Fu >> l);
        for (size_t k = 1; k < l; k++) {
            if ((p[i + k] & 0xC0) != 0x80) return false;
            cp = (cp << 6) | (p[i + k] & 0x3F);
        }
        static const uint32_t min[5] = {0, 0, 0x80, 0x800, 0x10000};
        if (cp < min[l] || cp > 0x10FFFF || (cp >= 0xD800 && cp <= 0xDFFF)) return false;
        i += l;
    }
    return true;
}

static cg_status render(const cg_chat_template *t, const json_t *vars, cg_buf *b, char *err,
                        size_t errlen)
{
    cg_buf_init_unbounded(b);
    FUZZ_CHECK(cg_buf_append(b, "pre", 3) == CG_OK);
    err[0] = 0;
    cg_status st = cg_chat_template_render(t, vars, b, err, errlen);
    FUZZ_CHECK(st == CG_OK || st == CG_E_VALUE || st == CG_E_TOO_LARGE || st == CG_E_TYPE);
    FUZZ_CHECK(b->len >= 3 && memcmp(b->data, "pre", 3) == 0);
    if (st != CG_OK) FUZZ_CHECK(b->len == 3);
    return st;
}

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size)
{
    if (!VARS[0]) LLVMFuzzerInitialize(NULL, NULL);
    fuzz_in in = {data, size};
    uint8_t flags = fuzz_u8(&in);
    const json_t *vars = (flags & 3) == 3 ? NULL : VARS[flags & 3];
    cg_chat_template_limits lim = cg_chat_template_default_limits();
    lim.max_output = flags & 4 ? 256 : 1 << 16;
    lim.max_steps = 20000;
    lim.max_memory = 8u << 20;
    lim.max_depth = 200;

    cg_chat_template *t = NULL;
    char err[512];
    err[0] = 0;
    cg_status st = cg_chat_template_new((const char *)in.p, in.n, &lim, &t, err, sizeof err);
    FUZZ_CHECK(st == CG_OK || st == CG_E_VALUE || st == CG_E_UNSUPPORTED || st == CG_E_TOO_LARGE);
    if (st != CG_OK) {
        FUZZ_CHECK(t == NULL && err[0] != 0);
        return 0;
    }
    FUZZ_CHECK(t != NULL);
    cg_buf a, b;
    char err2[512];
    cg_status s1 = render(t, vars, &a, err, sizeof err);
    cg_status s2 = render(t, vars, &b, err2, sizeof err2);
    if (s1 == CG_OK)
        FUZZ_CHECK(a.len - 3 <= lim.max_output);
    else
        FUZZ_CHECK(err[0] != 0 || s1 == CG_E_VALUE); /* raise_exception('') has an empty message */
    FUZZ_CHECK(valid_utf8(a.data, a.len) && valid_utf8(err, strlen(err)));
    bool clock = memmem(in.p, in.n, "strftime_now", 12) != NULL;
    if (!clock) {
        FUZZ_CHECK(s1 == s2);
        FUZZ_CHECK(a.len == b.len && memcmp(a.data, b.data, a.len) == 0);
        if (s1 != CG_OK) FUZZ_CHECK(strcmp(err, err2) == 0);
    }
    cg_buf_free(&a);
    cg_buf_free(&b);
    cg_chat_template_free(&t);
    FUZZ_CHECK(t == NULL);
    return 0;
}

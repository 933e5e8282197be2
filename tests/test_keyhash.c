/* The key hash option (--key-hash sha256): pinned SHA-256 vectors of the same canonical encoding
 * as XXH3-128 (computed independently with Python's hashlib), the process-wide switch, and over
 * HTTP: a gateway and a worker that both use sha256 serve hits with SHA-256 keys, the worker
 * reports key_hash in /v1/info, refuses keys of the other hash, and a gateway refuses a worker
 * whose key hash differs from its own (at start and through POST /v1/workers). */
#include <check.h>
#include <signal.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "cache/key.h"
#include "tests/harness/harness.h"
#include "tests/key_vectors.h"

#define MODEL "chunkgate-tiny"

static void hex_with(cg_key_hash h, const char *model, cg_mode mode, const char *salt,
                     const cg_key *sys, const char *text, char out[CG_KEY_HEX_LEN + 1])
{
    cg_key k = cg_key_compute_with(h, model, strlen(model), mode, salt, strlen(salt), sys, text,
                                   strlen(text));
    cg_key_hex(&k, out);
}

/* The pinned SHA-256 vectors, and the XXH3 ones with the same function (tests/key_vectors.h). */
START_TEST(sha256_pinned_vectors)
{
    size_t n;
    const key_vector *v = key_vectors(&n);
    for (size_t i = 0; i < n; i++) {
        char hex[CG_KEY_HEX_LEN + 1];
        hex_with(CG_KEY_HASH_SHA256, v[i].model, v[i].mode, v[i].salt, v[i].sys, v[i].text, hex);
        ck_assert_msg(!strcmp(hex, v[i].sha), "sha256 vector %zu: %s want %s", i, hex, v[i].sha);
        hex_with(CG_KEY_HASH_XXH3, v[i].model, v[i].mode, v[i].salt, v[i].sys, v[i].text, hex);
        ck_assert_msg(!strcmp(hex, v[i].xxh), "xxh3 vector %zu: %s want %s", i, hex, v[i].xxh);
    }
}
END_TEST

START_TEST(process_wide_switch)
{
    cg_key_hash h;
    ck_assert_int_eq(cg_key_get_hash(), CG_KEY_HASH_XXH3); /* the default */
    ck_assert_int_eq(cg_key_hash_parse("sha256", &h), 0);
    ck_assert_int_eq(h, CG_KEY_HASH_SHA256);
    ck_assert_int_eq(cg_key_hash_parse("xxhash", &h), 0);
    ck_assert_int_eq(h, CG_KEY_HASH_XXH3);
    ck_assert_int_eq(cg_key_hash_parse("xxh3", &h), 0);
    ck_assert_int_eq(cg_key_hash_parse("md5", &h), -1);
    ck_assert_int_eq(cg_key_hash_parse(NULL, &h), -1);
    ck_assert_str_eq(cg_key_hash_name(CG_KEY_HASH_SHA256), "sha256");
    ck_assert_str_eq(cg_key_hash_name(CG_KEY_HASH_XXH3), "xxhash");
    cg_key a = cg_key_compute("m", 1, CG_MODE_STRICT, NULL, 0, NULL, "t", 1);
    cg_key_set_hash(CG_KEY_HASH_SHA256);
    cg_key b = cg_key_compute("m", 1, CG_MODE_STRICT, NULL, 0, NULL, "t", 1);
    cg_key c =
        cg_key_compute_with(CG_KEY_HASH_SHA256, "m", 1, CG_MODE_STRICT, NULL, 0, NULL, "t", 1);
    cg_key_set_hash(CG_KEY_HASH_XXH3);
    ck_assert(!cg_key_equal(&a, &b));
    ck_assert(cg_key_equal(&b, &c));
    /* each byte of the text, the salt and the model still changes the key */
    cg_key d =
        cg_key_compute_with(CG_KEY_HASH_SHA256, "m", 1, CG_MODE_STRICT, "s", 1, NULL, "t", 1);
    cg_key e =
        cg_key_compute_with(CG_KEY_HASH_SHA256, "n", 1, CG_MODE_STRICT, NULL, 0, NULL, "t", 1);
    ck_assert(!cg_key_equal(&c, &d));
    ck_assert(!cg_key_equal(&c, &e));
}
END_TEST

/* ------------------------------------------------------------ over HTTP */

static th_proc wsha, wxx;
static char model_dir[300], usha[64], uxx[64];

static void setup(void)
{
    if (th_init_with_model("keyhash", WORKER_BIN, model_dir, sizeof model_dir) != 0) abort();
    const char *e[] = {"--key-hash", "sha256", NULL};
    if (th_start_worker(&wsha, WORKER_BIN, model_dir, 0, "wsha", e) != 0) abort();
    if (th_start_worker(&wxx, WORKER_BIN, model_dir, 0, "wxx", NULL) != 0) abort();
    snprintf(usha, sizeof usha, "http://127.0.0.1:%d", wsha.port);
    snprintf(uxx, sizeof uxx, "http://127.0.0.1:%d", wxx.port);
}

static void teardown(void)
{
    th_stop_clean(&wsha, "chunkgate-worker (sha256)");
    th_stop_clean(&wxx, "chunkgate-worker (xxhash)");
    th_cleanup(th_failures);
}

static const char *info_hash(int port, char *buf, size_t n)
{
    th_resp r;
    th_http(&r, port, "GET", "/v1/info", NULL, NULL, NULL);
    json_t *j = th_json(&r);
    snprintf(buf, n, "%s", json_string_value(json_object_get(j, "key_hash")) ?: "(none)");
    json_decref(j);
    th_resp_free(&r);
    return buf;
}

START_TEST(sha256_end_to_end)
{
    char buf[32];
    ck_assert_str_eq(info_hash(wsha.port, buf, sizeof buf), "sha256");
    ck_assert_str_eq(info_hash(wxx.port, buf, sizeof buf), "xxhash");
    th_proc g;
    const char *ge[] = {"--key-hash", "sha256", NULL};
    ck_assert_int_eq(th_start_gateway_to(&g, CHUNKGATE_BIN, "gsha", usha, NULL, ge), 0);
    const char *doc = "Key hash document: the harbour deepened to twelve metres.";
    char body[512];
    snprintf(body, sizeof body,
             "{\"model\":\"" MODEL "\",\"max_tokens\":1,\"prompt\":\"Sys. # # %s # # Depth?\"}",
             doc);
    char want[CG_KEY_HEX_LEN + 1];
    hex_with(CG_KEY_HASH_SHA256, MODEL, CG_MODE_STRICT, "", NULL, doc, want);
    for (int round = 0; round < 2; round++) {
        th_resp r;
        th_http(&r, g.port, "POST", "/v1/completions", body, NULL, NULL);
        ck_assert_msg(r.status == 200, "HTTP %ld %.*s", r.status, (int)r.body.len, r.body.data);
        json_t *j = th_json(&r);
        json_t *cc = json_object_get(j, "chunk_cache");
        json_t *s = json_array_get(json_object_get(cc, "segments"), 1);
        ck_assert(json_is_false(json_object_get(cc, "fallback")));
        ck_assert_str_eq(json_string_value(json_object_get(s, "key")), want);
        ck_assert(json_is_true(json_object_get(s, "hit")) == (round == 1));
        json_decref(j);
        th_resp_free(&r);
    }
    /* the sha256 worker refuses an XXH3 key for the same text */
    char xkey[CG_KEY_HEX_LEN + 1];
    hex_with(CG_KEY_HASH_XXH3, MODEL, CG_MODE_STRICT, "", NULL, doc, xkey);
    snprintf(
        body, sizeof body,
        "{\"segments\":[{\"role\":\"system\",\"text\":\"s\"},{\"role\":\"chunk\",\"text\":\"%s\","
        "\"key\":\"%s\"},{\"role\":\"question\",\"text\":\"q\"}]}",
        doc, xkey);
    th_resp r;
    th_http(&r, wsha.port, "POST", "/v1/assemble", body, NULL, NULL);
    ck_assert(th_is_error(&r, 400, "chunk_key_mismatch"));
    th_resp_free(&r);
    /* a gateway on sha256 refuses an xxhash worker through the admin API */
    char add[128];
    snprintf(add, sizeof add, "{\"url\":\"%s\"}", uxx);
    th_http(&r, g.port, "POST", "/v1/workers", add, NULL, NULL);
    ck_assert_msg(th_is_error(&r, 409, "conflict"), "HTTP %ld", r.status);
    ck_assert_ptr_nonnull(strstr(r.body.data, "key_hash"));
    th_resp_free(&r);
    ck_assert_int_eq(th_stop(&g, SIGTERM), 0);
}
END_TEST

START_TEST(mismatch_refused_at_start)
{
    /* default (xxhash) gateway, sha256 worker; and the other way round */
    struct {
        const char *url, *hash, *name;
    } c[] = {{usha, "xxhash", "gmis1"}, {uxx, "sha256", "gmis2"}};
    for (size_t i = 0; i < 2; i++) {
        th_proc g;
        char data[400];
        snprintf(data, sizeof data, "%s/%s-data", th_root(), c[i].name);
        const char *ga[] = {"--listen", "127.0.0.1:0", "--data-dir", data, "--worker",
                            c[i].url,   "--key-hash",  c[i].hash,    NULL};
        char log[64];
        snprintf(log, sizeof log, "%s.log", c[i].name);
        ck_assert_int_eq(th_spawn(&g, CHUNKGATE_BIN, ga, NULL, log, NULL, 0), 0);
        int rc = th_wait_exit(&g, 30000);
        char *text = th_read_file(g.log, NULL);
        ck_assert_msg(rc == 1, "exit %d: %s", rc, text);
        ck_assert_msg(strstr(text, "key_hash"), "%s", text);
        free(text);
    }
    /* and a bad value is a configuration error */
    th_proc g;
    const char *ga[] = {"--key-hash", "md5", NULL};
    ck_assert_int_eq(th_spawn(&g, CHUNKGATE_BIN, ga, NULL, "gbad.log", NULL, 0), 0);
    ck_assert_int_eq(th_wait_exit(&g, 30000), 2);
    const char *wa[] = {"serve", "--model", model_dir, "--key-hash", "md5", NULL};
    ck_assert_int_eq(th_spawn(&g, WORKER_BIN, wa, NULL, "wbad.log", NULL, 0), 0);
    ck_assert_int_eq(th_wait_exit(&g, 30000), 2);
}
END_TEST

int main(void)
{
    Suite *s = suite_create("keyhash");
    th_case(s, "vectors", 0, TH_TESTS(sha256_pinned_vectors, process_wide_switch));
    TCase *tc = th_case(s, "http", 120, TH_TESTS(sha256_end_to_end, mismatch_refused_at_start));
    tcase_add_unchecked_fixture(tc, setup, teardown);
    return th_run(s, CK_FORK_GETENV);
}

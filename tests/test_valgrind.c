/* One integration run of chunkgate and chunkgate-worker under valgrind memcheck: the main path
 * (miss, then hit), pass-through, a stream, chat, admin reads, auth failures and bad input,
 * then a clean SIGTERM stop. Each must report 0 errors, 0 bytes definitely lost and 0 bytes
 * indirectly lost. Exits 77 (ctest: skipped) without valgrind or on a sanitizer build. */
#include <check.h>
#include <signal.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include "tests/harness/harness.h"

#define MODEL "chunkgate-tiny"
#define KEY "sk-valgrind-1"
#define ADMIN "adm-valgrind"

static char valgrind[512];

/* The memcheck verdict of one log: 1 when clean; the summary lines go to stderr. */
static int clean(const char *what, const char *log_path)
{
    char *log = th_read_file(log_path, NULL);
    const char *es = strstr(log, "ERROR SUMMARY: ");
    int errors = es ? atoi(es + 15) : -1;
    const char *dl = strstr(log, "definitely lost: ");
    const char *il = strstr(log, "indirectly lost: ");
    int no_leaks = strstr(log, "All heap blocks were freed") != NULL;
    long def = dl ? atol(dl + 17) : (no_leaks ? 0 : -1);
    long ind = il ? atol(il + 17) : (no_leaks ? 0 : -1);
    fprintf(stderr,
            "valgrind %s: %d errors, definitely lost %ld bytes, indirectly lost %ld bytes\n", what,
            errors, def, ind);
    int ok = errors == 0 && def == 0 && ind == 0;
    if (!ok) fprintf(stderr, "%s\n", log);
    free(log);
    return ok;
}

static long req(int port, const char *method, const char *path, const char *body, const char *tok)
{
    th_resp r;
    th_http(&r, port, method, path, body, tok, NULL);
    long s = r.status;
    th_resp_free(&r);
    return s;
}

START_TEST(gateway_and_worker_under_memcheck)
{
    char model_dir[300], wlog[400], glog[400], wdata[400], gdata[400];
    snprintf(model_dir, sizeof model_dir, "%s/model", th_root());
    ck_assert_int_eq(th_gen_model(WORKER_BIN, model_dir, NULL), 0);
    snprintf(wlog, sizeof wlog, "--log-file=%s/vg-worker.txt", th_root());
    snprintf(glog, sizeof glog, "--log-file=%s/vg-gateway.txt", th_root());
    snprintf(wdata, sizeof wdata, "%s/w-data", th_root());
    snprintf(gdata, sizeof gdata, "%s/g-data", th_root());
    const char *env[] = {"OMP_WAIT_POLICY=passive", "OPENBLAS_NUM_THREADS=1", "OMP_NUM_THREADS=1",
                         NULL};
#define VG                                                                                         \
    "--leak-check=full", "--show-leak-kinds=definite,indirect",                                    \
        "--errors-for-leak-kinds=definite,indirect", "--num-callers=30"
    const char *wa[] = {VG,          wlog,          WORKER_BIN,   "serve",  "--model",   model_dir,
                        "--listen",  "127.0.0.1:0", "--data-dir", wdata,    "--pool-mb", "16",
                        "--disk-mb", "4",           "--key-hash", "sha256", NULL};
    th_proc w, g;
    ck_assert_msg(
        th_spawn(&w, valgrind, wa, env, "worker.log", "\"msg\":\"listening on 127.0.0.1:", 0) == 0,
        "the worker did not start under valgrind");
    char wurl[64];
    snprintf(wurl, sizeof wurl, "http://127.0.0.1:%d", w.port);
    const char *ga[] = {VG, glog, CHUNKGATE_BIN, "--listen", "127.0.0.1:0", "--data-dir", gdata,
                        "--worker", wurl, "--api-key", KEY, "--admin-token", ADMIN, "--key-hash",
                        "sha256", "--health-interval-ms", "500",
                        /* valgrind runs a process's threads one at a time, so a worker busy
                         * computing answers its health probe late: give it room. */
                        "--health-timeout-ms", "30000", "--worker-timeout-ms", "300000", NULL};
    ck_assert_msg(th_spawn(&g, valgrind, ga, env, "gateway.log", "listening on 127.0.0.1:", 0) == 0,
                  "the gateway did not start under valgrind");
    ck_assert(th_wait_worker(g.port, ADMIN, wurl, 1));

    const char *rag = "{\"model\":\"" MODEL "\",\"max_tokens\":2,\"temperature\":0,\"prompt\":"
                      "\"Valgrind system. # # Valgrind document one. # # Document two. # # Q?\"}";
    ck_assert_int_eq(req(g.port, "POST", "/v1/completions", rag, KEY), 200); /* misses */
    ck_assert_int_eq(req(g.port, "POST", "/v1/completions", rag, KEY), 200); /* hits */
    ck_assert_int_eq(req(g.port, "POST", "/v1/completions",
                         "{\"model\":\"" MODEL "\",\"max_tokens\":2,\"prompt\":\"no separator\"}",
                         KEY),
                     200); /* pass-through */
    ck_assert_int_eq(req(g.port, "POST", "/v1/completions",
                         "{\"model\":\"" MODEL "\",\"max_tokens\":3,\"stream\":true,\"prompt\":"
                         "\"S # # D # # Q\"}",
                         KEY),
                     200);
    ck_assert_int_eq(req(g.port, "POST", "/v1/chat/completions",
                         "{\"model\":\"" MODEL "\",\"max_tokens\":2,\"messages\":[{\"role\":"
                         "\"user\",\"content\":\"hi # # there\"}],\"documents\":[\"a doc\"]}",
                         KEY),
                     200);
    ck_assert_int_eq(req(g.port, "POST", "/v1/chunks/lookup",
                         "{\"model\":\"" MODEL "\",\"prompt\":\"S # # D # # Q\"}", KEY),
                     200);
    ck_assert_int_eq(req(g.port, "GET", "/v1/chunks", NULL, ADMIN), 200);
    ck_assert_int_eq(req(g.port, "GET", "/v1/workers", NULL, ADMIN), 200);
    ck_assert_int_eq(req(g.port, "GET", "/metrics", NULL, NULL), 200);
    ck_assert_int_eq(req(g.port, "GET", "/v1/models", NULL, KEY), 200);
    /* errors */
    ck_assert_int_eq(req(g.port, "POST", "/v1/completions", rag, NULL), 401);
    ck_assert_int_eq(req(g.port, "GET", "/v1/chunks", NULL, KEY), 401);
    ck_assert_int_eq(req(g.port, "POST", "/v1/completions", "{\"model\":", KEY), 400);
    ck_assert_int_eq(req(g.port, "POST", "/v1/completions", "{\"model\":\"m\",\"prompt\":7}", KEY),
                     400);
    ck_assert_int_eq(req(g.port, "GET", "/v1/nope", NULL, KEY), 404);
    ck_assert_int_eq(req(g.port, "DELETE", "/v1/completions", NULL, KEY), 405);
    ck_assert_int_eq(req(w.port, "POST", "/v1/assemble", "{\"segments\":[]}", NULL), 400);

    ck_assert_int_eq(th_stop(&g, SIGTERM), 0);
    ck_assert_int_eq(th_stop(&w, SIGTERM), 0);
    char p[400];
    snprintf(p, sizeof p, "%s/vg-gateway.txt", th_root());
    int gok = clean("chunkgate", p);
    snprintf(p, sizeof p, "%s/vg-worker.txt", th_root());
    int wok = clean("chunkgate-worker", p);
    ck_assert_msg(gok, "chunkgate is not clean under memcheck");
    ck_assert_msg(wok, "chunkgate-worker is not clean under memcheck");
}
END_TEST

int main(void)
{
#ifdef CG_SANITIZE_BUILD
    fprintf(stderr, "skipped: an ASan build cannot run under valgrind\n");
    return 77;
#endif
    if (!th_which("valgrind", valgrind, sizeof valgrind)) {
        fprintf(stderr, "skipped: valgrind is not installed (apt-get install valgrind)\n");
        return 77;
    }
    th_init("valgrind", NULL);
    int failed = th_run_suite("valgrind", "valgrind", 170, (th_fixture){0}, CK_NOFORK,
                              TH_TESTS(gateway_and_worker_under_memcheck));
    th_cleanup(failed);
    return failed;
}

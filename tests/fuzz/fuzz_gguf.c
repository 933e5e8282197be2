/* Fuzz target for the GGUF reader and the GGUF model loader (worker/model/gguf.c,
 * model_gguf.c): the input is the .gguf file. Invariants: a file the reader refuses gets a
 * message; a file it accepts has every tensor's bytes inside the file (each is read whole) and
 * every metadata string readable; a model the loader accepts is consistent, tokenizes, and runs
 * a forward pass; a refusal carries a message. The seeds (tests/fuzz/make_seeds.py) are a
 * one-layer model of dim 32 with a byte-level vocabulary and damaged copies of it. */
#include <fcntl.h>
#include <omp.h>
#include <unistd.h>

#include "fuzz_model.h"
#include "worker/model/gguf.h"

static char g_file[300];

static void remove_input(void)
{
    unlink(g_file);
}

int LLVMFuzzerInitialize(int *argc, char ***argv)
{
    (void)argc;
    (void)argv;
    const char *tmp = access("/dev/shm", W_OK) == 0 ? "/dev/shm" : "/tmp";
    snprintf(g_file, sizeof g_file, "%s/cg_fuzz_gguf_%d.gguf", tmp, (int)getpid());
    atexit(remove_input);
    cg_log_init("fuzz_gguf", (cg_log_level)(CG_LOG_ERROR + 1));
    omp_set_num_threads(1);
    return 0;
}

static void check_reader(void)
{
    cg_gguf *g = NULL;
    char err[512] = "";
    cg_status st = cg_gguf_open(g_file, &g, err, sizeof err);
    if (st != CG_OK) {
        FUZZ_CHECK(g == NULL && err[0] != '\0');
        return;
    }
    unsigned sum = 0;
    for (size_t i = 0; i < cg_gguf_n_tensors(g); i++) {
        const cg_gguf_tensor *t = cg_gguf_tensor_at(g, i);
        FUZZ_CHECK(t->name && t->name[0] && t->ndim >= 1 && t->ndim <= CG_GGUF_MAX_DIMS);
        FUZZ_CHECK(cg_gguf_find_tensor(g, t->name) == t);
        if (i) FUZZ_CHECK(strcmp(cg_gguf_tensor_at(g, i - 1)->name, t->name) < 0);
        for (size_t k = 0; k < t->nbytes; k++)
            sum += t->data[k]; /* out of the mapping: a crash */
    }
    static const char *const arrays[] = {"tokenizer.ggml.tokens", "tokenizer.ggml.merges"};
    for (size_t a = 0; a < CG_ARRAY_LEN(arrays); a++) {
        const cg_gguf_kv *kv = cg_gguf_find(g, arrays[a]);
        if (!kv || kv->type != CG_GGUF_ARRAY || kv->atype != CG_GGUF_STRING) continue;
        for (uint64_t i = 0; i < kv->n; i++) {
            size_t len;
            const char *s = cg_gguf_arr_str(kv, i, &len);
            for (size_t k = 0; k < len; k++)
                sum += (unsigned char)s[k];
        }
    }
    (void)sum;
    cg_gguf_close(&g);
    FUZZ_CHECK(g == NULL);
}

static void check_gguf_model(void)
{
    cg_model *m = open_or_refused(g_file);
    if (!m) return;
    const cg_model_config *c = cg_model_cfg(m);
    /* a big model is accepted only from a big file: the forward runs on small ones */
    if ((size_t)c->dim * (size_t)c->vocab_size > (1u << 22) || c->n_layers > 4) {
        cg_model_close(&m);
        return;
    }
    size_t n = 0;
    int32_t *tok = cg_tok_encode(m, "ab", 2, 0, &n);
    FUZZ_CHECK(tok != NULL && n >= 1);
    check_opened_model(m, tok, (uint32_t)n);
    free(tok);
}

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size)
{
    write_file(g_file, data, size);
    check_reader();
    check_gguf_model();
    return 0;
}

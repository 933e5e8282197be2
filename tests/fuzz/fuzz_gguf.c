/* Fuzz target for the GGUF reader and the GGUF model loader (worker/model/gguf.c,
 * model_gguf.c): the input is the .gguf file. Invariants: a file the reader refuses gets a
 * message; a file it accepts has every tensor's bytes inside the file (each is read whole) and
 * every metadata string readable; a model the loader accepts is consistent, tokenizes, and runs
 * a forward pass; a refusal carries a message. The seeds (tests/fuzz/make_seeds.py) are a
 * one-layer model of dim 32 with a byte-level vocabulary and damaged copies of it. */
#include <fcntl.h>
#include <omp.h>
#include <unistd.h>

#include "base/base.h"
#include "fuzz_common.h"
#include "kv/attn.h"
#include "worker/model/gguf.h"
#include "worker/model/model.h"
#include "worker/model/tokenizer.h"

static char g_path[300];

static void cleanup(void)
{
    unlink(g_path);
}

int LLVMFuzzerInitialize(int *argc, char ***argv)
{
    (void)argc;
    (void)argv;
    const char *tmp = access("/dev/shm", W_OK) == 0 ? "/dev/shm" : "/tmp";
    snprintf(g_path, sizeof g_path, "%s/cg_fuzz_gguf_%d.gguf", tmp, (int)getpid());
    atexit(cleanup);
    cg_log_init("fuzz_gguf", (cg_log_level)(CG_LOG_ERROR + 1));
    omp_set_num_threads(1);
    return 0;
}

static void write_input(const uint8_t *data, size_t size)
{
    int fd = open(g_path, O_WRONLY | O_CREAT | O_TRUNC | O_CLOEXEC, 0644);
    if (fd < 0) abort();
    while (size) {
        ssize_t k = write(fd, data, size);
        if (k <= 0) abort();
        data += k;
        size -= (size_t)k;
    }
    close(fd);
}

static void check_reader(void)
{
    cg_gguf *g = NULL;
    char err[512] = "";
    cg_status st = cg_gguf_open(g_path, &g, err, sizeof err);
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

static void check_model(void)
{
    cg_model *m = NULL;
    char err[512] = "";
    cg_status st = cg_model_open(g_path, &m, err, sizeof err);
    if (st != CG_OK) {
        FUZZ_CHECK(m == NULL && err[0] != '\0');
        return;
    }
    const cg_model_config *c = cg_model_cfg(m);
    FUZZ_CHECK(c->dim >= 1 && c->n_layers >= 1 && c->n_heads >= 1 && c->n_kv_heads >= 1);
    FUZZ_CHECK(c->n_heads % c->n_kv_heads == 0 && c->head_dim % 2 == 0 && c->head_dim > 0);
    FUZZ_CHECK(c->vocab_size >= 1 && c->max_pos >= 1 && c->model_id[0] != '\0');
    /* a big model is accepted only from a big file: the forward runs on small ones */
    if ((size_t)c->dim * (size_t)c->vocab_size <= (1u << 22) && c->n_layers <= 4) {
        size_t n = 0;
        int32_t *tok = cg_tok_encode(m, "ab", 2, 0, &n);
        FUZZ_CHECK(tok != NULL && n >= 1);
        uint32_t rows = c->max_pos >= (int)n ? (uint32_t)n : 1;
        cg_kv *kv = cg_kv_new(m, rows);
        FUZZ_CHECK(kv != NULL);
        float *logits = malloc((size_t)c->vocab_size * sizeof(float));
        if (!logits) abort();
        cg_attn_span sp = {0, rows, 0, 0};
        FUZZ_CHECK(cg_model_forward(m, kv, tok, rows, 0, 0, &sp, 1, logits) == CG_OK);
        free(logits);
        free(tok);
        cg_kv_free(&kv);
    }
    cg_model_close(&m);
    FUZZ_CHECK(m == NULL);
}

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size)
{
    write_input(data, size);
    check_reader();
    check_model();
    return 0;
}

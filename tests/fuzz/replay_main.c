/* Corpus replay driver: links one target's LLVMFuzzerTestOneInput into an ordinary program that
 * runs every file of the given corpus directories (or single files), so gcc builds replay the
 * corpora under ctest without clang or libFuzzer. A crash or a failed invariant aborts. */
#include <dirent.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>

#include "fuzz_common.h"

/* Targets that need one-time setup define LLVMFuzzerInitialize; others leave it out. */
__attribute__((weak)) int LLVMFuzzerInitialize(int *argc, char ***argv);

static int cmp_str(const void *a, const void *b)
{
    return strcmp(*(char *const *)a, *(char *const *)b);
}

static int run_file(const char *path)
{
    FILE *fp = fopen(path, "rb");
    if (!fp) {
        fprintf(stderr, "replay: cannot open %s\n", path);
        return -1;
    }
    size_t cap = 4096, n = 0;
    uint8_t *buf = malloc(cap);
    for (;;) {
        if (n == cap) buf = realloc(buf, cap *= 2);
        if (!buf) abort();
        size_t k = fread(buf + n, 1, cap - n, fp);
        n += k;
        if (k == 0) break;
    }
    int err = ferror(fp);
    fclose(fp);
    if (err) {
        free(buf);
        fprintf(stderr, "replay: read error on %s\n", path);
        return -1;
    }
    /* An exact-size copy, as libFuzzer passes it, so an overread is caught under ASan. */
    uint8_t *exact = malloc(n ? n : 1);
    if (!exact) abort();
    memcpy(exact, buf, n);
    free(buf);
    LLVMFuzzerTestOneInput(exact, n);
    free(exact);
    return 0;
}

/* Runs every regular file in dir, in name order (so a failure is reproducible). */
static int run_dir(const char *dir, size_t *count)
{
    DIR *d = opendir(dir);
    if (!d) {
        fprintf(stderr, "replay: cannot open directory %s\n", dir);
        return -1;
    }
    char **names = NULL;
    size_t n = 0, cap = 0;
    struct dirent *e;
    while ((e = readdir(d))) {
        if (e->d_name[0] == '.') continue;
        if (n == cap) names = realloc(names, (cap = cap ? cap * 2 : 64) * sizeof *names);
        if (!names) abort();
        names[n++] = strdup(e->d_name);
    }
    closedir(d);
    qsort(names, n, sizeof *names, cmp_str);
    int rc = 0;
    for (size_t i = 0; i < n; i++) {
        char path[4096];
        struct stat sb;
        snprintf(path, sizeof path, "%s/%s", dir, names[i]);
        if (stat(path, &sb) == 0 && S_ISREG(sb.st_mode)) {
            if (run_file(path) != 0) rc = -1;
            (*count)++;
        }
        free(names[i]);
    }
    free(names);
    return rc;
}

int main(int argc, char **argv)
{
    if (argc < 2) {
        fprintf(stderr, "usage: %s CORPUS_DIR_OR_FILE...\n", argv[0]);
        return 2;
    }
    if (LLVMFuzzerInitialize) LLVMFuzzerInitialize(&argc, &argv);
    size_t count = 0;
    int rc = 0;
    for (int i = 1; i < argc; i++) {
        struct stat sb;
        if (stat(argv[i], &sb) != 0) {
            fprintf(stderr, "replay: %s does not exist\n", argv[i]);
            rc = 1;
        } else if (S_ISDIR(sb.st_mode)) {
            if (run_dir(argv[i], &count) != 0) rc = 1;
        } else {
            if (run_file(argv[i]) != 0) rc = 1;
            count++;
        }
    }
    printf("replay: %zu inputs, %s\n", count, rc ? "errors" : "all passed");
    /* An empty corpus replays nothing: treat it as a broken test, not a pass. */
    return rc ? 1 : count ? 0 : 1;
}

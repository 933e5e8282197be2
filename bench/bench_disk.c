/* Disk tier throughput against plain file I/O in the same run: restore (cg_disk_get: preadv +
 * XXH3-128 verify + inventory touch) as a fraction of sequential pread of the same bytes from
 * the same file, cold (after posix_fadvise DONTNEED, residency checked with mincore) and warm;
 * spill (cg_disk_put: XXH3 + pwritev + inventory commit) against sequential pwrite.
 * End to end: the worker engine's restore of each chunk into its RAM pool (a pool miss found
 * on disk: LRU touch, pool insert with its eviction and spill, preadv into the pool's blocks,
 * verify, publish), driven by a one-head KV export, against pread of the same bytes.
 *
 * usage: bench_disk [--dir DIR] [--mib N (512)] [--chunk-tokens T (256)] [--reps R (3)]
 * Geometry: chunkgate-tiny (4 layers, 4 KV heads, head_dim 32, 16-token blocks = 64 KiB). */
#include <errno.h>
#include <fcntl.h>
#include <malloc.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/mman.h>
#include <sys/stat.h>
#include <sys/statfs.h>
#include <unistd.h>

#include "worker/store/disk.h"
#include "worker/serve/engine.h"
#include "worker/model/model.h"
#include "base/base.h"
#include "tests/harness/kv_geom.h"

#define LAYERS 4
#define HEADS 4
#define HD 32
#define BT 16

typedef struct bench {
    const char *dir;
    char blocks_path[512], base_path[512];
    size_t chunk_bytes, n_chunks, total;
    uint32_t chunk_tokens;
    cg_disk *d;
    cg_key *keys;
    uint8_t **src; /* 16 distinct source chunks, reused round-robin */
    uint8_t *dst;
} bench;

typedef struct src_ud {
    const uint8_t *buf;
    size_t block_bytes;
} src_ud;

static const void *src_block(void *ud, uint32_t i)
{
    src_ud *s = ud;
    return s->buf + (size_t)i * s->block_bytes;
}

static cg_key key_of(size_t i)
{
    cg_key k;
    uint64_t a = 0x9e3779b97f4a7c15ull * (i + 1), b = a ^ 0xdeadbeefcafef00dull;
    memcpy(k.b, &a, 8);
    memcpy(k.b + 8, &b, 8);
    return k;
}

static double secs(uint64_t t0)
{
    return (double)(cg_now_ns() - t0) / 1e9;
}

static void die(const char *what)
{
    fprintf(stderr, "bench_disk: %s: %s\n", what, strerror(errno));
    exit(1);
}

static void sync_path(const char *p)
{
    int fd = open(p, O_RDWR);
    if (fd < 0 || fdatasync(fd) != 0) die(p);
    close(fd);
}

/* Drops the file's clean pages from the page cache and returns the fraction still resident
 * (mincore), so the report can say whether the drop took effect. */
static double drop_cache(const char *p)
{
    int fd = open(p, O_RDONLY);
    if (fd < 0) die(p);
    if (fdatasync(fd) != 0) die("fdatasync");
    int rc = posix_fadvise(fd, 0, 0, POSIX_FADV_DONTNEED);
    if (rc != 0) fprintf(stderr, "posix_fadvise: %s\n", strerror(rc));
    struct stat sb;
    if (fstat(fd, &sb) != 0) die("fstat");
    size_t len = (size_t)sb.st_size, page = (size_t)sysconf(_SC_PAGESIZE);
    double frac = 0;
    if (len) {
        void *m = mmap(NULL, len, PROT_READ, MAP_SHARED, fd, 0);
        if (m == MAP_FAILED) die("mmap");
        size_t n = (len + page - 1) / page, res = 0;
        unsigned char *vec = cg_malloc(n);
        if (mincore(m, len, vec) != 0) die("mincore");
        for (size_t i = 0; i < n; i++)
            res += vec[i] & 1;
        frac = (double)res / (double)n;
        free(vec);
        munmap(m, len);
    }
    close(fd);
    return frac;
}

/* ---- the measured operations --------------------------------------------------------------- */

static double run_spill(bench *b)
{
    src_ud s = {NULL, cg_disk_get_params(b->d).block_bytes};
    uint64_t t0 = cg_now_ns();
    for (size_t i = 0; i < b->n_chunks; i++) {
        s.buf = b->src[i % 16];
        if (cg_disk_put(b->d, &b->keys[i], b->chunk_tokens, src_block, &s, i, NULL) != CG_OK) {
            fprintf(stderr, "bench_disk: cg_disk_put failed\n");
            exit(1);
        }
    }
    return secs(t0);
}

static double run_pwrite(bench *b)
{
    int fd = open(b->base_path, O_RDWR | O_CREAT, 0644);
    if (fd < 0) die(b->base_path);
    uint64_t t0 = cg_now_ns();
    for (size_t i = 0; i < b->n_chunks; i++)
        if (pwrite(fd, b->src[i % 16], b->chunk_bytes, (off_t)(i * b->chunk_bytes)) !=
            (ssize_t)b->chunk_bytes)
            die("pwrite");
    double t = secs(t0);
    close(fd);
    return t;
}

static double run_restore(bench *b, const size_t *order)
{
    uint64_t t0 = cg_now_ns();
    for (size_t i = 0; i < b->n_chunks; i++) {
        size_t c = order ? order[i] : i;
        if (cg_disk_get_buf(b->d, &b->keys[c], b->chunk_tokens, b->dst, b->chunk_bytes,
                            1000000 + i) != CG_OK) {
            fprintf(stderr, "bench_disk: cg_disk_get failed\n");
            exit(1);
        }
    }
    return secs(t0);
}

static volatile uint8_t sink;

static double run_pread(bench *b, const size_t *order)
{
    int fd = open(b->blocks_path, O_RDONLY);
    if (fd < 0) die(b->blocks_path);
    uint64_t t0 = cg_now_ns();
    for (size_t i = 0; i < b->n_chunks; i++) {
        size_t c = order ? order[i] : i;
        if (pread(fd, b->dst, b->chunk_bytes, (off_t)(c * b->chunk_bytes)) !=
            (ssize_t)b->chunk_bytes)
            die("pread");
        sink ^= b->dst[i % b->chunk_bytes];
    }
    double t = secs(t0);
    close(fd);
    return t;
}

/* Every chunk through the engine: a one-head export of a chunk that is on disk and not in
 * RAM reads it back into the pool first (the pool holds a few chunks, so each restore evicts
 * an earlier one, whose spill finds it on disk already and only moves its LRU position). */
static double run_engine_restore(bench *b, cg_engine *e)
{
    uint64_t t0 = cg_now_ns();
    for (size_t i = 0; i < b->n_chunks; i++) {
        void *kv = NULL;
        size_t len = 0;
        uint32_t tokens = 0;
        if (cg_engine_chunk_kv(e, &b->keys[i], 0, 0, &kv, &len, &tokens) != CG_OK ||
            tokens != b->chunk_tokens) {
            fprintf(stderr, "bench_disk: engine restore of chunk %zu failed\n", i);
            exit(1);
        }
        sink ^= ((uint8_t *)kv)[i % len];
        free(kv);
    }
    return secs(t0);
}

static double best(double a, double b)
{
    return a < b ? a : b;
}

static double tier_restore(bench *b, void *ctx)
{
    (void)ctx;
    return run_restore(b, NULL);
}

static double engine_restore(bench *b, void *ctx)
{
    return run_engine_restore(b, ctx);
}

/* Rep r with a warm page cache: one pread pass loads the file, then ours(b, ctx) and pread in
 * an order that alternates with r (odd: ours first), so neither side always goes first; keeps
 * the best seconds of each. */
static void warm_pair(bench *b, int r, double (*ours)(bench *, void *), void *ctx,
                      double *best_ours, double *best_pread)
{
    (void)run_pread(b, NULL);
    for (int k = 0; k < 2; k++) {
        if ((k + r) % 2)
            *best_ours = best(*best_ours, ours(b, ctx));
        else
            *best_pread = best(*best_pread, run_pread(b, NULL));
    }
}

static void remove_all(bench *b)
{
    for (size_t i = 0; i < b->n_chunks; i++)
        if (cg_disk_remove(b->d, &b->keys[i]) != CG_OK) {
            fprintf(stderr, "bench_disk: remove failed\n");
            exit(1);
        }
}

static double gbs(size_t bytes, double s)
{
    return (double)bytes / s / 1e9;
}

/* A table of throughputs: the header, then one row per measurement against its baseline. */
static void ratio_head(const char *what, const char *ours, const char *baseline)
{
    printf("\n%-34s %10s %10s %8s\n", what, ours, baseline, "ratio");
}

/* GB/s of `bytes` in s seconds (ours) and base seconds (the baseline), and base / s. */
static void ratio_row(const char *label, size_t bytes, double s, double base)
{
    printf("%-34s %10.2f %10.2f %8.2f\n", label, gbs(bytes, s), gbs(bytes, base), base / s);
}

int main(int argc, char **argv)
{
    bench b = {0};
    size_t mib = 512;
    int reps = 3;
    b.chunk_tokens = 256;
    char tmpl[] = "/var/tmp/cg_bench_disk_XXXXXX";
    for (int i = 1; i + 1 < argc; i += 2) {
        if (strcmp(argv[i], "--dir") == 0)
            b.dir = argv[i + 1];
        else if (strcmp(argv[i], "--mib") == 0)
            mib = (size_t)atol(argv[i + 1]);
        else if (strcmp(argv[i], "--chunk-tokens") == 0)
            b.chunk_tokens = (uint32_t)atol(argv[i + 1]);
        else if (strcmp(argv[i], "--reps") == 0)
            reps = atoi(argv[i + 1]);
        else {
            fprintf(stderr,
                    "usage: bench_disk [--dir DIR] [--mib N] [--chunk-tokens T] [--reps R]\n");
            return 2;
        }
    }
    int made_dir = 0;
    if (!b.dir) {
        if (!mkdtemp(tmpl)) die("mkdtemp");
        b.dir = tmpl;
        made_dir = 1;
    }
    if (mib == 0 || b.chunk_tokens == 0 || reps < 1) return 2;
    cg_log_init("bench_disk", CG_LOG_WARN);

    cg_disk_params p =
        th_disk_params((th_kv_geom){LAYERS, HEADS, HD, BT}, b.dir, "chunkgate-tiny", 0);
    size_t blocks = (b.chunk_tokens + BT - 1) / BT;
    b.chunk_bytes = blocks * p.block_bytes;
    b.n_chunks = (mib << 20) / b.chunk_bytes;
    if (b.n_chunks == 0) b.n_chunks = 1;
    b.total = b.n_chunks * b.chunk_bytes;
    p.capacity_bytes = b.total;
    snprintf(b.blocks_path, sizeof b.blocks_path, "%s/kv.blocks", b.dir);
    snprintf(b.base_path, sizeof b.base_path, "%s/baseline.dat", b.dir);
    if (cg_disk_open(p, &b.d) != CG_OK) {
        fprintf(stderr, "bench_disk: cannot open the disk tier in %s\n", b.dir);
        return 1;
    }
    struct statfs sf;
    if (statfs(b.dir, &sf) != 0) die("statfs");
    printf("dir %s (fs magic 0x%lx%s), %zu chunks x %zu bytes (%u tokens, %zu blocks of %zu) "
           "= %zu MiB, best of %d\n",
           b.dir, (unsigned long)sf.f_type, sf.f_type == 0x01021994 ? " = tmpfs!" : "", b.n_chunks,
           b.chunk_bytes, b.chunk_tokens, blocks, p.block_bytes, b.total >> 20, reps);

    b.keys = cg_malloc(b.n_chunks * sizeof *b.keys);
    for (size_t i = 0; i < b.n_chunks; i++)
        b.keys[i] = key_of(i);
    b.src = cg_malloc(16 * sizeof *b.src);
    uint64_t s = 1;
    for (int i = 0; i < 16; i++) {
        b.src[i] = cg_malloc(b.chunk_bytes);
        for (size_t j = 0; j < b.chunk_bytes; j++) {
            s = s * 6364136223846793005ull + 1442695040888963407ull;
            b.src[i][j] = (uint8_t)(s >> 56);
        }
    }
    b.dst = cg_malloc(b.chunk_bytes);
    size_t *order = cg_malloc(b.n_chunks * sizeof *order);
    for (size_t i = 0; i < b.n_chunks; i++)
        order[i] = i;
    for (size_t i = b.n_chunks - 1; i > 0; i--) {
        s = s * 6364136223846793005ull + 1442695040888963407ull;
        size_t j = (size_t)(s >> 33) % (i + 1), t = order[i];
        order[i] = order[j];
        order[j] = t;
    }

    /* Spill vs pwrite. Each rep rewrites the same file ranges (the disk tier's records are
     * removed, so the next rep takes the same slots again). "+sync" adds the fdatasync that
     * puts the bytes on the device. */
    double sp = 1e30, sps = 1e30, pw = 1e30, pws = 1e30;
    for (int r = 0; r < reps; r++) {
        if (r) remove_all(&b);
        uint64_t t0 = cg_now_ns();
        double t = run_spill(&b);
        sync_path(b.blocks_path);
        sps = best(sps, secs(t0));
        sp = best(sp, t);
        t0 = cg_now_ns();
        t = run_pwrite(&b);
        sync_path(b.base_path);
        pws = best(pws, secs(t0));
        pw = best(pw, t);
    }
    ratio_head("write", "disk GB/s", "pwrite");
    ratio_row("spill vs pwrite (page cache)", b.total, sp, pw);
    ratio_row("spill vs pwrite, + fdatasync", b.total, sps, pws);
    /* The worker spills inside the pool's eviction callback: this is how long one evicted
     * chunk holds the pool lock (page cache; no fdatasync unless the tier's sync is on). */
    printf("%-34s %10.1f us per chunk of %zu bytes\n", "spill (pool lock held)",
           sp / (double)b.n_chunks * 1e6, b.chunk_bytes);

    /* Restore vs pread of the same bytes from the same file. */
    double rc = 1e30, pc = 1e30, rr = 1e30, pr = 1e30, rw = 1e30, pwm = 1e30;
    double res_max = 0;
    /* Each measurement starts from a dropped page cache; odd reps measure the disk tier
     * first, even reps pread first, so neither side always gets the same position. */
    for (int r = 0; r < reps; r++) {
        for (int k = 0; k < 4; k++) {
            int disk_side = (k + r) % 2, shuffled = k / 2;
            const size_t *ord = shuffled ? order : NULL;
            double f = drop_cache(b.blocks_path);
            res_max = f > res_max ? f : res_max;
            double t = disk_side ? run_restore(&b, ord) : run_pread(&b, ord);
            if (shuffled)
                *(disk_side ? &rr : &pr) = best(*(disk_side ? &rr : &pr), t);
            else
                *(disk_side ? &rc : &pc) = best(*(disk_side ? &rc : &pc), t);
        }
        /* Warm: the file is in the page cache after one more pass. */
        warm_pair(&b, r, tier_restore, NULL, &rw, &pwm);
    }
    ratio_head("read", "disk GB/s", "pread");
    ratio_row("restore, cold, in slot order", b.total, rc, pc);
    ratio_row("restore, cold, shuffled chunks", b.total, rr, pr);
    ratio_row("restore, warm page cache", b.total, rw, pwm);
    printf("\nposix_fadvise(DONTNEED): at most %.1f%% of kv.blocks resident right after it "
           "(mincore) -> %s\n",
           100.0 * res_max, res_max < 0.05 ? "took effect" : "did NOT fully take effect");

    cg_disk_stats st = cg_disk_get_stats(b.d);
    printf("stats: spills %llu, restores %llu, checksum failures %llu, bytes written %llu, "
           "bytes read %llu\n",
           (unsigned long long)st.spills, (unsigned long long)st.restores,
           (unsigned long long)st.checksum_failures, (unsigned long long)st.bytes_written,
           (unsigned long long)st.bytes_read);
    cg_disk_close(&b.d);

    /* End to end through the engine, on the same records (the engine opens the same
     * directory; the generated model has the tier's geometry and model id). */
    char mdir[600], err[256];
    snprintf(mdir, sizeof mdir, "%s/model", b.dir);
    cg_model *m = NULL;
    cg_engine *e = NULL;
    if (cg_model_generate(mdir, cg_model_gen_default_params(), err, sizeof err) != CG_OK ||
        cg_model_open(mdir, &m, err, sizeof err) != CG_OK) {
        fprintf(stderr, "bench_disk: model: %s\n", err);
        return 1;
    }
    /* The export's buffer (one head of a chunk) would be mmapped and unmapped by every call:
     * its page faults are not the restore's cost. */
    mallopt(M_MMAP_THRESHOLD, 64 << 20);
    mallopt(M_TRIM_THRESHOLD, 128 << 20);
    cg_engine_params ep = cg_engine_default_params();
    ep.block_tokens = BT;
    ep.pool_bytes = 4 * b.chunk_bytes;
    ep.disk_bytes = b.total;
    ep.disk_dir = b.dir;
    if (cg_engine_open(m, ep, &e) != CG_OK) {
        fprintf(stderr, "bench_disk: cannot open the engine on %s\n", b.dir);
        return 1;
    }
    double ec = 1e30, epc = 1e30, ew = 1e30, epw = 1e30;
    for (int r = 0; r < reps; r++) {
        for (int k = 0; k < 2; k++) {
            int disk_side = (k + r) % 2;
            drop_cache(b.blocks_path);
            if (disk_side)
                ec = best(ec, run_engine_restore(&b, e));
            else
                epc = best(epc, run_pread(&b, NULL));
        }
        warm_pair(&b, r, engine_restore, e, &ew, &epw);
    }
    cg_engine_stats es = cg_engine_get_stats(e);
    ratio_head("restore into the RAM pool", "engine GB/s", "pread");
    ratio_row("engine restore, cold, slot order", b.total, ec, epc);
    ratio_row("engine restore, warm page cache", b.total, ew, epw);
    printf("%-34s %10.1f us cold, %.1f us warm per chunk\n", "engine restore",
           ec / (double)b.n_chunks * 1e6, ew / (double)b.n_chunks * 1e6);
    printf("engine: restores %llu, restore failures %llu, spills %llu (already on disk: LRU "
           "touch only)\n",
           (unsigned long long)es.restores, (unsigned long long)es.restore_failures,
           (unsigned long long)es.spills);
    cg_engine_close(&e);
    cg_model_close(&m);
    {
        char pth[700];
        static const char *mf[] = {"config.json", "model.safetensors"};
        for (int i = 0; i < 2; i++) {
            snprintf(pth, sizeof pth, "%s/%s", mdir, mf[i]);
            unlink(pth);
        }
        rmdir(mdir);
    }
    for (int i = 0; i < 16; i++)
        free(b.src[i]);
    free(b.src);
    free(b.keys);
    free(b.dst);
    free(order);
    unlink(b.base_path);
    if (made_dir) {
        char pth[600];
        static const char *names[] = {"kv.blocks", "kv.db", "kv.db-wal", "kv.db-shm"};
        for (int i = 0; i < 4; i++) {
            snprintf(pth, sizeof pth, "%s/%s", b.dir, names[i]);
            unlink(pth);
        }
        rmdir(b.dir);
    }
    return 0;
}

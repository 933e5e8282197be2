/* Benchmark of the SQLite chunk index: insert rate through the writer, batched lookups (hits
 * and misses) on 1 and 2 threads against an in-memory hash of the same keys, and update rate
 * through the writer queue, alone and with concurrent lookups. Results: bench/README.md ("SQLite
 * index"). */
#include <pthread.h>
#include <stdatomic.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <unistd.h>

#include "base/base.h"
#include "sql/index.h"
#include "tests/harness/harness.h"

typedef struct opts {
    long chunks;  /* rows in the index */
    int batch;    /* keys per lookup (a RAG request's segments) */
    int hit_pct;  /* share of looked-up keys that exist */
    long lookups; /* lookup batches per measured run */
    long updates; /* requests in the update phase (2 ops per key) */
    long inserts; /* random-order inserts into the full index */
    long mmap_mib;
    long batch_max;  /* writer ops per transaction; -1: default */
    long ckpt;       /* wal_autocheckpoint pages; -1: default */
    const char *dir; /* NULL: a fresh mkdtemp directory, removed at the end */
    int keep;        /* keep the index file (and reuse it when it already holds the rows) */
} opts;

/* Key i: 16 random-looking bytes, like an XXH3-128 key. Keys >= chunks are misses. */
static cg_key key_of(uint64_t i)
{
    return th_key_of(i, 12345);
}

static double secs(uint64_t ns)
{
    return (double)ns / 1e9;
}

/* ---- baseline: open-addressing hash of the same keys in memory ------------------------------ */

typedef struct hslot {
    cg_key key;
    uint32_t val; /* id + 1; 0 = empty */
} hslot;

typedef struct hmap {
    hslot *s;
    uint64_t mask;
} hmap;

static uint64_t hkey(const cg_key *k)
{
    uint64_t h;
    memcpy(&h, k->b, 8); /* keys are hashes already */
    return h;
}

static void hmap_build(hmap *m, long n)
{
    uint64_t cap = 1;
    while (cap < (uint64_t)n * 2)
        cap <<= 1;
    m->s = cg_calloc(cap, sizeof *m->s);
    m->mask = cap - 1;
    for (long i = 0; i < n; i++) {
        cg_key k = key_of((uint64_t)i);
        uint64_t j = hkey(&k) & m->mask;
        while (m->s[j].val)
            j = (j + 1) & m->mask;
        m->s[j].key = k;
        m->s[j].val = (uint32_t)i + 1;
    }
}

static long hmap_get(const hmap *m, const cg_key *k)
{
    uint64_t j = hkey(k) & m->mask;
    while (m->s[j].val) {
        if (memcmp(m->s[j].key.b, k->b, 16) == 0) return (long)m->s[j].val - 1;
        j = (j + 1) & m->mask;
    }
    return -1;
}

typedef struct hash_job {
    const hmap *m;
    const cg_key *keys;
    long n, found;
} hash_job;

static void *hash_run(void *arg)
{
    hash_job *j = arg;
    for (long i = 0; i < j->n; i++)
        j->found += hmap_get(j->m, &j->keys[i]) >= 0;
    return NULL;
}

/* ---- lookup runs ---------------------------------------------------------------------------- */

typedef struct lookup_job {
    cg_index *ix;
    const cg_key *keys; /* batches * batch keys */
    long batches;
    int batch;
    uint64_t *lat_ns; /* per batch, may be NULL */
    long found;
    int failed;
    atomic_int *stop; /* NULL: run all batches; else loop until set */
    long done;
} lookup_job;

static void *lookup_run(void *arg)
{
    lookup_job *j = arg;
    cg_index_entry *e = cg_malloc((size_t)j->batch * sizeof *e);
    for (long b = 0;; b++) {
        if (j->stop ? atomic_load(j->stop) : b >= j->batches) break;
        long bi = b % j->batches;
        uint64_t t0 = cg_now_ns();
        if (cg_index_lookup(j->ix, j->keys + bi * j->batch, (size_t)j->batch, e) != CG_OK) {
            j->failed = 1;
            break;
        }
        if (j->lat_ns) j->lat_ns[b] = cg_now_ns() - t0;
        for (int i = 0; i < j->batch; i++)
            j->found += e[i].found;
        j->done++;
    }
    cg_free(&e);
    return NULL;
}

static int cmp_u64(const void *a, const void *b)
{
    uint64_t x = *(const uint64_t *)a, y = *(const uint64_t *)b;
    return x < y ? -1 : x > y;
}

/* Runs lookups on nthreads threads over disjoint slices of keys; returns batches/s. */
static double run_lookups(cg_index *ix, const cg_key *keys, long batches, int batch, int nthreads,
                          long *found, uint64_t *p50, uint64_t *p99)
{
    lookup_job jobs[8];
    pthread_t th[8];
    uint64_t *lat = cg_malloc((size_t)batches * sizeof *lat);
    long per = batches / nthreads;
    uint64_t t0 = cg_now_ns();
    for (int t = 0; t < nthreads; t++) {
        jobs[t] = (lookup_job){.ix = ix,
                               .keys = keys + (size_t)(t * per) * (size_t)batch,
                               .batches = per,
                               .batch = batch,
                               .lat_ns = lat + t * per};
        pthread_create(&th[t], NULL, lookup_run, &jobs[t]);
    }
    *found = 0;
    for (int t = 0; t < nthreads; t++) {
        pthread_join(th[t], NULL);
        *found += jobs[t].found;
        if (jobs[t].failed) {
            fprintf(stderr, "lookup failed\n");
            exit(1);
        }
    }
    uint64_t dt = cg_now_ns() - t0;
    long n = per * nthreads;
    qsort(lat, (size_t)n, sizeof *lat, cmp_u64);
    *p50 = lat[n / 2];
    *p99 = lat[n * 99 / 100];
    cg_free(&lat);
    return (double)n / secs(dt);
}

/* ---- phases --------------------------------------------------------------------------------- */

static void must(cg_status st, const char *what)
{
    if (st != CG_OK) {
        fprintf(stderr, "%s: %s\n", what, cg_status_name(st));
        exit(1);
    }
}

typedef struct idkey {
    cg_key key;
    uint64_t id;
} idkey;

static int cmp_idkey(const void *a, const void *b)
{
    return memcmp(((const idkey *)a)->key.b, ((const idkey *)b)->key.b, 16);
}

/* Inserts ids [from, to) through the writer: chunk_seen + placement_set per chunk. sorted = 1
 * inserts in key order (a bulk load: B-tree pages fill left to right, each written about
 * once); sorted = 0 in id order, which is random key order (what live traffic does). */
static void populate(cg_index *ix, const int64_t *w, long from, long to, int sorted)
{
    cg_index_stats s0, s1;
    long n = to - from;
    idkey *ord = cg_malloc((size_t)n * sizeof *ord);
    for (long i = 0; i < n; i++) {
        ord[i].id = (uint64_t)(from + i);
        ord[i].key = key_of(ord[i].id);
    }
    uint64_t t0 = cg_now_ns();
    if (sorted) qsort(ord, (size_t)n, sizeof *ord, cmp_idkey);
    double sort_s = secs(cg_now_ns() - t0);
    must(cg_index_stats_get(ix, &s0), "stats");
    t0 = cg_now_ns();
    for (long j = 0; j < n; j++) {
        long i = (long)ord[j].id;
        cg_key k = ord[j].key;
        cg_index_chunk_seen(ix, &k, "bench-model", CG_MODE_STRICT, 1000 + i % 3000, 1700000000000);
        cg_index_placement_set(ix, &k, w[i % 4], i % 5 ? CG_TIER_RAM : CG_TIER_DISK, 200 + i % 700,
                               1700000000000);
        /* stay under the queue cap so nothing is dropped; the writer is the bottleneck */
        if ((j + 1) % 200000 == 0) must(cg_index_flush(ix), "flush");
    }
    must(cg_index_flush(ix), "flush");
    uint64_t dt = cg_now_ns() - t0;
    cg_free(&ord);
    must(cg_index_stats_get(ix, &s1), "stats");
    uint64_t ops = s1.ops_applied - s0.ops_applied, batches = s1.batches - s0.batches;
    if (sorted) printf("(keys sorted in %.1f s, not counted)\n", sort_s);
    printf("insert %s: %ld new chunks (chunk_seen + placement_set = %llu ops) in %.1f s: "
           "%.0f chunks/s, %.0f ops/s, %llu batches (%.0f ops/batch), dropped %llu, failed %llu\n",
           sorted ? "bulk, key order" : "random key order", n, (unsigned long long)ops, secs(dt),
           n / secs(dt), ops / secs(dt), (unsigned long long)batches,
           batches ? (double)ops / batches : 0.0,
           (unsigned long long)(s1.ops_dropped - s0.ops_dropped),
           (unsigned long long)(s1.ops_failed - s0.ops_failed));
}

/* Request-shaped updates: per key chunk_seen + chunk_hit, batch keys per request. */
static void updates(cg_index *ix, const opts *o, int with_reader, const cg_key *rkeys,
                    long rbatches)
{
    cg_index_stats s0, s1;
    must(cg_index_stats_get(ix, &s0), "stats");
    atomic_int stop = 0;
    lookup_job job = {
        .ix = ix, .keys = rkeys, .batches = rbatches, .batch = o->batch, .stop = &stop};
    pthread_t th;
    if (with_reader) pthread_create(&th, NULL, lookup_run, &job);
    uint64_t s = 99, enq_ns = 0, t0 = cg_now_ns();
    long nops = 0;
    for (long r = 0; r < o->updates; r++) {
        cg_key keys[64];
        for (int i = 0; i < o->batch; i++)
            keys[i] = key_of(th_splitmix64(&s) % (uint64_t)o->chunks);
        uint64_t e0 = cg_now_ns();
        for (int i = 0; i < o->batch; i++) {
            cg_index_chunk_seen(ix, &keys[i], "bench-model", CG_MODE_STRICT, 1000, 1700000001000);
            cg_index_chunk_hit(ix, &keys[i], 1700000001000);
        }
        enq_ns += cg_now_ns() - e0;
        nops += 2 * o->batch;
        if ((r + 1) % 20000 == 0) must(cg_index_flush(ix), "flush");
    }
    must(cg_index_flush(ix), "flush");
    uint64_t dt = cg_now_ns() - t0;
    if (with_reader) {
        atomic_store(&stop, 1);
        pthread_join(th, NULL);
    }
    must(cg_index_stats_get(ix, &s1), "stats");
    uint64_t ops = s1.ops_applied - s0.ops_applied, batches = s1.batches - s0.batches;
    printf("updates%s: %ld requests x %d keys x (seen + hit) = %llu ops applied in %.2f s: "
           "%.0f ops/s, %.0f requests/s; enqueue %.0f ns/op on the caller; %llu batches "
           "(%.0f ops/batch); dropped %llu\n",
           with_reader ? " (with 1 lookup thread)" : "", o->updates, o->batch,
           (unsigned long long)ops, secs(dt), ops / secs(dt), o->updates / secs(dt),
           (double)enq_ns / (double)nops, (unsigned long long)batches,
           batches ? (double)ops / batches : 0.0,
           (unsigned long long)(s1.ops_dropped - s0.ops_dropped));
    if (with_reader)
        printf("  concurrent lookups: %.0f batches/s of %d keys (%.0f keys/s)\n",
               job.done / secs(dt), o->batch, job.done * o->batch / secs(dt));
    if (ops != (uint64_t)nops) {
        fprintf(stderr, "expected %ld applied ops\n", nops);
        exit(1);
    }
}

static void usage(void)
{
    fprintf(stderr,
            "usage: bench_index [--chunks N] [--batch B] [--hit-pct P] [--lookups L]\n"
            "                   [--updates U] [--mmap-mib M] [--dir DIR] [--keep]\n"
            "  --chunks N   rows in the index (default 1000000; 10000000 for the large run)\n"
            "  --batch B    keys per lookup request (default 8, max 64)\n"
            "  --hit-pct P  percent of looked-up keys that exist (default 75)\n"
            "  --lookups L  lookup requests per measured run (default 200000)\n"
            "  --updates U  requests in the update phase (default 50000)\n"
            "  --inserts I  random-order inserts into the full index (default 200000)\n"
            "  --mmap-mib M PRAGMA mmap_size in MiB (default: cg_index_default_params)\n"
            "  --batch-max K, --checkpoint P  writer ops per transaction, wal_autocheckpoint\n"
            "  --dir DIR    put bench.db in DIR; with --keep it is kept and reused\n");
    exit(2);
}

int main(int argc, char **argv)
{
    opts o = {.chunks = 1000000,
              .batch = 8,
              .hit_pct = 75,
              .lookups = 200000,
              .updates = 50000,
              .inserts = 200000,
              .mmap_mib = -1,
              .batch_max = -1,
              .ckpt = -1};
    const th_opt opt[] = {{"--keep", TH_OPT_FLAG, &o.keep},
                          {"--chunks", TH_OPT_LONG, &o.chunks},
                          {"--batch", TH_OPT_INT, &o.batch},
                          {"--hit-pct", TH_OPT_INT, &o.hit_pct},
                          {"--lookups", TH_OPT_LONG, &o.lookups},
                          {"--updates", TH_OPT_LONG, &o.updates},
                          {"--inserts", TH_OPT_LONG, &o.inserts},
                          {"--mmap-mib", TH_OPT_LONG, &o.mmap_mib},
                          {"--batch-max", TH_OPT_LONG, &o.batch_max},
                          {"--checkpoint", TH_OPT_LONG, &o.ckpt},
                          {"--dir", TH_OPT_STR, &o.dir}};
    if (th_parse_opts(argc, argv, opt, CG_ARRAY_LEN(opt)) != 0) usage();
    if (o.chunks < 1 || o.chunks > 2000000000 || o.batch < 1 || o.batch > 64 || o.hit_pct < 0 ||
        o.hit_pct > 100 || o.lookups < 100 || o.updates < 1 || o.inserts < 1)
        usage();
    cg_log_init("bench_index", CG_LOG_WARN);
    setvbuf(stdout, NULL, _IOLBF, 0); /* progress is visible when run in the background */

    char dir[256], path[300];
    if (o.dir) {
        snprintf(dir, sizeof dir, "%s", o.dir);
        mkdir(dir, 0755);
    } else {
        snprintf(dir, sizeof dir, "/tmp/cg_bench_index_XXXXXX");
        if (!mkdtemp(dir)) return 1;
    }
    snprintf(path, sizeof path, "%s/bench.db", dir);
    if (!o.keep) unlink(path);

    cg_index_params p = cg_index_default_params();
    if (o.mmap_mib >= 0) p.mmap_bytes = (int64_t)o.mmap_mib << 20;
    if (o.batch_max > 0) p.batch_max = (size_t)o.batch_max;
    if (o.ckpt >= 0) p.wal_autocheckpoint = (int)o.ckpt;
    printf("bench_index: chunks %ld, batch %d keys, hits %d%%, lookups %ld, updates %ld, "
           "read_conns %d, batch_max %zu, wal_autocheckpoint %d, mmap %lld MiB, file %s\n",
           o.chunks, o.batch, o.hit_pct, o.lookups, o.updates, p.read_conns, p.batch_max,
           p.wal_autocheckpoint, (long long)(p.mmap_bytes >> 20), path);

    cg_index *ix = NULL;
    must(cg_index_open(path, p, &ix), "open");
    int64_t w[4];
    for (int i = 0; i < 4; i++) {
        char url[64];
        snprintf(url, sizeof url, "http://worker%d:8000", i);
        must(cg_index_worker_add(ix, url, "bench-model", 1700000000000, &w[i]), "worker_add");
    }
    cg_index_stats st;
    must(cg_index_stats_get(ix, &st), "stats");
    if (st.chunks > o.chunks) {
        fprintf(stderr, "%s holds %lld chunks, more than --chunks\n", path, (long long)st.chunks);
        return 1;
    }
    if (st.chunks > 0) printf("reusing %lld chunks already in %s\n", (long long)st.chunks, path);
    /* rows are inserted in key-id order, so an existing file holds ids [0, st.chunks) */
    if (st.chunks < o.chunks) populate(ix, w, st.chunks, o.chunks, 1);
    must(cg_index_stats_get(ix, &st), "stats");
    printf("index: %lld chunks, %lld placements, file %.1f MiB (%.0f bytes/chunk)\n",
           (long long)st.chunks, (long long)st.placements, st.file_bytes / 1048576.0,
           (double)st.file_bytes / (double)st.chunks);

    /* Let the kernel write the load back now, so writeback does not steal CPU from the
     * measured reads (this machine has 2 vCPUs). */
    sync();

    /* Request keys: hit_pct% existing ids, the rest ids past the end (misses). */
    long nkeys = o.lookups * o.batch;
    cg_key *keys = cg_malloc((size_t)nkeys * sizeof *keys);
    uint64_t s = 7;
    long want_found = 0;
    for (long i = 0; i < nkeys; i++) {
        int hit = (long)(th_splitmix64(&s) % 100) < o.hit_pct;
        uint64_t id = th_splitmix64(&s) % (uint64_t)o.chunks;
        keys[i] = key_of(hit ? id : (uint64_t)o.chunks + id);
        want_found += hit;
    }

    /* Baseline: the same batches against an in-memory hash (the floor a lookup could cost). */
    hmap m;
    uint64_t t0 = cg_now_ns();
    hmap_build(&m, o.chunks);
    double build_s = secs(cg_now_ns() - t0);
    double hash_bps[3];
    for (int nt = 1; nt <= 2; nt++) {
        hash_job hj[2];
        pthread_t th[2];
        long per = nkeys / nt;
        t0 = cg_now_ns();
        for (int t = 0; t < nt; t++) {
            hj[t] = (hash_job){.m = &m, .keys = keys + t * per, .n = per};
            pthread_create(&th[t], NULL, hash_run, &hj[t]);
        }
        long hfound = 0;
        for (int t = 0; t < nt; t++) {
            pthread_join(th[t], NULL);
            hfound += hj[t].found;
        }
        hash_bps[nt] = (double)(per * nt / o.batch) / secs(cg_now_ns() - t0);
        if (nt == 1 && hfound != want_found) {
            fprintf(stderr, "hash baseline found %ld, expected %ld\n", hfound, want_found);
            return 1;
        }
        printf("baseline in-memory hash, %d thread%s: %.0f batches/s (%.0f keys/s)%s\n", nt,
               nt > 1 ? "s" : "", hash_bps[nt], hash_bps[nt] * o.batch,
               nt == 1 ? "" : " (2-thread/1-thread shows what this machine's cores give)");
    }
    printf("hash built in %.1f s\n", build_s);
    cg_free(&m.s);

    /* Warm the read connections and the page cache, then measure. */
    long found;
    uint64_t p50, p99;
    (void)run_lookups(ix, keys, o.lookups / 10, o.batch, 2, &found, &p50, &p99);
    for (int nt = 1; nt <= 2; nt++) {
        double bps = run_lookups(ix, keys, o.lookups, o.batch, nt, &found, &p50, &p99);
        long per = o.lookups / nt * nt;
        printf("lookup %d thread%s: %.0f batches/s of %d keys = %.0f keys/s; batch latency "
               "p50 %.1f us, p99 %.1f us; hash/index = %.1fx; found %ld of %ld keys\n",
               nt, nt > 1 ? "s" : "", bps, o.batch, bps * o.batch, p50 / 1e3, p99 / 1e3,
               hash_bps[nt] / bps, found, per * o.batch);
        if (nt == 1 && found != want_found) {
            fprintf(stderr, "index found %ld keys, expected %ld\n", found, want_found);
            return 1;
        }
    }

    updates(ix, &o, 0, keys, o.lookups);
    updates(ix, &o, 1, keys, o.lookups);
    /* Live-traffic inserts: new random keys into the full index (ids past the miss range).
     * They are deleted again so that a kept file still holds exactly ids [0, chunks). */
    long extra = o.inserts;
    populate(ix, w, 2 * o.chunks, 2 * o.chunks + extra, 0);
    for (long i = 0; i < extra; i++) {
        cg_key k = key_of((uint64_t)(2 * o.chunks + i));
        cg_index_chunk_delete(ix, &k);
    }
    must(cg_index_flush(ix), "flush");

    cg_free(&keys);
    uint64_t c0 = cg_now_ns();
    cg_index_close(&ix);
    printf("close (drain + checkpoint): %.2f s\n", secs(cg_now_ns() - c0));
    if (!o.keep) {
        unlink(path);
        if (!o.dir) rmdir(dir);
    }
    return 0;
}

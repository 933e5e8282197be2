/* Fuzz target for the worker's disk-tier reader (worker/store/disk.c + sql/kvstore.c).
 * A small valid tier is written once (8 records of 1..3 blocks in 24 slots); each input is a
 * list of edits, applied, then every record is read back, then the tier is restored.
 * Input: [flags][op, off lo, off hi, len, bytes[len]]... (at most 32 ops); op % 4:
 *  0: write the bytes into kv.blocks at off (mod the file size);
 *  1: XOR them in;
 *  2: truncate kv.blocks to off (mod the file size);
 *  3: forge an inventory row (needs a reopen, done when any op 3 is present): key = 16 bytes
 *     of the data, n_tokens = off % 16 + 1, slots from the data bytes (may be out of range or
 *     overlap real records); off bits: 0x100 one slot too many, 0x200 another model, 0x400 the
 *     checksum of record (len % 8), 0x800 also its length and bytes copied into the slots;
 *     else the checksum is bytes 32..47 of the data (zeros when shorter).
 * flags bit 0: close and reopen the tier after the edits (its open-time validation runs).
 * Invariants: a record read either fails (CG_E_IO: checksum or short read, then it is gone)
 * or returns exactly the bytes written; a forged row is never served; cg_disk_check passes
 * after every input; the restored tier reads back whole. Never corrupt data, never a crash. */
#include "fuzz_common.h"

#include <fcntl.h>
#include <sys/stat.h>
#include <unistd.h>

#include "worker/store/disk.h"
#include "base/base.h"
#include "sql/kvstore.h"
#include "tests/harness/kv_geom.h"

#define LAYERS 1
#define HEADS 2
#define HD 4
#define BT 4
#define BB ((size_t)HEADS * LAYERS * 2 * BT * HD * sizeof(float))
#define SLOTS 24
#define MODEL "fuzz-model"
#define N_REC 8
#define MAX_OPS 32

static const uint32_t TOKENS[N_REC] = {1, 4, 5, 8, 9, 12, 3, 7};

static char g_dir[200], g_blocks[260], g_db[260];
static cg_disk *g_disk;
static cg_key g_keys[N_REC];
static uint8_t *g_bytes[N_REC];     /* what each record holds */
static uint8_t g_clean[SLOTS * BB]; /* kv.blocks of the intact tier */
static uint64_t g_now = 1;

static size_t chunk_bytes(uint32_t n_tokens)
{
    return (size_t)((n_tokens + BT - 1) / BT) * BB;
}

static uint64_t splitmix(uint64_t *s)
{
    uint64_t z = (*s += 0x9e3779b97f4a7c15ull);
    z = (z ^ (z >> 30)) * 0xbf58476d1ce4e5b9ull;
    z = (z ^ (z >> 27)) * 0x94d049bb133111ebull;
    return z ^ (z >> 31);
}

static cg_disk_params params(void)
{
    return th_disk_params((th_kv_geom){LAYERS, HEADS, HD, BT}, g_dir, MODEL, SLOTS * BB);
}

typedef struct src {
    const uint8_t *buf;
} src;

static const void *src_block(void *ud, uint32_t i)
{
    return ((src *)ud)->buf + (size_t)i * BB;
}

static void put(int i)
{
    src s = {g_bytes[i]};
    FUZZ_CHECK(cg_disk_put(g_disk, &g_keys[i], TOKENS[i], src_block, &s, g_now++, NULL) == CG_OK);
}

static void open_disk(void)
{
    FUZZ_CHECK(cg_disk_open(params(), &g_disk) == CG_OK);
}

static void read_blocks(uint8_t *out)
{
    int fd = open(g_blocks, O_RDONLY | O_CLOEXEC);
    FUZZ_CHECK(fd >= 0 && pread(fd, out, SLOTS * BB, 0) == (ssize_t)(SLOTS * BB));
    close(fd);
}

static void write_blocks(const uint8_t *in)
{
    int fd = open(g_blocks, O_WRONLY | O_CLOEXEC);
    FUZZ_CHECK(fd >= 0 && ftruncate(fd, SLOTS * BB) == 0);
    FUZZ_CHECK(pwrite(fd, in, SLOTS * BB, 0) == (ssize_t)(SLOTS * BB));
    close(fd);
}

static void cleanup(void)
{
    static const char *const names[] = {"kv.blocks", "kv.db", "kv.db-wal", "kv.db-shm"};
    cg_disk_close(&g_disk);
    for (size_t i = 0; i < CG_ARRAY_LEN(names); i++) {
        char p[300];
        snprintf(p, sizeof p, "%s/%s", g_dir, names[i]);
        unlink(p);
    }
    rmdir(g_dir);
}

int LLVMFuzzerInitialize(int *argc, char ***argv)
{
    const char *tmp = access("/dev/shm", W_OK) == 0 ? "/dev/shm" : "/tmp";
    cg_log_init("fuzz_disk", (cg_log_level)(CG_LOG_ERROR + 1));
    snprintf(g_dir, sizeof g_dir, "%s/cg_fuzz_disk_XXXXXX", tmp);
    if (!mkdtemp(g_dir)) abort();
    snprintf(g_blocks, sizeof g_blocks, "%s/kv.blocks", g_dir);
    snprintf(g_db, sizeof g_db, "%s/kv.db", g_dir);
    atexit(cleanup);
    uint64_t s = 42;
    for (int i = 0; i < N_REC; i++) {
        uint64_t a = splitmix(&s), b = splitmix(&s);
        memcpy(g_keys[i].b, &a, 8);
        memcpy(g_keys[i].b + 8, &b, 8);
        size_t n = chunk_bytes(TOKENS[i]);
        g_bytes[i] = malloc(n);
        if (!g_bytes[i]) abort();
        for (size_t k = 0; k < n; k += 8) {
            uint64_t v = splitmix(&s);
            memcpy(g_bytes[i] + k, &v, 8);
        }
    }
    open_disk();
    for (int i = 0; i < N_REC; i++)
        put(i);
    read_blocks(g_clean);
    return 0;
}

typedef struct victim {
    const cg_key *key;
    int found;
    uint8_t sum[CG_KVSTORE_SUM_BYTES];
    uint32_t slots[8], n_slots;
} victim;

static int find_victim(void *ud, const cg_kvstore_row *row)
{
    victim *v = ud;
    if (!cg_key_equal(&row->key, v->key) || row->n_slots > 8) return 0;
    v->found = 1;
    memcpy(v->sum, row->checksum, sizeof v->sum);
    memcpy(v->slots, row->slots, row->n_slots * sizeof *row->slots);
    v->n_slots = row->n_slots;
    return 1;
}

/* Forges one inventory row through a second connection while the tier is closed. Returns 1
 * and the key when the row went in (0 when its key already had one). */
static int forge(cg_kvstore *kv, uint16_t off, const uint8_t *b, size_t len, cg_key *key_out)
{
    cg_key k;
    memset(&k, 0, sizeof k);
    memcpy(k.b, b, CG_MIN(len, sizeof k.b));
    k.b[15] ^= 0xA5;
    uint32_t slots[9], n_tokens = off % 16 + 1;
    uint32_t n_slots = (n_tokens + BT - 1) / BT;
    for (uint32_t i = 0; i < n_slots; i++)
        slots[i] = len > 16 + i ? b[16 + i] % (SLOTS + 4) : i; /* out of range sometimes */
    cg_kvstore_row row;
    memset(&row, 0, sizeof row);
    row.n_tokens = n_tokens;
    row.slots = slots;
    row.n_slots = n_slots;
    if (off & 0x100) slots[row.n_slots++] = 0; /* one slot too many for n_tokens */
    row.model = (off & 0x200) ? "other-model" : MODEL;
    if (len >= 48) memcpy(row.checksum, b + 32, sizeof row.checksum);
    if (off & 0x400) {
        /* a real record's checksum; with 0x800 also its length, and its bytes copied into the
         * forged row's slots: the checksum covers the key, so the copy must still fail */
        int vi = (int)(len % N_REC);
        victim v = {.key = &g_keys[vi]};
        FUZZ_CHECK(cg_kvstore_load(kv, find_victim, &v) == CG_OK);
        if (v.found) memcpy(row.checksum, v.sum, sizeof row.checksum);
        if (v.found && (off & 0x800)) {
            row.n_tokens = TOKENS[vi];
            row.n_slots = (TOKENS[vi] + BT - 1) / BT;
            int fd = open(g_blocks, O_RDWR | O_CLOEXEC);
            FUZZ_CHECK(fd >= 0);
            for (uint32_t i = 0; i < row.n_slots; i++) {
                slots[i] = len > 16 + i ? b[16 + i] % (SLOTS + 4) : SLOTS - 1 - i;
                if (slots[i] < SLOTS)
                    FUZZ_CHECK(pwrite(fd, g_bytes[vi] + (size_t)i * BB, BB,
                                      (off_t)slots[i] * (off_t)BB) == (ssize_t)BB);
            }
            close(fd);
        }
    }
    row.key = k;
    row.last_used = g_now++;
    *key_out = k;
    cg_status st = cg_kvstore_put(kv, &row);
    FUZZ_CHECK(st == CG_OK || st == CG_E_CONFLICT);
    return st == CG_OK;
}

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size)
{
    fuzz_in in = {data, size};
    uint8_t flags = fuzz_u8(&in);
    cg_key forged[MAX_OPS];
    size_t n_forged = 0;
    int reopen = flags & 1;

    /* 1. edit kv.blocks, and collect the rows to forge */
    int fd = open(g_blocks, O_RDWR | O_CLOEXEC);
    FUZZ_CHECK(fd >= 0);
    struct {
        uint16_t off;
        const uint8_t *b;
        size_t len;
    } rows[MAX_OPS];
    size_t n_rows = 0;
    for (int op_i = 0; op_i < MAX_OPS && in.n; op_i++) {
        uint8_t op = fuzz_u8(&in);
        uint16_t off = (uint16_t)fuzz_u16(&in);
        size_t len;
        const uint8_t *b = fuzz_bytes(&in, fuzz_u8(&in), &len);
        size_t at = off % (SLOTS * BB);
        switch (op % 4) {
        case 0:
            len = CG_MIN(len, SLOTS * BB - at);
            FUZZ_CHECK(pwrite(fd, b, len, (off_t)at) == (ssize_t)len);
            break;
        case 1: {
            uint8_t x[256];
            len = CG_MIN(len, SLOTS * BB - at);
            FUZZ_CHECK(pread(fd, x, len, (off_t)at) >= 0);
            for (size_t i = 0; i < len; i++)
                x[i] ^= b[i];
            FUZZ_CHECK(pwrite(fd, x, len, (off_t)at) == (ssize_t)len);
            break;
        }
        case 2:
            FUZZ_CHECK(ftruncate(fd, (off_t)at) == 0);
            break;
        default:
            rows[n_rows].off = off;
            rows[n_rows].b = b;
            rows[n_rows++].len = len;
            reopen = 1;
        }
    }
    close(fd);
    if (reopen) {
        if (n_rows) {
            cg_kvstore *kv = NULL;
            FUZZ_CHECK(cg_kvstore_open(g_db, 0, &kv) == CG_OK);
            for (size_t i = 0; i < n_rows; i++)
                n_forged +=
                    (size_t)forge(kv, rows[i].off, rows[i].b, rows[i].len, &forged[n_forged]);
            cg_kvstore_close(&kv);
        }
        cg_disk_close(&g_disk);
        open_disk();
    }

    /* 2. read everything: intact or refused, never wrong */
    for (int i = 0; i < N_REC; i++) {
        cg_disk_chunk_info info;
        if (cg_disk_peek(g_disk, &g_keys[i], &info) != CG_OK) {
            FUZZ_CHECK(n_forged > 0); /* only a forged overlapping row makes open drop one */
            continue;
        }
        FUZZ_CHECK(info.tokens == TOKENS[i]);
        size_t n = chunk_bytes(TOKENS[i]);
        uint8_t *buf = malloc(n);
        if (!buf) abort();
        cg_status st = cg_disk_get_buf(g_disk, &g_keys[i], TOKENS[i], buf, n, g_now++);
        FUZZ_CHECK(st == CG_OK || st == CG_E_IO);
        if (st == CG_OK)
            FUZZ_CHECK(memcmp(buf, g_bytes[i], n) == 0);
        else
            FUZZ_CHECK(!cg_disk_contains(g_disk, &g_keys[i]));
        free(buf);
    }
    for (size_t i = 0; i < n_forged; i++) {
        cg_disk_chunk_info info;
        if (cg_disk_peek(g_disk, &forged[i], &info) != CG_OK) continue;
        size_t n = chunk_bytes(info.tokens);
        uint8_t *buf = malloc(n);
        if (!buf) abort();
        FUZZ_CHECK(cg_disk_get_buf(g_disk, &forged[i], info.tokens, buf, n, g_now++) != CG_OK);
        free(buf);
    }
    FUZZ_CHECK(cg_disk_check(g_disk) == CG_OK);

    /* 3. restore: the clean file, no forged rows, every record back */
    write_blocks(g_clean);
    for (size_t i = 0; i < n_forged; i++) {
        cg_status st = cg_disk_remove(g_disk, &forged[i]);
        FUZZ_CHECK(st == CG_OK || st == CG_E_NOT_FOUND);
    }
    int reput = 0;
    for (int i = 0; i < N_REC; i++)
        if (!cg_disk_contains(g_disk, &g_keys[i])) put(i), reput = 1;
    if (reput) read_blocks(g_clean);
    FUZZ_CHECK(cg_disk_check(g_disk) == CG_OK);
    return 0;
}

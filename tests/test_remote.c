/* Check suite for the remote KV tier (base/remote.h) against real Redis: URL, password
 * and key helpers; fake servers that answer wrongly or never; one node (binary round trips up
 * to 4 MiB, databases, AUTH from the environment and a file, TTL, wrong types, write-behind
 * drops and flush, kill -9 mid-traffic and restart, SIGSTOP, many threads); a 3-master
 * cluster (spread over the masters, slots against CLUSTER KEYSLOT, ASK and MOVED during a slot
 * migration, one master killed). redis-server is started by the test on free loopback ports
 * with temp dirs and no persistence; the cluster by tests/redis_cluster.sh. Exits 77 (skip)
 * with a reason when redis-server or redis-cli is missing. */
#include <check.h>
#include <errno.h>
#include <fcntl.h>
#include <hiredis/hiredis.h>
#include <netinet/in.h>
#include <netinet/tcp.h>
#include <poll.h>
#include <pthread.h>
#include <signal.h>
#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/prctl.h>
#include <sys/socket.h>
#include <sys/stat.h>
#include <sys/wait.h>
#include <time.h>
#include <unistd.h>

#include "base/base.h"
#include "tests/harness/harness.h"
#include "kv/kvwire.h"
#include "base/remote.h"

#define SKIP_CODE 77
#define MODEL "test-model"

static char g_redis_server[512]; /* empty: not installed */
static char g_redis_cli[512];

static double ms_since(uint64_t t0)
{
    return (double)(cg_now_ns() - t0) / 1e6;
}

/* ---- ports, servers, admin connections ---------------------------------------------------- */

/* First of n consecutive free ports (and their cluster bus ports +10000 when bus). */
static int pick_ports(int n, int bus)
{
    static unsigned seed;
    if (!seed) seed = (unsigned)getpid() ^ (unsigned)cg_now_ns();
    for (int tries = 0; tries < 500; tries++) {
        /* Below the kernel's ephemeral range (32768-), cluster bus ports (+10000) included. */
        int base = 20000 + (int)(rand_r(&seed) % (bus ? 2700 : 9000));
        int ok = 1;
        for (int i = 0; i < n && ok; i++)
            ok = th_port_free(base + i) && (!bus || th_port_free(base + i + 10000));
        if (ok) return base;
    }
    ck_abort_msg("no free loopback ports");
    return -1;
}

typedef struct srv {
    pid_t pid;
    int port;
    char dir[64];
    const char *extra[8];
    int n_extra;
} srv;

static redisContext *adm(int port)
{
    struct timeval tv = {2, 0};
    redisContext *c = redisConnectWithTimeout("127.0.0.1", port, tv);
    if (c && !c->err) redisSetTimeout(c, tv);
    return c;
}

static redisReply *cmd(redisContext *c, const char *fmt, ...)
{
    va_list ap;
    va_start(ap, fmt);
    redisReply *r = redisvCommand(c, fmt, ap);
    va_end(ap);
    ck_assert_msg(r != NULL, "admin command %s failed: %s", fmt, c->errstr);
    return r;
}

static long long cmd_int(redisContext *c, const char *fmt, ...)
{
    va_list ap;
    va_start(ap, fmt);
    redisReply *r = redisvCommand(c, fmt, ap);
    va_end(ap);
    ck_assert_msg(r && r->type == REDIS_REPLY_INTEGER, "admin %s: expected an integer (%s)", fmt,
                  r && r->str ? r->str : c->errstr);
    long long v = r->integer;
    freeReplyObject(r);
    return v;
}

static void cmd_ok(redisContext *c, const char *fmt, ...)
{
    va_list ap;
    va_start(ap, fmt);
    redisReply *r = redisvCommand(c, fmt, ap);
    va_end(ap);
    ck_assert_msg(r && r->type == REDIS_REPLY_STATUS, "admin %s: %s", fmt,
                  r && r->str ? r->str : c->errstr);
    freeReplyObject(r);
}

/* The last bytes of s's redis.log into tail (n bytes), "" when there is none. */
static void srv_log_tail(const srv *s, char *tail, size_t n)
{
    char log[256];
    snprintf(log, sizeof log, "%s/redis.log", s->dir);
    tail[0] = 0;
    FILE *f = fopen(log, "r");
    if (!f) return;
    fseek(f, 0, SEEK_END);
    long size = ftell(f);
    fseek(f, size > (long)n - 1 ? size - (long)n + 1 : 0, SEEK_SET);
    tail[fread(tail, 1, n - 1, f)] = 0;
    fclose(f);
}

/* Starts redis-server on s->port; 1 once it answers PING within timeout_ms, else 0 with the
 * reason in why (the server, if it still runs, is left to the caller). */
static int srv_try_spawn(srv *s, int timeout_ms, char *why, size_t why_n)
{
    /* everything the child needs is made before the fork: the test has threads, and a child
     * of a threaded process may call only async-signal-safe functions before execv */
    char port[16];
    snprintf(port, sizeof port, "%d", s->port);
    const char *argv[32] = {g_redis_server, "--port",    port,           "--bind",      "127.0.0.1",
                            "--save",       "",          "--appendonly", "no",          "--dir",
                            s->dir,         "--logfile", "redis.log",    "--daemonize", "no"};
    int k = 15;
    for (int i = 0; i < s->n_extra; i++)
        argv[k++] = s->extra[i];
    argv[k] = NULL;
    pid_t pid = fork();
    ck_assert_int_ge(pid, 0);
    if (pid == 0) {
        prctl(PR_SET_PDEATHSIG, SIGKILL); /* never outlive the test */
        int nul = open("/dev/null", O_RDWR);
        dup2(nul, 0);
        dup2(nul, 1);
        execv(g_redis_server, (char *const *)argv);
        _exit(127);
    }
    s->pid = pid;
    snprintf(why, why_n, "no attempt");
    for (int waited = 0; waited < timeout_ms; waited += 50) {
        int status;
        if (waitpid(pid, &status, WNOHANG) != 0) {
            s->pid = 0;
            snprintf(why, why_n, "it exited (status %d)", status);
            return 0;
        }
        redisContext *c = adm(s->port);
        if (c && !c->err) {
            redisReply *r = redisCommand(c, "PING");
            int up = r != NULL && (r->type == REDIS_REPLY_STATUS || r->type == REDIS_REPLY_ERROR);
            snprintf(why, why_n, "PING: %s",
                     r ? (r->str ? r->str : "a reply of another type") : c->errstr);
            if (r) freeReplyObject(r);
            redisFree(c);
            if (up) return 1;
        } else {
            snprintf(why, why_n, "connect: %s", c ? c->errstr : "out of memory");
            redisFree(c);
        }
        th_sleep_ms(50);
    }
    return 0;
}

static void srv_kill(srv *s);

/* Starts redis-server on s->port (the same port again after a kill: the clients know it). A
 * machine busy with parallel suites can be slow to start it: each try has 10 s, and a server
 * that did not answer in that time is killed and started again, up to 3 times; each failed
 * try says why on stderr, with the end of its log. */
static void srv_spawn(srv *s)
{
    char why[160], tail[1024];
    for (int attempt = 1; attempt <= 3; attempt++) {
        if (srv_try_spawn(s, 10000, why, sizeof why)) return;
        srv_kill(s);
        srv_log_tail(s, tail, sizeof tail);
        fprintf(stderr,
                "redis-server on port %d, try %d, did not come up in 10 s; last %s; %s/redis.log "
                "ends:\n%s\n",
                s->port, attempt, why, s->dir, tail);
        th_sleep_ms(200);
    }
    ck_abort_msg("redis-server on port %d did not come up in 3 tries (stderr says why)", s->port);
}

static void srv_start(srv *s)
{
    s->port = pick_ports(1, 0);
    snprintf(s->dir, sizeof s->dir, "/tmp/cg_remote_XXXXXX");
    ck_assert_ptr_nonnull(mkdtemp(s->dir));
    srv_spawn(s);
}

static void srv_kill(srv *s)
{
    if (s->pid <= 0) return;
    kill(s->pid, SIGCONT);
    kill(s->pid, SIGKILL);
    waitpid(s->pid, NULL, 0);
    s->pid = 0;
}

static void srv_free(srv *s)
{
    srv_kill(s);
    char p[128];
    snprintf(p, sizeof p, "%s/redis.log", s->dir);
    unlink(p);
    rmdir(s->dir);
}

static void url_of(char *out, size_t cap, int port, const char *suffix)
{
    snprintf(out, cap, "redis://127.0.0.1:%d%s", port, suffix ? suffix : "");
}

/* The default parameters for the node on loopback port (path suffix may be NULL); the URL is
 * written to url (cap bytes), which must outlive the parameters. */
static cg_remote_params params_at(char *url, size_t cap, int port, const char *suffix)
{
    cg_remote_params p = cg_remote_default_params();
    url_of(url, cap, port, suffix);
    p.url = url;
    return p;
}

/* ---- values and keys ---------------------------------------------------------------------- */

/* Deterministic bytes with NULs and every byte value, different for each seed. */
static char *make_value(unsigned seed, size_t len)
{
    char *v = cg_malloc(len ? len : 1);
    uint32_t x = seed * 2654435761u + 1;
    for (size_t i = 0; i < len; i++) {
        x = x * 1103515245u + 12345u;
        v[i] = (i % 7 == 0) ? 0 : (char)(x >> 16);
    }
    return v;
}

static void chunk_key(char *out, unsigned chunk, unsigned head, unsigned salt)
{
    char hex[33];
    snprintf(hex, sizeof hex, "%08x%08x%08x%08x", salt, chunk, 0xc0ffeeu, chunk * 7919u + salt);
    ck_assert_int_eq(cg_kvwire_head_key(MODEL, head, hex, out, CG_REMOTE_KEY_MAX), CG_OK);
}

static cg_remote *open_ok(cg_remote_params p)
{
    char err[256] = "";
    cg_remote *r = NULL;
    cg_status st = cg_remote_open(p, &r, err, sizeof err);
    ck_assert_msg(st == CG_OK, "cg_remote_open(%s): %s: %s", p.url, cg_status_name(st), err);
    return r;
}

static cg_remote_stats stats(cg_remote *r)
{
    cg_remote_stats s;
    cg_remote_stats_get(r, &s);
    return s;
}

/* A client of a loopback port nothing listens on, its backoff from min_ms to max_ms: the open
 * succeeds all the same (the tier comes up later). */
static cg_remote *open_unreachable(int min_ms, int max_ms)
{
    char url[64];
    cg_remote_params p = params_at(url, sizeof url, pick_ports(1, 0), NULL);
    p.backoff_min_ms = min_ms;
    p.backoff_max_ms = max_ms;
    return open_ok(p);
}

/* ---- unit: helpers ------------------------------------------------------------------------ */

START_TEST(url_parsing)
{
    cg_remote_url u;
    char err[256];
    ck_assert_int_eq(cg_remote_parse_url("redis://127.0.0.1:6379", &u, err, sizeof err), CG_OK);
    ck_assert_str_eq(u.host, "127.0.0.1");
    ck_assert_int_eq(u.port, 6379);
    ck_assert_int_eq(u.db, 0);
    ck_assert_int_eq(u.cluster, 0);
    ck_assert_int_eq(cg_remote_parse_url("redis://cache-1.internal:7000/12", &u, err, sizeof err),
                     CG_OK);
    ck_assert_str_eq(u.host, "cache-1.internal");
    ck_assert_int_eq(u.db, 12);
    ck_assert_int_eq(cg_remote_parse_url("redis+cluster://[::1]:30001", &u, err, sizeof err),
                     CG_OK);
    ck_assert_str_eq(u.host, "::1");
    ck_assert_int_eq(u.port, 30001);
    ck_assert_int_eq(u.cluster, 1);

    static const struct {
        const char *url, *needle;
    } bad[] = {
        {"", "empty"},
        {"http://h:1", "must start with"},
        {"rediss://h:6379", "TLS"},
        {"redis://:pw@h:6379", "must not carry"},
        {"redis://user:pw@h:6379/0", "CHUNKGATE_WORKER_REMOTE_PASSWORD"},
        {"redis://h", "expected :port"},
        {"redis://h:", "port must be"},
        {"redis://h:0", "port must be"},
        {"redis://h:65536", "port must be"},
        {"redis://h:1234567", "port must be"},
        {"redis://:6379", "missing host"},
        {"redis://h:6379/", "database must be"},
        {"redis://h:6379/x", "database must be"},
        {"redis://h:6379/1000000", "database must be"},
        {"redis://h:6379/1?x=1", "unexpected characters"},
        {"redis://h:6379x", "unexpected characters"},
        {"redis://h h:6379", "expected :port"},
        {"redis+cluster://h:7000/0", "only database 0"},
        {"redis://[::1:6379", "IPv6"},
        {"redis://[zz]:6379", "IPv6"},
    };
    for (size_t i = 0; i < CG_ARRAY_LEN(bad); i++) {
        err[0] = 0;
        ck_assert_msg(cg_remote_parse_url(bad[i].url, &u, err, sizeof err) == CG_E_VALUE,
                      "accepted %s", bad[i].url);
        ck_assert_msg(strstr(err, bad[i].needle), "%s: message \"%s\" lacks \"%s\"", bad[i].url,
                      err, bad[i].needle);
    }
}
END_TEST

START_TEST(key_slots_and_keys)
{
    /* Reference values from CLUSTER KEYSLOT of Redis 7 (checked live in the cluster case). */
    ck_assert_uint_eq(cg_remote_key_slot("123456789", 9), 12739);
    ck_assert_uint_eq(cg_remote_key_slot("foo", 3), 12182);
    ck_assert_uint_eq(cg_remote_key_slot("somekey", 7), 11058);
    ck_assert_uint_eq(cg_remote_key_slot("foo{hash_tag}", 13), 2515);
    ck_assert_uint_eq(cg_remote_key_slot("bar{hash_tag}", 13), 2515);
    ck_assert_uint_eq(cg_remote_key_slot("{user1000}.following", 20),
                      cg_remote_key_slot("user1000", 8));
    /* Empty tag: the whole key; only the first {...} counts; "{{bar}}" tags "{bar". */
    ck_assert_uint_eq(cg_remote_key_slot("foo{}{bar}", 10), cg_remote_key_slot("foo{}{bar}", 10));
    ck_assert_uint_ne(cg_remote_key_slot("foo{}{bar}", 10), cg_remote_key_slot("bar", 3));
    ck_assert_uint_eq(cg_remote_key_slot("foo{{bar}}zap", 13), cg_remote_key_slot("{bar", 4));
    ck_assert_uint_eq(cg_remote_key_slot("foo{bar}{zap}", 13), cg_remote_key_slot("bar", 3));

    char k[CG_REMOTE_KEY_MAX];
    ck_assert_int_eq(
        cg_kvwire_head_key("qwen2", 3, "0123456789abcdef0123456789abcdef", k, sizeof k), CG_OK);
    ck_assert_str_eq(k, "qwen2@head:3@0123456789abcdef0123456789abcdef");
    ck_assert_int_eq(
        cg_kvwire_head_key("qwen2", 3, "0123456789ABCDEF0123456789abcdef", k, sizeof k),
        CG_E_VALUE);
    ck_assert_int_eq(cg_kvwire_head_key("", 3, "0123456789abcdef0123456789abcdef", k, sizeof k),
                     CG_E_VALUE);
    ck_assert_int_eq(cg_kvwire_head_key("qwen2", 3, "0123456789abcdef0123456789abcdef", k, 20),
                     CG_E_TOO_LARGE);
}
END_TEST

START_TEST(password_loading)
{
    char err[256], *pw = NULL;
    unsetenv(CG_REMOTE_PASSWORD_ENV);
    ck_assert_int_eq(cg_remote_load_password(NULL, &pw, err, sizeof err), CG_OK);
    ck_assert_ptr_null(pw);
    setenv(CG_REMOTE_PASSWORD_ENV, "from-env", 1);
    ck_assert_int_eq(cg_remote_load_password(NULL, &pw, err, sizeof err), CG_OK);
    ck_assert_str_eq(pw, "from-env");
    free(pw);
    unsetenv(CG_REMOTE_PASSWORD_ENV);

    char path[] = "/tmp/cg_remote_pw_XXXXXX";
    int fd = mkstemp(path);
    ck_assert_int_ge(fd, 0);
    ck_assert_int_eq(write(fd, "from file\r\n", 11), 11);
    close(fd);
    ck_assert_int_eq(cg_remote_load_password(path, &pw, err, sizeof err), CG_OK);
    ck_assert_str_eq(pw, "from file");
    free(pw);
    fd = open(path, O_WRONLY | O_TRUNC);
    ck_assert_int_eq(write(fd, "\n", 1), 1);
    close(fd);
    ck_assert_int_eq(cg_remote_load_password(path, &pw, err, sizeof err), CG_E_VALUE);
    ck_assert_ptr_nonnull(strstr(err, "empty"));
    fd = open(path, O_WRONLY | O_TRUNC);
    ck_assert_int_eq(write(fd, "two\nlines\n", 10), 10);
    close(fd);
    ck_assert_int_eq(cg_remote_load_password(path, &pw, err, sizeof err), CG_E_VALUE);
    unlink(path);
    ck_assert_int_eq(cg_remote_load_password(path, &pw, err, sizeof err), CG_E_IO);
    ck_assert_ptr_nonnull(strstr(err, path));
    ck_assert_ptr_null(pw);
}
END_TEST

START_TEST(open_validates_params)
{
    char err[256];
    cg_remote *r = NULL;
    cg_remote_params p = cg_remote_default_params();
    p.url = "redis://127.0.0.1:1";
    p.timeout_ms = 0;
    ck_assert_int_eq(cg_remote_open(p, &r, err, sizeof err), CG_E_VALUE);
    ck_assert_ptr_nonnull(strstr(err, "timeout_ms"));
    p = cg_remote_default_params();
    p.url = "redis://127.0.0.1:1";
    p.backoff_min_ms = 500;
    p.backoff_max_ms = 100;
    ck_assert_int_eq(cg_remote_open(p, &r, err, sizeof err), CG_E_VALUE);
    p = cg_remote_default_params();
    p.url = "tcp://127.0.0.1:1";
    ck_assert_int_eq(cg_remote_open(p, &r, err, sizeof err), CG_E_VALUE);
    ck_assert_ptr_null(r);
}
END_TEST

/* Nothing listens: open still succeeds (the tier comes up later); calls fail with
 * CG_E_UNAVAILABLE, and during the backoff without a connection attempt. */
START_TEST(down_at_start_fails_fast)
{
    cg_remote *r = open_unreachable(5000, 5000);
    cg_remote_stats s = stats(r);
    ck_assert_uint_eq(s.connect_failures, 1);
    const char *keys[1] = {"k"};
    cg_remote_value v[1];
    uint64_t ns = 0;
    for (int i = 0; i < 5; i++) {
        ck_assert_int_eq(cg_remote_get(r, 1, keys, v, &ns), CG_E_UNAVAILABLE);
        ck_assert_ptr_null(v[0].data);
    }
    s = stats(r);
    ck_assert_uint_eq(s.connect_failures, 1); /* no attempt inside the backoff */
    ck_assert_uint_eq(s.fast_fails, 5);
    ck_assert_uint_eq(s.errors_unavailable, 6); /* the open's ping and five gets */
    ck_assert_uint_eq(s.gets, 5);
    printf("remote: get while down and in backoff: %.3f ms\n", (double)ns / 1e6);
    const void *vals[1] = {"x"};
    size_t lens[1] = {1};
    ck_assert_int_eq(cg_remote_set(r, 1, keys, vals, lens), CG_E_UNAVAILABLE);
    ck_assert_int_eq(cg_remote_get(r, 0, keys, v, NULL), CG_E_VALUE);
    cg_remote_close(&r);
    ck_assert_ptr_null(r);
    cg_remote_close(&r);
}
END_TEST

/* Nothing listens: connection attempts are spaced by a doubling backoff, capped. */
START_TEST(backoff_doubles_to_its_cap)
{
    cg_remote *r = open_unreachable(40, 160); /* the first attempt */
    /* For each attempt seen, when the call that made it started and ended: the true time
     * between two attempts is at most end[k] - start[k-1]. */
    uint64_t start_ns[32], end_ns[32], t0 = cg_now_ns();
    size_t n_at = 0;
    uint64_t seen = stats(r).connect_failures;
    const char *keys[1] = {"k"};
    cg_remote_value v[1];
    while (ms_since(t0) < 1200 && n_at < CG_ARRAY_LEN(start_ns)) {
        uint64_t s0 = cg_now_ns();
        ck_assert_int_eq(cg_remote_get(r, 1, keys, v, NULL), CG_E_UNAVAILABLE);
        uint64_t s1 = cg_now_ns(), f = stats(r).connect_failures;
        if (f != seen) {
            ck_assert_uint_eq(f, seen + 1);
            start_ns[n_at] = s0;
            end_ns[n_at++] = s1;
            seen = f;
        }
        th_sleep_ms(2);
    }
    printf("remote: connection attempts while down, ms apart:");
    for (size_t i = 1; i < n_at; i++)
        printf(" %.0f", (double)(start_ns[i] - start_ns[i - 1]) / 1e6);
    printf(" (backoff 40 doubling to 160)\n");
    ck_assert_uint_ge(n_at, 3);
    for (size_t i = 1; i < n_at; i++) {
        /* attempt i (i >= 1 in this loop) is the (i + 1)-th failure in a row */
        uint64_t want_ms = CG_MIN((uint64_t)40 << i, 160);
        ck_assert_msg(end_ns[i] - start_ns[i - 1] >= (want_ms - 1) * 1000000,
                      "attempt %zu came %.1f ms after the previous one, backoff %llu ms", i,
                      (double)(end_ns[i] - start_ns[i - 1]) / 1e6, (unsigned long long)want_ms);
    }
    cg_remote_close(&r);
}
END_TEST

/* ---- fake servers: wrong answers and silence ----------------------------------------------- */

typedef struct fake {
    int lfd, port;
    const char *reply; /* sent for each command other than PING; NULL: never answer */
    size_t reply_len;
    int stop;
    int replies; /* atomic: replies written in full */
    pthread_t th;
} fake;

/* Length of the first complete RESP array command in b[0..n), 0 if incomplete; *name gets the
 * first argument (up to 31 bytes). */
static size_t parse_cmd(const char *b, size_t n, char *name)
{
    const char *end = b + n, *p = b;
    if (p >= end || *p != '*') return n ? n : 0; /* not RESP: swallow */
    const char *nl = memchr(p, '\n', (size_t)(end - p));
    if (!nl) return 0;
    long argc = strtol(p + 1, NULL, 10);
    p = nl + 1;
    name[0] = 0;
    for (long i = 0; i < argc; i++) {
        if (p >= end || *p != '$') return 0;
        nl = memchr(p, '\n', (size_t)(end - p));
        if (!nl) return 0;
        long len = strtol(p + 1, NULL, 10);
        p = nl + 1;
        if (end - p < len + 2) return 0;
        if (i == 0) {
            size_t k = (size_t)CG_MIN(len, 31);
            memcpy(name, p, k);
            name[k] = 0;
        }
        p += len + 2;
    }
    return (size_t)(p - b);
}

static void *fake_main(void *arg)
{
    fake *f = arg;
    struct pollfd pfd[9];
    char *buf[9] = {0};
    size_t len[9] = {0};
    int n = 1;
    pfd[0] = (struct pollfd){.fd = f->lfd, .events = POLLIN};
    while (!__atomic_load_n(&f->stop, __ATOMIC_RELAXED)) {
        if (poll(pfd, (nfds_t)n, 50) <= 0) continue;
        if ((pfd[0].revents & POLLIN) && n < 9) {
            int c = accept(f->lfd, NULL, NULL);
            if (c >= 0) {
                int one = 1;
                setsockopt(c, IPPROTO_TCP, TCP_NODELAY, &one, sizeof one);
                pfd[n] = (struct pollfd){.fd = c, .events = POLLIN};
                buf[n] = cg_malloc(1 << 20);
                len[n] = 0;
                n++;
            }
        }
        for (int i = 1; i < n; i++) {
            if (!pfd[i].revents) continue;
            ssize_t k = read(pfd[i].fd, buf[i] + len[i], (1 << 20) - len[i]);
            if (k <= 0) {
                close(pfd[i].fd);
                free(buf[i]);
                pfd[i] = pfd[n - 1];
                buf[i] = buf[n - 1];
                len[i] = len[n - 1];
                n--;
                i--;
                continue;
            }
            len[i] += (size_t)k;
            char name[32];
            size_t used;
            while ((used = parse_cmd(buf[i], len[i], name)) > 0) {
                memmove(buf[i], buf[i] + used, len[i] - used);
                len[i] -= used;
                if (!strcasecmp(name, "PING")) {
                    ck_assert_int_eq(write(pfd[i].fd, "+PONG\r\n", 7), 7);
                } else if (f->reply) {
                    /* A '|' in the reply: a 30 ms pause there (not sent). */
                    size_t off = 0;
                    while (off < f->reply_len) {
                        const char *bar = memchr(f->reply + off, '|', f->reply_len - off);
                        size_t upto = bar ? (size_t)(bar - f->reply) : f->reply_len;
                        while (off < upto) {
                            ssize_t w = write(pfd[i].fd, f->reply + off, upto - off);
                            if (w <= 0) break;
                            off += (size_t)w;
                        }
                        if (!bar) break;
                        th_sleep_ms(30);
                        off = upto + 1;
                    }
                    __atomic_fetch_add(&f->replies, 1, __ATOMIC_RELEASE);
                }
            }
        }
    }
    for (int i = 1; i < n; i++) {
        close(pfd[i].fd);
        free(buf[i]);
    }
    return NULL;
}

static void fake_start(fake *f, const char *reply, size_t reply_len)
{
    memset(f, 0, sizeof *f);
    f->reply = reply;
    f->reply_len = reply_len;
    f->lfd = socket(AF_INET, SOCK_STREAM, 0);
    struct sockaddr_in a = {.sin_family = AF_INET, .sin_addr.s_addr = htonl(INADDR_LOOPBACK)};
    ck_assert_int_eq(bind(f->lfd, (struct sockaddr *)&a, sizeof a), 0);
    socklen_t sl = sizeof a;
    getsockname(f->lfd, (struct sockaddr *)&a, &sl);
    f->port = ntohs(a.sin_port);
    ck_assert_int_eq(listen(f->lfd, 16), 0);
    ck_assert_int_eq(pthread_create(&f->th, NULL, fake_main, f), 0);
}

static void fake_stop(fake *f)
{
    __atomic_store_n(&f->stop, 1, __ATOMIC_RELAXED);
    pthread_join(f->th, NULL);
    close(f->lfd);
}

/* GET against a fake that answers reply: returns the status. */
static cg_status fake_get(const char *reply, size_t reply_len, size_t value_max)
{
    fake f;
    fake_start(&f, reply, reply_len);
    char url[64];
    cg_remote_params p = params_at(url, sizeof url, f.port, NULL);
    p.timeout_ms = 300;
    if (value_max) p.value_max_bytes = value_max;
    cg_remote *r = open_ok(p);
    const char *keys[2] = {"a", "b"};
    cg_remote_value v[2];
    uint64_t ns = 0;
    cg_status st = cg_remote_get(r, 2, keys, v, &ns);
    if (st == CG_OK) {
        ck_assert_uint_eq(v[0].len, 1000); /* the one well-formed value case */
        ck_assert_uint_eq(v[1].len, 1000);
        cg_remote_values_free(r, v, 2);
    }
    ck_assert_ptr_null(v[0].data);
    ck_assert_ptr_null(v[1].data);
    cg_remote_stats s = stats(r);
    ck_assert_uint_eq(s.errors, st == CG_OK || st == CG_E_NOT_FOUND ? 0 : 1);
    printf("remote: fake reply %.12s...: %s in %.1f ms\n", reply ? reply : "(none)",
           cg_status_name(st), (double)ns / 1e6);
    cg_remote_close(&r);
    fake_stop(&f);
    return st;
}

START_TEST(wrong_replies_are_errors)
{
    ck_assert_int_eq(fake_get(":1\r\n", 4, 0), CG_E_BAD_GATEWAY);      /* integer for GET */
    ck_assert_int_eq(fake_get("*0\r\n", 4, 0), CG_E_BAD_GATEWAY);      /* array for GET */
    ck_assert_int_eq(fake_get("+OK\r\n", 5, 0), CG_E_BAD_GATEWAY);     /* status for GET */
    ck_assert_int_eq(fake_get("garbage\r\n", 9, 0), CG_E_BAD_GATEWAY); /* not RESP */
    ck_assert_int_eq(fake_get("-ERR no\r\n", 9, 0), CG_E_BAD_GATEWAY); /* error reply */
    ck_assert_int_eq(fake_get("-LOADING x\r\n", 12, 0), CG_E_UNAVAILABLE);
    ck_assert_int_eq(fake_get("-NOAUTH x\r\n", 11, 0), CG_E_AUTH);
    ck_assert_int_eq(fake_get("$-1\r\n", 5, 0), CG_E_NOT_FOUND); /* nil: a miss */
    /* A single-node client that meets a cluster node's MOVED. */
    ck_assert_int_eq(fake_get("-MOVED 1 127.0.0.1:1\r\n", 22, 0), CG_E_BAD_GATEWAY);
    /* A value larger than value_max_bytes, announced then streamed: refused while buffering. */
    size_t big = 300 * 1024;
    char *huge = cg_malloc(big);
    int h = snprintf(huge, 32, "$%d\r\n", 1 << 30);
    memset(huge + h, 'x', big - (size_t)h);
    ck_assert_int_eq(fake_get(huge, big, 64 * 1024), CG_E_BAD_GATEWAY);
    /* A complete value just over the cap. */
    h = snprintf(huge, 32, "$%d\r\n", 1000);
    memset(huge + h, 'y', 1000);
    memcpy(huge + h + 1000, "\r\n", 2);
    ck_assert_int_eq(fake_get(huge, (size_t)h + 1002, 999), CG_E_BAD_GATEWAY);
    ck_assert_int_eq(fake_get(huge, (size_t)h + 1002, 1000), CG_OK);
    /* A large value (received in place) whose CRLF is wrong. */
    h = snprintf(huge, 32, "$%d\r\n", 70000);
    memset(huge + h, 'z', 70000);
    memcpy(huge + h + 70000, "XX", 2);
    ck_assert_int_eq(fake_get(huge, (size_t)h + 70002, 0), CG_E_BAD_GATEWAY);
    free(huge);
}
END_TEST

/* A server that answers each command twice, the second time 30 ms later: the extra reply is
 * found on the idle connection before the next command and never taken for its reply. */
START_TEST(extra_replies_never_served)
{
    fake f;
    fake_start(&f, "$1\r\nx\r\n|$1\r\ny\r\n", 15);
    char url[64];
    cg_remote_params p = params_at(url, sizeof url, f.port, NULL);
    p.backoff_min_ms = 1;
    p.backoff_max_ms = 1;
    p.conns_per_node = 1;
    cg_remote *r = open_ok(p);
    const char *keys[1] = {"k"};
    int ok = 0, bad = 0;
    for (int i = 0; i < 6; i++) {
        cg_remote_value v[1];
        cg_status st = cg_remote_get(r, 1, keys, v, NULL);
        if (st == CG_OK) {
            ck_assert_uint_eq(v[0].len, 1);
            ck_assert_int_eq(v[0].data[0], 'x');
            cg_remote_values_free(r, v, 1);
            ok++;
        } else {
            ck_assert_int_eq(st, CG_E_BAD_GATEWAY);
            bad++;
        }
        /* The stray reply is on the wire before the next command goes out. */
        for (int w = 0; w < 400 && __atomic_load_n(&f.replies, __ATOMIC_ACQUIRE) < i + 1; w++)
            th_sleep_ms(5);
        ck_assert_int_ge(__atomic_load_n(&f.replies, __ATOMIC_ACQUIRE), i + 1);
        th_sleep_ms(10);
    }
    printf("remote: doubled replies: %d gets answered \"x\", %d refused, never \"y\"\n", ok, bad);
    ck_assert_int_gt(ok, 0);
    cg_remote_close(&r);
    fake_stop(&f);
}
END_TEST

START_TEST(silent_server_times_out)
{
    fake f;
    fake_start(&f, NULL, 0);
    char url[64];
    cg_remote_params p = params_at(url, sizeof url, f.port, NULL);
    p.timeout_ms = 250;
    p.backoff_min_ms = 2000;
    cg_remote *r = open_ok(p); /* PING is answered */
    const char *keys[1] = {"k"};
    cg_remote_value v[1];
    uint64_t ns = 0;
    ck_assert_int_eq(cg_remote_get(r, 1, keys, v, &ns), CG_E_TIMEOUT);
    printf("remote: get from a silent server: CG_E_TIMEOUT after %.1f ms (timeout 250)\n",
           (double)ns / 1e6);
    ck_assert_uint_ge(ns, 200ull * 1000000);  /* it did wait for the reply */
    ck_assert_uint_lt(ns, 3000ull * 1000000); /* hang detector, not a timing check */
    uint64_t ns2 = 0;
    ck_assert_int_eq(cg_remote_get(r, 1, keys, v, &ns2), CG_E_UNAVAILABLE); /* backoff */
    cg_remote_stats s = stats(r);
    ck_assert_uint_eq(s.errors_timeout, 1);
    ck_assert_uint_eq(s.fast_fails, 1);
    cg_remote_close(&r);
    fake_stop(&f);
}
END_TEST

static cg_status fake_cluster_open(const char *reply, char *err, size_t errlen)
{
    fake f;
    fake_start(&f, reply, strlen(reply));
    cg_remote_params p = cg_remote_default_params();
    char url[64];
    snprintf(url, sizeof url, "redis+cluster://127.0.0.1:%d", f.port);
    p.url = url;
    cg_remote *r = NULL;
    cg_status st = cg_remote_open(p, &r, err, errlen);
    if (r) cg_remote_close(&r);
    fake_stop(&f);
    return st;
}

START_TEST(bad_cluster_maps_fail_open)
{
    char err[256];
    /* Not a cluster node: a clear refusal. */
    ck_assert_int_eq(
        fake_cluster_open("-ERR This instance has cluster support disabled\r\n", err, sizeof err),
        CG_E_VALUE);
    ck_assert_ptr_nonnull(strstr(err, "cluster support disabled"));
    /* Slot out of range, port out of range, wrong element types. */
    ck_assert_int_eq(
        fake_cluster_open("*1\r\n*3\r\n:0\r\n:16384\r\n*2\r\n$9\r\n127.0.0.1\r\n:7000\r\n", err,
                          sizeof err),
        CG_E_BAD_GATEWAY);
    ck_assert_int_eq(fake_cluster_open("*1\r\n*3\r\n:0\r\n:100\r\n*2\r\n$9\r\n127.0.0.1\r\n:0\r\n",
                                       err, sizeof err),
                     CG_E_BAD_GATEWAY);
    ck_assert_int_eq(fake_cluster_open("*1\r\n*3\r\n$1\r\n0\r\n:100\r\n*2\r\n$1\r\nh\r\n:1\r\n",
                                       err, sizeof err),
                     CG_E_BAD_GATEWAY);
    ck_assert_int_eq(fake_cluster_open(":5\r\n", err, sizeof err), CG_E_BAD_GATEWAY);
}
END_TEST

/* ---- one node ----------------------------------------------------------------------------- */

static srv g_srv;

static void node_setup(void)
{
    memset(&g_srv, 0, sizeof g_srv);
    srv_start(&g_srv);
}

static void node_teardown(void)
{
    srv_free(&g_srv);
}

static cg_remote_params node_params(char *url, size_t cap, const char *suffix)
{
    cg_remote_params p = params_at(url, cap, g_srv.port, suffix);
    p.timeout_ms = 2000; /* generous: the machine is shared; the failure cases set their own */
    return p;
}

START_TEST(node_round_trips)
{
    char url[64];
    cg_remote *r = open_ok(node_params(url, sizeof url, NULL));
    static const size_t sizes[] = {0, 1, 7, 1000, 16384, 16385, 300000, 4u << 20};
    enum { N = CG_ARRAY_LEN(sizes) };
    char keys_buf[N][CG_REMOTE_KEY_MAX];
    const char *keys[N];
    char *vals[N];
    size_t lens[N];
    for (unsigned i = 0; i < N; i++) {
        chunk_key(keys_buf[i], 1, i, 0xa);
        keys[i] = keys_buf[i];
        lens[i] = sizes[i];
        vals[i] = make_value(i + 1, sizes[i]);
    }
    ck_assert_int_eq(cg_remote_set(r, N, keys, (const void *const *)vals, lens), CG_OK);
    cg_remote_value out[N];
    uint64_t ns = 0;
    ck_assert_int_eq(cg_remote_get(r, N, keys, out, &ns), CG_OK);
    size_t total = 0;
    for (unsigned i = 0; i < N; i++) {
        ck_assert_uint_eq(out[i].len, lens[i]);
        ck_assert_int_eq(memcmp(out[i].data, vals[i], lens[i]), 0);
        ck_assert_int_eq(out[i].data[lens[i]], 0);
        ck_assert_uint_eq((uintptr_t)out[i].data % 16, 0);
        total += lens[i];
    }
    printf("remote: batch of %d values (%zu bytes) read in %.2f ms\n", N, total, (double)ns / 1e6);
    char *big_buf = out[N - 1].data;
    cg_remote_values_free(r, out, N);
    ck_assert_ptr_null(out[0].data);
    /* The large value's buffer is recycled by the next read of a value that size. */
    ck_assert_int_eq(cg_remote_get(r, 1, &keys[N - 1], out, NULL), CG_OK);
    ck_assert_ptr_eq(out[0].data, big_buf);
    ck_assert_int_eq(memcmp(out[0].data, vals[N - 1], lens[N - 1]), 0);
    cg_remote_values_free(r, out, 1);

    /* One head missing: a miss, nothing handed out. */
    char missing[CG_REMOTE_KEY_MAX];
    chunk_key(missing, 2, 0, 0xa);
    const char *mixed[3] = {keys[2], missing, keys[3]};
    ck_assert_int_eq(cg_remote_get(r, 3, mixed, out, NULL), CG_E_NOT_FOUND);
    for (int i = 0; i < 3; i++)
        ck_assert_ptr_null(out[i].data);

    size_t deleted = 99;
    const char *dels[3] = {keys[0], keys[1], missing};
    ck_assert_int_eq(cg_remote_del(r, 3, dels, &deleted), CG_OK);
    ck_assert_uint_eq(deleted, 2);
    ck_assert_int_eq(cg_remote_get(r, 1, &keys[0], out, NULL), CG_E_NOT_FOUND);
    ck_assert_int_eq(cg_remote_get(r, 1, &keys[2], out, NULL), CG_OK);
    ck_assert_uint_eq(out[0].len, 7);
    cg_remote_values_free(r, out, 1);
    ck_assert_int_eq(cg_remote_ping(r), CG_OK);

    cg_remote_stats s = stats(r);
    ck_assert_uint_eq(s.gets, 5);
    ck_assert_uint_eq(s.hits, 3);
    ck_assert_uint_eq(s.misses, 2);
    ck_assert_uint_eq(s.bytes_read, total + lens[N - 1] + 7);
    ck_assert_uint_eq(s.sets, N);
    ck_assert_uint_eq(s.bytes_written, total);
    ck_assert_uint_eq(s.dels, 2);
    ck_assert_uint_eq(s.errors, 0);
    ck_assert_uint_eq(s.nodes, 1);
    for (unsigned i = 0; i < N; i++)
        free(vals[i]);
    cg_remote_close(&r);
}
END_TEST

START_TEST(node_database_selection)
{
    char url[64];
    cg_remote *r3 = open_ok(node_params(url, sizeof url, "/3"));
    const char *keys[1] = {"dbkey"};
    const void *vals[1] = {"in db 3"};
    size_t lens[1] = {7};
    ck_assert_int_eq(cg_remote_set(r3, 1, keys, vals, lens), CG_OK);
    redisContext *c = adm(g_srv.port);
    ck_assert_int_eq(cmd_int(c, "EXISTS dbkey"), 0);
    cmd_ok(c, "SELECT 3");
    ck_assert_int_eq(cmd_int(c, "EXISTS dbkey"), 1);
    redisFree(c);
    cg_remote *r0 = open_ok(node_params(url, sizeof url, "/0"));
    cg_remote_value v[1];
    ck_assert_int_eq(cg_remote_get(r0, 1, keys, v, NULL), CG_E_NOT_FOUND);
    ck_assert_int_eq(cg_remote_get(r3, 1, keys, v, NULL), CG_OK);
    ck_assert_int_eq(memcmp(v[0].data, "in db 3", 7), 0);
    cg_remote_values_free(NULL, v, 1);
    cg_remote_close(&r0);
    cg_remote_close(&r3);

    /* A database the server does not have fails the open, saying why. */
    char err[256] = "";
    cg_remote *r = NULL;
    cg_remote_params p = node_params(url, sizeof url, "/999");
    ck_assert_int_eq(cg_remote_open(p, &r, err, sizeof err), CG_E_VALUE);
    ck_assert_ptr_null(r);
    ck_assert_msg(strstr(err, "SELECT 999"), "message: %s", err);
}
END_TEST

START_TEST(node_ttl)
{
    char url[64];
    cg_remote_params p = node_params(url, sizeof url, NULL);
    cg_remote *plain = open_ok(p);
    p.ttl_s = 120;
    cg_remote *ttl = open_ok(p);
    const char *k1[1] = {"no-ttl"}, *k2[1] = {"with-ttl"};
    const void *vals[1] = {"v"};
    size_t lens[1] = {1};
    ck_assert_int_eq(cg_remote_set(plain, 1, k1, vals, lens), CG_OK);
    ck_assert_int_eq(cg_remote_set(ttl, 1, k2, vals, lens), CG_OK);
    ck_assert_int_eq(cg_remote_put_async(ttl, 1, (const char *const[]){"async-ttl"}, vals, lens),
                     CG_OK);
    ck_assert_int_eq(cg_remote_flush(ttl, 5000), CG_OK);
    redisContext *c = adm(g_srv.port);
    ck_assert_int_eq(cmd_int(c, "TTL no-ttl"), -1);
    long long t = cmd_int(c, "TTL with-ttl");
    ck_assert_int_gt(t, 0);
    ck_assert_int_le(t, 120);
    t = cmd_int(c, "TTL async-ttl");
    ck_assert_int_gt(t, 0);
    ck_assert_int_le(t, 120);
    redisFree(c);
    cg_remote_close(&plain);
    cg_remote_close(&ttl);
}
END_TEST

START_TEST(node_auth)
{
    srv_kill(&g_srv);
    g_srv.extra[0] = "--requirepass";
    g_srv.extra[1] = "s3cret pass";
    g_srv.n_extra = 2;
    srv_spawn(&g_srv);
    char url[64], err[256], *pw = NULL;
    cg_remote_params p = node_params(url, sizeof url, "/2");

    /* From the environment. */
    setenv(CG_REMOTE_PASSWORD_ENV, "s3cret pass", 1);
    ck_assert_int_eq(cg_remote_load_password(NULL, &pw, err, sizeof err), CG_OK);
    unsetenv(CG_REMOTE_PASSWORD_ENV);
    p.password = pw;
    cg_remote *r = open_ok(p);
    free(pw);
    const char *keys[1] = {"authed"};
    const void *vals[1] = {"yes"};
    size_t lens[1] = {3};
    ck_assert_int_eq(cg_remote_set(r, 1, keys, vals, lens), CG_OK);
    cg_remote_close(&r);

    /* From a file. */
    char path[] = "/tmp/cg_remote_pw_XXXXXX";
    int fd = mkstemp(path);
    ck_assert_int_eq(write(fd, "s3cret pass\n", 12), 12);
    close(fd);
    ck_assert_int_eq(cg_remote_load_password(path, &pw, err, sizeof err), CG_OK);
    unlink(path);
    p.password = pw;
    r = open_ok(p);
    free(pw);
    cg_remote_value v[1];
    ck_assert_int_eq(cg_remote_get(r, 1, keys, v, NULL), CG_OK);
    ck_assert_int_eq(memcmp(v[0].data, "yes", 3), 0);
    cg_remote_values_free(r, v, 1);
    cg_remote_close(&r);

    /* Wrong password, and none: the open fails and says so. */
    p.password = "wrong";
    err[0] = 0;
    ck_assert_int_eq(cg_remote_open(p, &r, err, sizeof err), CG_E_AUTH);
    ck_assert_ptr_null(r);
    ck_assert_msg(strstr(err, "refused the password") && strstr(err, "WRONGPASS"), "%s", err);
    p.password = NULL;
    err[0] = 0;
    ck_assert_int_eq(cg_remote_open(p, &r, err, sizeof err), CG_E_AUTH); /* at SELECT */
    ck_assert_msg(strstr(err, "needs a password") && strstr(err, "NOAUTH"), "%s", err);
    ck_assert_ptr_null(r);
    p.url = url;
    url_of(url, sizeof url, g_srv.port, NULL); /* no SELECT: refused at the first command */
    err[0] = 0;
    ck_assert_int_eq(cg_remote_open(p, &r, err, sizeof err), CG_E_AUTH);
    ck_assert_msg(strstr(err, "needs a password") && strstr(err, CG_REMOTE_PASSWORD_ENV), "%s",
                  err);
    ck_assert_ptr_null(r);
}
END_TEST

START_TEST(node_wrong_type_and_size)
{
    char url[64];
    cg_remote_params p = node_params(url, sizeof url, NULL);
    p.value_max_bytes = 100000;
    p.backoff_min_ms = 60000; /* a backoff would fail the calls after the oversized reply */
    p.backoff_max_ms = 60000;
    cg_remote *r = open_ok(p);
    redisContext *c = adm(g_srv.port);
    freeReplyObject(cmd(c, "RPUSH a-list x"));
    char *big = make_value(9, 200000);
    freeReplyObject(cmd(c, "SET too-big %b", big, (size_t)200000));
    freeReplyObject(cmd(c, "SET fine %b", big, (size_t)100000));
    redisFree(c);
    cg_remote_value v[2];
    const char *k1[2] = {"fine", "a-list"};
    ck_assert_int_eq(cg_remote_get(r, 2, k1, v, NULL), CG_E_BAD_GATEWAY);
    ck_assert_ptr_null(v[0].data);
    const char *k2[2] = {"fine", "too-big"};
    ck_assert_int_eq(cg_remote_get(r, 2, k2, v, NULL), CG_E_BAD_GATEWAY);
    ck_assert_ptr_null(v[0].data);
    cg_remote_stats s = stats(r);
    ck_assert_uint_eq(s.errors_protocol, 2);
    /* The oversized reply closed its connection only: the node serves the next call at once,
     * as it does after a reply of the wrong type. */
    ck_assert_int_eq(cg_remote_get(r, 1, k2, v, NULL), CG_OK);
    ck_assert_int_eq(memcmp(v[0].data, big, 100000), 0);
    cg_remote_values_free(r, v, 1);
    free(big);
    cg_remote_close(&r);
}
END_TEST

/* A reply of many small elements (a list read whole, as an events reader reads a stream) is
 * bounded by its bytes, not only by its largest element: one beyond value_max_bytes fails
 * that call with the protocol error and closes its connection, and the node serves the next
 * call at once (no backoff). */
START_TEST(node_reply_of_many_small_elements_is_bounded)
{
    char url[64];
    cg_remote_params p = node_params(url, sizeof url, NULL);
    p.value_max_bytes = 100000;
    p.backoff_min_ms = 60000;
    p.backoff_max_ms = 60000;
    cg_remote *r = open_ok(p);
    redisContext *c = adm(g_srv.port);
    /* 30,000 elements of 12 bytes: about 570 kB of reply, none over the bound alone */
    for (int i = 0; i < 30; i++) {
        const char *argv[1002];
        size_t lens[1002];
        argv[0] = "RPUSH";
        argv[1] = "small-list";
        for (int k = 0; k < 1000; k++)
            argv[2 + k] = "element-0123";
        for (int k = 0; k < 1002; k++)
            lens[k] = strlen(argv[k]);
        redisReply *rep = redisCommandArgv(c, 1002, argv, lens);
        ck_assert(rep && rep->type == REDIS_REPLY_INTEGER);
        freeReplyObject(rep);
    }
    freeReplyObject(cmd(c, "SET fine-value 1234"));
    redisFree(c);
    const char *argv[] = {"LRANGE", "small-list", "0", "-1"};
    size_t lens[] = {6, 10, 1, 2};
    struct redisReply *out = NULL;
    ck_assert_int_eq(cg_remote_command(r, 4, argv, lens, 1, 0, &out), CG_E_BAD_GATEWAY);
    ck_assert_ptr_null(out);
    /* a short range of the same list, and a plain GET, go through at once */
    const char *few[] = {"LRANGE", "small-list", "0", "9"};
    size_t few_lens[] = {6, 10, 1, 1};
    ck_assert_int_eq(cg_remote_command(r, 4, few, few_lens, 1, 0, &out), CG_OK);
    ck_assert_uint_eq(out->elements, 10);
    cg_remote_reply_free(&out);
    cg_remote_value v[1];
    const char *k[1] = {"fine-value"};
    ck_assert_int_eq(cg_remote_get(r, 1, k, v, NULL), CG_OK);
    cg_remote_values_free(r, v, 1);
    cg_remote_close(&r);
}
END_TEST

/* A chunk's heads as the remote tier stores them: keys, values of len bytes, in the shapes
 * cg_remote_set and cg_remote_get take. */
typedef struct chunk_kvs {
    char keys[8][CG_REMOTE_KEY_MAX];
    const char *kp[8];
    char *vals[8];
    const void *v[8]; /* vals, as the calls take them */
    size_t lens[8];
    unsigned heads;
} chunk_kvs;

static void chunk_values(chunk_kvs *c, unsigned chunk, unsigned heads, size_t len, unsigned salt)
{
    ck_assert_uint_le(heads, 8);
    c->heads = heads;
    for (unsigned h = 0; h < heads; h++) {
        chunk_key(c->keys[h], chunk, h, salt);
        c->kp[h] = c->keys[h];
        c->vals[h] = make_value(chunk * 100 + h + salt, len);
        c->v[h] = c->vals[h];
        c->lens[h] = len;
    }
}

/* Frees the values; the keys stay. */
static void free_vals(chunk_kvs *c)
{
    for (unsigned i = 0; i < c->heads; i++)
        free(c->vals[i]);
}

/* Checks that a chunk is stored (1) or absent (0) with the expected bytes. */
static void expect_chunk(cg_remote *r, unsigned chunk, unsigned heads, size_t len, unsigned salt,
                         int present)
{
    chunk_kvs kvs;
    chunk_values(&kvs, chunk, heads, len, salt);
    cg_remote_value out[8];
    cg_status st = cg_remote_get(r, heads, kvs.kp, out, NULL);
    ck_assert_msg(st == (present ? CG_OK : CG_E_NOT_FOUND), "chunk %u: %s", chunk,
                  cg_status_name(st));
    for (unsigned h = 0; present && h < heads; h++) {
        ck_assert_uint_eq(out[h].len, len);
        ck_assert_int_eq(memcmp(out[h].data, kvs.vals[h], len), 0);
    }
    if (present) cg_remote_values_free(r, out, heads);
    free_vals(&kvs);
}

/* Stores chunk's heads (chunk_values) with cg_remote_set, or with cg_remote_put_async when async
 * is set; returns the status. */
static cg_status store_chunk(cg_remote *r, unsigned chunk, unsigned heads, size_t len,
                             unsigned salt, int async)
{
    chunk_kvs kvs;
    chunk_values(&kvs, chunk, heads, len, salt);
    cg_status st = async ? cg_remote_put_async(r, heads, kvs.kp, kvs.v, kvs.lens)
                         : cg_remote_set(r, heads, kvs.kp, kvs.v, kvs.lens);
    free_vals(&kvs);
    return st;
}

START_TEST(node_write_behind_drops_and_flushes)
{
    char url[64];
    cg_remote_params p = node_params(url, sizeof url, NULL);
    p.timeout_ms = 5000;
    p.queue_max_items = 4;
    p.queue_max_bytes = 1 << 20;
    cg_remote *r = open_ok(p);
    enum { HEADS = 2, LEN = 50000 };
    chunk_kvs kvs;

    /* Redis stopped: the writer takes chunk 0 and waits for its reply; the queue fills. */
    kill(g_srv.pid, SIGSTOP);
    ck_assert_int_eq(store_chunk(r, 0, HEADS, LEN, 0xb, 1), CG_OK);
    for (int i = 0; i < 200 && stats(r).queue_writing == 0; i++)
        th_sleep_ms(10);
    ck_assert_uint_eq(stats(r).queue_writing, 1);
    double worst = 0;
    for (unsigned c = 1; c <= 6; c++) {
        chunk_values(&kvs, c, HEADS, LEN, 0xb);
        uint64_t t0 = cg_now_ns();
        cg_status st = cg_remote_put_async(r, HEADS, kvs.kp, kvs.v, kvs.lens);
        worst = CG_MAX(worst, ms_since(t0));
        ck_assert_int_eq(st, c <= 3 ? CG_OK : CG_E_FULL);
        free_vals(&kvs);
    }
    printf("remote: put_async against a stopped Redis: slowest call %.3f ms\n", worst);
    cg_remote_stats s = stats(r);
    ck_assert_uint_eq(s.queue_drops, 3);
    ck_assert_uint_eq(s.queue_depth, 4);
    ck_assert_uint_eq(s.queue_bytes, 4 * (HEADS * (LEN + strlen(kvs.kp[0]) + 1)));
    ck_assert_int_eq(cg_remote_flush(r, 50), CG_E_TIMEOUT);
    /* A chunk larger than the byte bound is dropped too. */
    char *huge = make_value(1, 2 << 20);
    size_t hl = 2 << 20;
    ck_assert_int_eq(cg_remote_put_async(r, 1, kvs.kp, (const void *const *)&huge, &hl),
                     CG_E_VALUE);
    free(huge);
    ck_assert_uint_eq(stats(r).queue_drops, 4);

    kill(g_srv.pid, SIGCONT);
    ck_assert_int_eq(cg_remote_flush(r, 10000), CG_OK);
    s = stats(r);
    ck_assert_uint_eq(s.queue_depth, 0);
    ck_assert_uint_eq(s.queue_bytes, 0);
    ck_assert_uint_eq(s.queue_failed, 0);
    ck_assert_uint_eq(s.queue_puts, 4);
    ck_assert_uint_eq(s.sets, 4 * HEADS);
    for (unsigned c = 0; c <= 6; c++)
        expect_chunk(r, c, HEADS, LEN, 0xb, c <= 3);
    cg_remote_close(&r);
}
END_TEST

START_TEST(node_close_drains_queue)
{
    char url[64];
    cg_remote_params p = node_params(url, sizeof url, NULL);
    cg_remote *r = open_ok(p);
    enum { HEADS = 4, LEN = 10000, CHUNKS = 40 };
    for (unsigned c = 0; c < CHUNKS; c++)
        ck_assert_int_eq(store_chunk(r, c, HEADS, LEN, 0xc, 1), CG_OK);
    cg_remote_close(&r); /* drains within drain_ms */
    r = open_ok(p);
    for (unsigned c = 0; c < CHUNKS; c++)
        expect_chunk(r, c, HEADS, LEN, 0xc, 1);
    ck_assert_uint_eq(stats(r).errors, 0);
    cg_remote_close(&r);
}
END_TEST

/* Traffic (set + get of a small chunk) in a loop, each call's status and time recorded. */
typedef struct traffic {
    cg_remote *r;
    int stop;
    uint64_t killed_ns, restarted_ns; /* set by the main thread; 0 until then */
    uint64_t calls, ok_in_outage, errs_in_outage, calls_in_outage, ok_after;
    double worst_ms, worst_outage_ms;
} traffic;

static void *traffic_main(void *arg)
{
    traffic *t = arg;
    unsigned i = 0;
    while (!__atomic_load_n(&t->stop, __ATOMIC_ACQUIRE)) {
        chunk_kvs kvs;
        chunk_values(&kvs, i % 50, 2, 4096, 0xd);
        uint64_t t0 = cg_now_ns();
        cg_status st = cg_remote_set(t->r, 2, kvs.kp, kvs.v, kvs.lens);
        cg_remote_value out[2];
        cg_status st2 = st == CG_OK ? cg_remote_get(t->r, 2, kvs.kp, out, NULL) : st;
        if (st2 == CG_OK) cg_remote_values_free(t->r, out, 2);
        uint64_t t1 = cg_now_ns();
        free_vals(&kvs);
        double ms = (double)(t1 - t0) / 1e6 / (st == CG_OK ? 2 : 1);
        uint64_t k = __atomic_load_n(&t->killed_ns, __ATOMIC_ACQUIRE);
        uint64_t rs = __atomic_load_n(&t->restarted_ns, __ATOMIC_ACQUIRE);
        t->worst_ms = CG_MAX(t->worst_ms, ms);
        if (k && t0 > k && (!rs || t1 < rs)) {
            t->calls_in_outage++;
            t->worst_outage_ms = CG_MAX(t->worst_outage_ms, ms);
            if (st2 == CG_OK)
                t->ok_in_outage++;
            else
                t->errs_in_outage++;
        }
        if (rs && t0 > rs && st2 == CG_OK) __atomic_fetch_add(&t->ok_after, 1, __ATOMIC_RELAXED);
        t->calls++;
        i++;
        if (st != CG_OK) th_sleep_ms(5);
    }
    return NULL;
}

START_TEST(node_killed_mid_traffic_recovers)
{
    char url[64];
    cg_remote_params p = node_params(url, sizeof url, NULL);
    p.timeout_ms = 500;
    p.backoff_min_ms = 100;
    p.backoff_max_ms = 400;
    cg_remote *r = open_ok(p);
    traffic t = {.r = r};
    pthread_t th[2];
    traffic t2 = {.r = r};
    ck_assert_int_eq(pthread_create(&th[0], NULL, traffic_main, &t), 0);
    ck_assert_int_eq(pthread_create(&th[1], NULL, traffic_main, &t2), 0);
    th_sleep_ms(300);
    srv_kill(&g_srv);
    uint64_t k = cg_now_ns();
    __atomic_store_n(&t.killed_ns, k, __ATOMIC_RELEASE);
    __atomic_store_n(&t2.killed_ns, k, __ATOMIC_RELEASE);
    th_sleep_ms(1200);
    cg_remote_stats mid = stats(r);
    uint64_t rs = cg_now_ns();
    __atomic_store_n(&t.restarted_ns, rs, __ATOMIC_RELEASE);
    __atomic_store_n(&t2.restarted_ns, rs, __ATOMIC_RELEASE);
    srv_spawn(&g_srv); /* same port, empty (no persistence) */
    uint64_t back = 0;
    for (int i = 0; i < 300 && !back; i++) {
        if (__atomic_load_n(&t.ok_after, __ATOMIC_RELAXED) &&
            __atomic_load_n(&t2.ok_after, __ATOMIC_RELAXED))
            back = cg_now_ns();
        else
            th_sleep_ms(10);
    }
    __atomic_store_n(&t.stop, 1, __ATOMIC_RELEASE);
    __atomic_store_n(&t2.stop, 1, __ATOMIC_RELEASE);
    pthread_join(th[0], NULL);
    pthread_join(th[1], NULL);
    cg_remote_stats s = stats(r);
    printf(
        "remote: kill -9 mid-traffic: %llu calls in the outage, all failed; slowest %.1f ms "
        "(timeout 500); errors %llu (unavailable %llu, timeout %llu), fast fails %llu, "
        "connect attempts failed %llu; traffic back %.0f ms after the restart, reconnects %llu\n",
        (unsigned long long)(t.calls_in_outage + t2.calls_in_outage),
        CG_MAX(t.worst_outage_ms, t2.worst_outage_ms), (unsigned long long)mid.errors,
        (unsigned long long)mid.errors_unavailable, (unsigned long long)mid.errors_timeout,
        (unsigned long long)mid.fast_fails, (unsigned long long)mid.connect_failures,
        back ? (double)(back - rs) / 1e6 : -1.0, (unsigned long long)s.reconnects);
    ck_assert_uint_gt(t.calls_in_outage, 0);
    ck_assert_uint_eq(t.ok_in_outage + t2.ok_in_outage, 0);
    ck_assert_uint_gt(mid.errors, 0);
    ck_assert_uint_gt(mid.fast_fails, 0);
    ck_assert_uint_gt(mid.connect_failures, 0);
    ck_assert_double_lt(CG_MAX(t.worst_ms, t2.worst_ms), 500 + 2500); /* no hang */
    ck_assert_msg(back != 0, "no successful call after the restart");
    ck_assert_uint_ge(s.reconnects, 1);
    cg_remote_close(&r);
}
END_TEST

START_TEST(node_stopped_costs_the_timeout)
{
    char url[64];
    cg_remote_params p = node_params(url, sizeof url, NULL);
    p.timeout_ms = 300;
    p.backoff_min_ms = 1000; /* the second call lands inside it even on a loaded machine */
    cg_remote *r = open_ok(p);
    chunk_kvs kvs;
    chunk_values(&kvs, 1, 2, 1000, 0xe);
    ck_assert_int_eq(cg_remote_set(r, 2, kvs.kp, kvs.v, kvs.lens), CG_OK);
    free_vals(&kvs);

    kill(g_srv.pid, SIGSTOP);
    cg_remote_value out[2];
    uint64_t ns = 0, ns2 = 0;
    ck_assert_int_eq(cg_remote_get(r, 2, kvs.kp, out, &ns), CG_E_TIMEOUT);
    ck_assert_int_eq(cg_remote_get(r, 2, kvs.kp, out, &ns2), CG_E_UNAVAILABLE);
    printf("remote: SIGSTOPped Redis: first get CG_E_TIMEOUT after %.1f ms (timeout 300), the "
           "next fails fast in %.3f ms\n",
           (double)ns / 1e6, (double)ns2 / 1e6);
    ck_assert_uint_lt(ns, 3000ull * 1000000);  /* hang detector */
    ck_assert_uint_lt(ns2, 1000ull * 1000000); /* no network wait inside the backoff */
    cg_remote_stats s = stats(r);
    ck_assert_uint_eq(s.errors_timeout, 1);
    ck_assert_uint_eq(s.errors_unavailable, 1);
    ck_assert_uint_eq(s.fast_fails, 1);

    kill(g_srv.pid, SIGCONT);
    cg_status st = CG_E_UNAVAILABLE;
    uint64_t t0 = cg_now_ns();
    while (st != CG_OK && ms_since(t0) < 8000) {
        st = cg_remote_get(r, 2, kvs.kp, out, NULL);
        if (st != CG_OK) th_sleep_ms(20);
    }
    ck_assert_int_eq(st, CG_OK);
    cg_remote_values_free(r, out, 2);
    printf("remote: SIGCONT: served again after %.0f ms\n", ms_since(t0));
    ck_assert_uint_ge(stats(r).reconnects, 1);
    cg_remote_close(&r);
}
END_TEST

/* Several reader threads and the writer (put_async + sync sets) on a small pool. */
typedef struct rd_arg {
    cg_remote *r;
    int stop;
    uint64_t reads, hits, bad;
} rd_arg;

enum { CC_HEADS = 2, CC_PRELOAD = 16 };
/* Chunk sizes mix values read through the parser and large ones received in place. */
static size_t cc_len(unsigned c)
{
    return c % 3 == 0 ? 100000 : 20000;
}

static void *reader_main(void *arg)
{
    rd_arg *a = arg;
    unsigned i = (unsigned)(uintptr_t)a;
    while (!__atomic_load_n(&a->stop, __ATOMIC_ACQUIRE)) {
        unsigned c = (i++ * 7) % (CC_PRELOAD + 32); /* preloaded, or being written */
        chunk_kvs kvs;
        chunk_values(&kvs, c, CC_HEADS, cc_len(c), 0xf);
        cg_remote_value out[CC_HEADS];
        cg_status st = cg_remote_get(a->r, CC_HEADS, kvs.kp, out, NULL);
        a->reads++;
        if (st == CG_OK) {
            a->hits++;
            for (unsigned h = 0; h < CC_HEADS; h++)
                if (out[h].len != cc_len(c) || memcmp(out[h].data, kvs.vals[h], cc_len(c)))
                    a->bad++;
            cg_remote_values_free(a->r, out, CC_HEADS);
        } else if (st != CG_E_NOT_FOUND || c < CC_PRELOAD) {
            a->bad++;
        }
        free_vals(&kvs);
    }
    return NULL;
}

START_TEST(node_concurrent_readers_and_writer)
{
    char url[64];
    cg_remote_params p = node_params(url, sizeof url, NULL);
    p.conns_per_node = 2; /* fewer connections than threads: they wait for each other */
    p.timeout_ms = 10000;
    cg_remote *r = open_ok(p);
    for (unsigned c = 0; c < CC_PRELOAD; c++)
        ck_assert_int_eq(store_chunk(r, c, CC_HEADS, cc_len(c), 0xf, 0), CG_OK);
    enum { READERS = 4 };
    rd_arg a[READERS];
    pthread_t th[READERS];
    for (int i = 0; i < READERS; i++) {
        a[i] = (rd_arg){.r = r};
        ck_assert_int_eq(pthread_create(&th[i], NULL, reader_main, &a[i]), 0);
    }
    for (unsigned c = CC_PRELOAD; c < CC_PRELOAD + 32; c++) {
        ck_assert_int_eq(store_chunk(r, c, CC_HEADS, cc_len(c), 0xf, c % 2), CG_OK);
        th_sleep_ms(20);
    }
    ck_assert_int_eq(cg_remote_flush(r, 10000), CG_OK);
    th_sleep_ms(200);
    uint64_t reads = 0, hits = 0;
    for (int i = 0; i < READERS; i++) {
        __atomic_store_n(&a[i].stop, 1, __ATOMIC_RELEASE);
        pthread_join(th[i], NULL);
        ck_assert_uint_eq(a[i].bad, 0);
        reads += a[i].reads;
        hits += a[i].hits;
    }
    cg_remote_stats s = stats(r);
    printf("remote: %d readers + writer: %llu reads, %llu hits, %llu errors\n", READERS,
           (unsigned long long)reads, (unsigned long long)hits, (unsigned long long)s.errors);
    ck_assert_uint_eq(s.errors, 0);
    ck_assert_uint_gt(hits, 0);
    ck_assert_uint_eq(s.gets, reads);
    ck_assert_uint_le(s.connects, 2);
    for (unsigned c = 0; c < CC_PRELOAD + 32; c++)
        expect_chunk(r, c, CC_HEADS, cc_len(c), 0xf, 1);
    cg_remote_close(&r);
}
END_TEST

/* ---- a 3-master cluster ------------------------------------------------------------------- */

static char g_cl_dir[64];
static int g_cl_port; /* first port; masters at +0, +1, +2 */
static int g_cl_up;

static void cluster_setup(void)
{
    if (!g_redis_cli[0]) return;
    snprintf(g_cl_dir, sizeof g_cl_dir, "/tmp/cg_remote_cl_XXXXXX");
    if (!mkdtemp(g_cl_dir)) return;
    g_cl_port = pick_ports(3, 1);
    char cmdline[512];
    snprintf(cmdline, sizeof cmdline, "%s/tests/redis_cluster.sh start %s %d 3 >%s/start.out 2>&1",
             CG_SOURCE_DIR, g_cl_dir, g_cl_port, g_cl_dir);
    uint64_t t0 = cg_now_ns();
    g_cl_up = system(cmdline) == 0;
    printf("remote: cluster of 3 masters on ports %d-%d %s in %.1f s\n", g_cl_port, g_cl_port + 2,
           g_cl_up ? "up" : "FAILED to start", ms_since(t0) / 1000);
}

static void cluster_teardown(void)
{
    if (!g_cl_dir[0]) return;
    char cmdline[512];
    snprintf(cmdline, sizeof cmdline, "%s/tests/redis_cluster.sh stop %s; rm -rf %s", CG_SOURCE_DIR,
             g_cl_dir, g_cl_dir);
    if (system(cmdline) != 0) fprintf(stderr, "cluster stop failed\n");
}

static cg_remote *cluster_open(cg_remote_params *pp)
{
    ck_assert_msg(g_cl_up, "the cluster did not start (see %s)", g_cl_dir);
    static char url[64];
    snprintf(url, sizeof url, "redis+cluster://127.0.0.1:%d", g_cl_port);
    cg_remote_params p = pp ? *pp : cg_remote_default_params();
    p.url = url;
    if (!pp) p.timeout_ms = 3000;
    return open_ok(p);
}

static void cluster_flush(void)
{
    for (int i = 0; i < 3; i++) {
        redisContext *c = adm(g_cl_port + i);
        cmd_ok(c, "FLUSHALL");
        redisFree(c);
    }
}

START_TEST(cluster_batches_spread_over_masters)
{
    cluster_flush();
    cg_remote *r = cluster_open(NULL);
    enum { CHUNKS = 50, HEADS = 2, LEN = 20000 };
    for (unsigned c = 0; c < CHUNKS; c++) /* half written behind, half at once */
        ck_assert_int_eq(store_chunk(r, c, HEADS, LEN, 0x10, c % 2), CG_OK);
    ck_assert_int_eq(cg_remote_flush(r, 10000), CG_OK);
    for (unsigned c = 0; c < CHUNKS; c++)
        expect_chunk(r, c, HEADS, LEN, 0x10, 1);

    /* One batch spanning every chunk: grouped by node, pipelined, all three in parallel. */
    char(*bk)[CG_REMOTE_KEY_MAX] = cg_malloc((size_t)CHUNKS * HEADS * CG_REMOTE_KEY_MAX);
    const char *bp[CHUNKS * HEADS];
    for (unsigned c = 0; c < CHUNKS; c++)
        for (unsigned h = 0; h < HEADS; h++) {
            chunk_key(bk[c * HEADS + h], c, h, 0x10);
            bp[c * HEADS + h] = bk[c * HEADS + h];
        }
    cg_remote_value *out = cg_calloc(CHUNKS * HEADS, sizeof *out);
    uint64_t ns = 0;
    ck_assert_int_eq(cg_remote_get(r, CHUNKS * HEADS, bp, out, &ns), CG_OK);
    for (unsigned i = 0; i < CHUNKS * HEADS; i++)
        ck_assert_uint_eq(out[i].len, LEN);
    cg_remote_values_free(r, out, CHUNKS * HEADS);
    free(out);
    printf("remote: cluster batch of %d values (%d bytes) in %.2f ms\n", CHUNKS * HEADS,
           CHUNKS * HEADS * LEN, (double)ns / 1e6);

    long long per[3], sum = 0;
    redisContext *c0 = adm(g_cl_port);
    for (int i = 0; i < 3; i++) {
        redisContext *c = adm(g_cl_port + i);
        per[i] = cmd_int(c, "DBSIZE");
        sum += per[i];
        redisFree(c);
    }
    printf("remote: %d keys over the masters: %lld / %lld / %lld\n", CHUNKS * HEADS, per[0], per[1],
           per[2]);
    ck_assert_int_eq(sum, CHUNKS * HEADS);
    for (int i = 0; i < 3; i++)
        ck_assert_int_gt(per[i], 0);
    /* Our slots agree with the server's. */
    for (unsigned i = 0; i < CHUNKS * HEADS; i++)
        ck_assert_int_eq(cmd_int(c0, "CLUSTER KEYSLOT %s", bp[i]),
                         (long long)cg_remote_key_slot(bp[i], strlen(bp[i])));
    redisFree(c0);
    cg_remote_stats s = stats(r);
    ck_assert_uint_eq(s.errors, 0);
    ck_assert_uint_eq(s.redirects_moved + s.redirects_ask, 0);
    ck_assert_uint_ge(s.nodes, 3);
    ck_assert_int_eq(cg_remote_ping(r), CG_OK);
    size_t deleted = 0;
    ck_assert_int_eq(cg_remote_del(r, 2, bp, &deleted), CG_OK);
    ck_assert_uint_eq(deleted, 2);
    free(bk);
    cg_remote_close(&r);
}
END_TEST

static void node_id(int port, char *out, size_t cap)
{
    redisContext *c = adm(port);
    redisReply *rep = cmd(c, "CLUSTER MYID");
    ck_assert_int_eq(rep->type, REDIS_REPLY_STRING);
    snprintf(out, cap, "%s", rep->str);
    freeReplyObject(rep);
    redisFree(c);
}

/* Port of the master that holds key (EXISTS), -1 if none. */
static int owner_port(const char *key)
{
    int owner = -1;
    for (int i = 0; i < 3; i++) {
        redisContext *c = adm(g_cl_port + i);
        redisReply *rep = redisCommand(c, "EXISTS %s", key);
        if (rep && rep->type == REDIS_REPLY_INTEGER && rep->integer == 1) owner = g_cl_port + i;
        if (rep) freeReplyObject(rep);
        redisFree(c);
    }
    return owner;
}

START_TEST(cluster_ask_and_moved_during_migration)
{
    cluster_flush();
    cg_remote *r = cluster_open(NULL);
    enum { HEADS = 2, LEN = 3000 };
    chunk_kvs kvs;
    chunk_values(&kvs, 7, HEADS, LEN, 0x11);
    ck_assert_int_eq(cg_remote_set(r, HEADS, kvs.kp, kvs.v, kvs.lens), CG_OK);
    free_vals(&kvs);
    expect_chunk(r, 7, HEADS, LEN, 0x11, 1); /* the client's map is loaded and right */

    const char *key = kvs.kp[0];
    unsigned slot = cg_remote_key_slot(key, strlen(key));
    int a = owner_port(key);
    ck_assert_int_gt(a, 0);
    int b = a == g_cl_port ? g_cl_port + 1 : g_cl_port;
    char ida[64], idb[64];
    node_id(a, ida, sizeof ida);
    node_id(b, idb, sizeof idb);
    redisContext *ca = adm(a), *cb = adm(b);
    cmd_ok(cb, "CLUSTER SETSLOT %u IMPORTING %s", slot, ida);
    cmd_ok(ca, "CLUSTER SETSLOT %u MIGRATING %s", slot, idb);
    cmd_ok(ca, "MIGRATE 127.0.0.1 %d %s 0 5000", b, key);

    /* Slot still owned by A, key now on B: A answers ASK, the client asks B. */
    cg_remote_stats s0 = stats(r);
    expect_chunk(r, 7, HEADS, LEN, 0x11, 1);
    cg_remote_stats s1 = stats(r);
    ck_assert_uint_eq(s1.redirects_ask - s0.redirects_ask, 1);
    ck_assert_uint_eq(s1.redirects_moved, s0.redirects_moved);
    /* A write to the migrated key follows the ASK too, and lands on B. */
    chunk_values(&kvs, 7, HEADS, LEN, 0x11);
    ck_assert_int_eq(cg_remote_set(r, 1, kvs.kp, kvs.v, kvs.lens), CG_OK);
    free_vals(&kvs);
    cmd_ok(cb, "ASKING");
    ck_assert_int_eq(cmd_int(cb, "EXISTS %s", key), 1);
    redisReply *ask = cmd(ca, "EXISTS %s", key);
    ck_assert_int_eq(ask->type, REDIS_REPLY_ERROR); /* not on A any more: A answers ASK */
    ck_assert_int_eq(strncmp(ask->str, "ASK ", 4), 0);
    freeReplyObject(ask);

    /* Finish the migration: every other key of the slot moves, then the slot goes to B. */
    for (;;) {
        redisReply *ks = cmd(ca, "CLUSTER GETKEYSINSLOT %u 100", slot);
        size_t n = ks->elements;
        for (size_t i = 0; i < n; i++)
            cmd_ok(ca, "MIGRATE 127.0.0.1 %d %s 0 5000", b, ks->element[i]->str);
        freeReplyObject(ks);
        if (!n) break;
    }
    cmd_ok(cb, "CLUSTER SETSLOT %u NODE %s", slot, idb);
    cmd_ok(ca, "CLUSTER SETSLOT %u NODE %s", slot, idb);
    for (int i = 0; i < 3; i++) {
        if (g_cl_port + i == a || g_cl_port + i == b) continue;
        redisContext *cc = adm(g_cl_port + i);
        cmd_ok(cc, "CLUSTER SETSLOT %u NODE %s", slot, idb);
        redisFree(cc);
    }
    redisFree(ca);
    redisFree(cb);

    /* The client's map still says A: A answers MOVED, the client updates the slot and retries. */
    expect_chunk(r, 7, HEADS, LEN, 0x11, 1);
    cg_remote_stats s2 = stats(r);
    ck_assert_uint_eq(s2.redirects_moved - s1.redirects_moved, 1);
    /* The map is right now: no more redirects. */
    expect_chunk(r, 7, HEADS, LEN, 0x11, 1);
    cg_remote_stats s3 = stats(r);
    ck_assert_uint_eq(s3.redirects_moved, s2.redirects_moved);
    ck_assert_uint_eq(s3.redirects_ask, s2.redirects_ask);
    ck_assert_uint_eq(s3.errors, 0);
    /* The MOVED also asked for a whole-map refresh, done by a call once backoff_min_ms has
     * passed since the last one. */
    th_sleep_ms(150);
    ck_assert_int_eq(cg_remote_ping(r), CG_OK);
    s3 = stats(r);
    ck_assert_uint_ge(s3.map_refreshes, 2);
    printf("remote: migration of slot %u from :%d to :%d: ASK %llu, MOVED %llu, map refreshes "
           "%llu\n",
           slot, a, b, (unsigned long long)s3.redirects_ask, (unsigned long long)s3.redirects_moved,
           (unsigned long long)s3.map_refreshes);

    /* A client whose first map is stale gets there too. */
    cg_remote *r2 = cluster_open(NULL);
    expect_chunk(r2, 7, HEADS, LEN, 0x11, 1);
    ck_assert_uint_eq(stats(r2).errors, 0);
    cg_remote_close(&r2);
    cg_remote_close(&r);
}
END_TEST

/* Runs last: kills one master. Chunks on the others keep being served; the rest fail fast. */
START_TEST(cluster_master_killed)
{
    cluster_flush();
    cg_remote_params p = cg_remote_default_params();
    p.timeout_ms = 500;
    cg_remote *r = cluster_open(&p);
    enum { CHUNKS = 30, HEADS = 2, LEN = 1000 };
    chunk_kvs kvs;
    int on_dead[CHUNKS];
    int dead = g_cl_port + 2;
    for (unsigned c = 0; c < CHUNKS; c++) {
        chunk_values(&kvs, c, HEADS, LEN, 0x12);
        ck_assert_int_eq(cg_remote_set(r, HEADS, kvs.kp, kvs.v, kvs.lens), CG_OK);
        free_vals(&kvs);
        on_dead[c] = owner_port(kvs.kp[0]) == dead || owner_port(kvs.kp[1]) == dead;
    }
    char pidfile[128];
    snprintf(pidfile, sizeof pidfile, "%s/node-%d/redis.pid", g_cl_dir, dead);
    FILE *f = fopen(pidfile, "r");
    ck_assert_ptr_nonnull(f);
    int pid = 0;
    ck_assert_int_eq(fscanf(f, "%d", &pid), 1);
    fclose(f);
    ck_assert_int_eq(kill(pid, SIGKILL), 0);
    th_sleep_ms(100);
    int served = 0, failed = 0;
    double worst = 0;
    for (int round = 0; round < 3; round++)
        for (unsigned c = 0; c < CHUNKS; c++) {
            chunk_values(&kvs, c, HEADS, LEN, 0x12);
            cg_remote_value out[HEADS];
            uint64_t ns = 0;
            cg_status st = cg_remote_get(r, HEADS, kvs.kp, out, &ns);
            worst = CG_MAX(worst, (double)ns / 1e6);
            if (on_dead[c]) {
                ck_assert_msg(st == CG_E_UNAVAILABLE || st == CG_E_TIMEOUT, "chunk %u: %s", c,
                              cg_status_name(st));
                failed++;
            } else {
                ck_assert_msg(st == CG_OK, "chunk %u: %s", c, cg_status_name(st));
                ck_assert_int_eq(memcmp(out[0].data, kvs.vals[0], LEN), 0);
                cg_remote_values_free(r, out, HEADS);
                served++;
            }
            free_vals(&kvs);
        }
    printf("remote: one master killed: %d gets served by the others, %d failed; slowest %.1f ms "
           "(timeout 500)\n",
           served, failed, worst);
    ck_assert_int_gt(served, 0);
    ck_assert_int_gt(failed, 0);
    ck_assert_double_lt(worst, 500 + 2500); /* hang detector */
    cg_remote_close(&r);
}
END_TEST

int main(void)
{
    signal(SIGPIPE, SIG_IGN);
    int have_server = th_which("redis-server", g_redis_server, sizeof g_redis_server);
    th_which("redis-cli", g_redis_cli, sizeof g_redis_cli);

    Suite *su = suite_create("remote");
    th_case(su, "unit", 0,
            TH_TESTS(url_parsing, key_slots_and_keys, password_loading, open_validates_params,
                     down_at_start_fails_fast, backoff_doubles_to_its_cap, wrong_replies_are_errors,
                     extra_replies_never_served, silent_server_times_out,
                     bad_cluster_maps_fail_open));
    if (have_server)
        tcase_add_checked_fixture(
            th_case(su, "node", 120,
                    TH_TESTS(node_round_trips, node_database_selection, node_ttl, node_auth,
                             node_wrong_type_and_size, node_reply_of_many_small_elements_is_bounded,
                             node_write_behind_drops_and_flushes, node_close_drains_queue,
                             node_killed_mid_traffic_recovers, node_stopped_costs_the_timeout,
                             node_concurrent_readers_and_writer)),
            node_setup, node_teardown);
    if (have_server && g_redis_cli[0])
        tcase_add_unchecked_fixture(
            th_case(su, "cluster", 120,
                    TH_TESTS(cluster_batches_spread_over_masters,
                             cluster_ask_and_moved_during_migration, cluster_master_killed)),
            cluster_setup, cluster_teardown);
    int failed = th_run(su, CK_FORK_GETENV); /* CK_RUN_CASE=node|cluster|unit runs one case */
    if (failed) return EXIT_FAILURE;
    if (!have_server) {
        printf("SKIP: redis-server not found on PATH (apt-get install redis-server): only the "
               "unit and fake-server cases ran\n");
        return SKIP_CODE;
    }
    if (!g_redis_cli[0]) {
        printf("SKIP: redis-cli not found on PATH (apt-get install redis-tools): the cluster "
               "cases did not run\n");
        return SKIP_CODE;
    }
    return EXIT_SUCCESS;
}

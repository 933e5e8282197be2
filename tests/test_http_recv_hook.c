/* The recv() hook (hook/http_recv_hook.c) in a process that links it, as chunkgate and
 * chunkgate-worker do: the dynamic linker binds every library's recv() to it; libcurl's reads
 * (an HTTP fetch over loopback) and hiredis' reads (PING, SET, GET against a real redis-server
 * on a free loopback port) come through byte for byte and are not counted as guarded; and, as
 * the control that shows libcurl's reads do pass through the hook, the same reads on a
 * descriptor the guard table holds are handed to the check. Exits 77 (skip) when redis-server is
 * missing, after the libcurl cases. */
#include <check.h>
#include <curl/curl.h>
#include <dlfcn.h>
#include <hiredis/hiredis.h>
#include <netinet/in.h>
#include <pthread.h>
#include <signal.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/socket.h>
#include <sys/wait.h>
#include <unistd.h>
#include "tests/harness/harness.h"
#include "base/http_guard.h"

#define SKIP_CODE 77
#define BODY_BYTES (3u << 20) /* many reads: more than any socket buffer */

/* What the guard saw on the descriptors that name this tally as their connection. */
typedef struct tally {
    size_t bytes;
    int calls;
} tally;

static ssize_t tally_check(void *conn, void *buf, size_t n)
{
    tally *t = conn;
    t->bytes += n;
    t->calls++;
    return (ssize_t)n; /* the bytes go on to the reader unchanged */
}

static ssize_t tally_refused(void *conn)
{
    return 0;
}

static int tally_is_refused(void *conn)
{
    return 0;
}

static const cg_http_guard_ops TALLY_OPS = {tally_check, tally_refused, tally_is_refused};

/* n pseudo-random bytes, every byte value among them (NULs and CRLFs included). Caller frees. */
static unsigned char *pattern(size_t n, uint64_t seed)
{
    unsigned char *p = malloc(n);
    ck_assert_ptr_nonnull(p);
    for (size_t i = 0; i < n; i += 8) {
        uint64_t v = th_splitmix64(&seed);
        memcpy(p + i, &v, n - i < 8 ? n - i : 8);
    }
    return p;
}

/* ------------------------------------------------------------ libcurl */

/* A one-route HTTP server on a loopback port: answers each of n_conns connections with body. */
typedef struct http_srv {
    int fd, port, n_conns;
    const unsigned char *body;
    size_t len;
    pthread_t th;
} http_srv;

static void *http_serve(void *arg)
{
    http_srv *s = arg;
    for (int i = 0; i < s->n_conns; i++) {
        int c = accept(s->fd, NULL, NULL);
        if (c < 0) break;
        char head[4096];
        size_t got = 0;
        while (got < sizeof head - 1) { /* read() is not the hook: the server side is plain */
            ssize_t k = read(c, head + got, sizeof head - 1 - got);
            if (k <= 0) break;
            got += (size_t)k;
            head[got] = '\0';
            if (strstr(head, "\r\n\r\n")) break;
        }
        char status[128];
        int n =
            snprintf(status, sizeof status,
                     "HTTP/1.1 200 OK\r\nContent-Length: %zu\r\nConnection: close\r\n\r\n", s->len);
        if (th_send_all(c, status, (size_t)n) == 0) (void)th_send_all(c, s->body, s->len);
        close(c);
    }
    return NULL;
}

static void http_start(http_srv *s, const unsigned char *body, size_t len, int n_conns)
{
    s->fd = socket(AF_INET, SOCK_STREAM, 0);
    ck_assert_int_ge(s->fd, 0);
    struct sockaddr_in sa = {0};
    sa.sin_family = AF_INET;
    sa.sin_addr.s_addr = htonl(INADDR_LOOPBACK);
    socklen_t sl = sizeof sa;
    ck_assert_int_eq(bind(s->fd, (struct sockaddr *)&sa, sizeof sa), 0);
    ck_assert_int_eq(getsockname(s->fd, (struct sockaddr *)&sa, &sl), 0);
    ck_assert_int_eq(listen(s->fd, 4), 0);
    s->port = ntohs(sa.sin_port);
    s->body = body;
    s->len = len;
    s->n_conns = n_conns;
    ck_assert_int_eq(pthread_create(&s->th, NULL, http_serve, s), 0);
}

static void http_stop(http_srv *s)
{
    pthread_join(s->th, NULL);
    close(s->fd);
}

typedef struct fetched {
    unsigned char *data;
    size_t len;
    tally *guard; /* not NULL: the fetch's socket is put in the guard table with this tally */
} fetched;

static size_t on_data(char *p, size_t size, size_t n, void *arg)
{
    fetched *f = arg;
    f->data = realloc(f->data, f->len + n + 1);
    ck_assert_ptr_nonnull(f->data);
    memcpy(f->data + f->len, p, n);
    f->len += n;
    return n;
}

static int on_socket(void *arg, curl_socket_t fd, curlsocktype purpose)
{
    fetched *f = arg;
    if (f->guard) cg_http_guard_set(fd, f->guard);
    return CURL_SOCKOPT_OK;
}

static int on_close(void *arg, curl_socket_t fd)
{
    fetched *f = arg;
    if (f->guard) cg_http_guard_set(fd, NULL);
    return close(fd);
}

/* GETs / from port into f with libcurl; returns the HTTP status. */
static long curl_fetch(int port, fetched *f)
{
    CURL *h = curl_easy_init();
    ck_assert_ptr_nonnull(h);
    char url[64];
    snprintf(url, sizeof url, "http://127.0.0.1:%d/", port);
    curl_easy_setopt(h, CURLOPT_URL, url);
    curl_easy_setopt(h, CURLOPT_WRITEFUNCTION, on_data);
    curl_easy_setopt(h, CURLOPT_WRITEDATA, f);
    curl_easy_setopt(h, CURLOPT_SOCKOPTFUNCTION, on_socket);
    curl_easy_setopt(h, CURLOPT_SOCKOPTDATA, f);
    curl_easy_setopt(h, CURLOPT_CLOSESOCKETFUNCTION, on_close);
    curl_easy_setopt(h, CURLOPT_CLOSESOCKETDATA, f);
    curl_easy_setopt(h, CURLOPT_TIMEOUT, 30L);
    CURLcode rc = curl_easy_perform(h);
    ck_assert_msg(rc == CURLE_OK, "curl: %s", curl_easy_strerror(rc));
    long status = 0;
    curl_easy_getinfo(h, CURLINFO_RESPONSE_CODE, &status);
    curl_easy_cleanup(h);
    return status;
}

/* The libraries bind recv() to the program's definition, not libc's: the premise of the cases
 * below, and of the framing check in the two programs. */
START_TEST(libraries_bind_recv_to_the_hook)
{
    void *bound = dlsym(RTLD_DEFAULT, "recv");
    void *libc = dlsym(RTLD_NEXT, "recv");
    ck_assert_ptr_nonnull(bound);
    ck_assert_ptr_nonnull(libc);
    ck_assert_ptr_eq(bound, (void *)recv);
    ck_assert_ptr_ne(bound, libc);
}
END_TEST

START_TEST(curl_reads_pass_through)
{
    unsigned char *body = pattern(BODY_BYTES, 21);
    http_srv s;
    http_start(&s, body, BODY_BYTES, 2);

    /* not guarded: the plain system call, nothing reaches the check */
    unsigned long long seen = cg_http_guard_bytes();
    fetched plain = {0};
    ck_assert_int_eq(curl_fetch(s.port, &plain), 200);
    ck_assert_uint_eq(plain.len, BODY_BYTES);
    ck_assert_msg(!memcmp(plain.data, body, BODY_BYTES), "libcurl read other bytes than sent");
    ck_assert_uint_eq(cg_http_guard_bytes(), seen);

    /* the control: the same fetch with its socket guarded reaches the check, every byte */
    tally t = {0};
    fetched guarded = {.guard = &t};
    ck_assert_int_eq(curl_fetch(s.port, &guarded), 200);
    ck_assert_uint_eq(guarded.len, BODY_BYTES);
    ck_assert(!memcmp(guarded.data, body, BODY_BYTES));
    ck_assert_uint_gt(t.bytes, BODY_BYTES); /* the status line and headers too */
    ck_assert_uint_eq(cg_http_guard_bytes(), seen + t.bytes);

    http_stop(&s);
    free(plain.data);
    free(guarded.data);
    free(body);
}
END_TEST

/* ------------------------------------------------------------ hiredis */

static char *g_redis_dir;
static pid_t g_redis_pid = -1;
static int g_redis_port;

static void redis_setup(void)
{
    g_redis_dir = th_mkdtemp("recv_hook");
    g_redis_port = th_free_port();
    g_redis_pid = th_redis_start(g_redis_port, g_redis_dir);
    ck_assert_msg(g_redis_pid > 0, "redis-server did not come up on port %d", g_redis_port);
}

static void redis_teardown(void)
{
    if (g_redis_pid > 0) {
        kill(g_redis_pid, SIGTERM);
        waitpid(g_redis_pid, NULL, 0);
    }
    g_redis_pid = -1;
    th_rmdtemp(g_redis_dir);
    g_redis_dir = NULL;
}

/* GET key on c; asserts the reply is the n bytes of want. */
static void expect_get(redisContext *c, const char *key, const unsigned char *want, size_t n)
{
    redisReply *r = redisCommand(c, "GET %s", key);
    ck_assert_msg(r != NULL, "GET: %s", c->errstr);
    ck_assert_int_eq(r->type, REDIS_REPLY_STRING);
    ck_assert_uint_eq(r->len, n);
    ck_assert_msg(!memcmp(r->str, want, n), "hiredis read other bytes than stored");
    freeReplyObject(r);
}

START_TEST(hiredis_reads_pass_through)
{
    struct timeval tv = {10, 0};
    redisContext *c = redisConnectWithTimeout("127.0.0.1", g_redis_port, tv);
    ck_assert_msg(c && !c->err, "connect: %s", c ? c->errstr : "no memory");
    unsigned char *value = pattern(BODY_BYTES, 77);
    unsigned long long seen = cg_http_guard_bytes();

    redisReply *r = redisCommand(c, "PING");
    ck_assert_ptr_nonnull(r);
    ck_assert_int_eq(r->type, REDIS_REPLY_STATUS);
    ck_assert_str_eq(r->str, "PONG");
    freeReplyObject(r);
    r = redisCommand(c, "SET %s %b", "hook:value", value, (size_t)BODY_BYTES);
    ck_assert_ptr_nonnull(r);
    ck_assert_int_eq(r->type, REDIS_REPLY_STATUS);
    ck_assert_str_eq(r->str, "OK");
    freeReplyObject(r);
    expect_get(c, "hook:value", value, BODY_BYTES);
    ck_assert_uint_eq(cg_http_guard_bytes(), seen);

    /* the control: the same GET on a guarded descriptor. hiredis 1.x reads with recv(), so
     * the check sees every byte; 0.14 (Debian 12) reads with read(), which the hook does not
     * define, so the check sees none. */
    tally t = {0};
    cg_http_guard_set(c->fd, &t);
    expect_get(c, "hook:value", value, BODY_BYTES);
    cg_http_guard_set(c->fd, NULL);
#if HIREDIS_MAJOR >= 1
    ck_assert_uint_gt(t.bytes, BODY_BYTES); /* the bulk string's length line too */
#else
    ck_assert_uint_eq(t.bytes, 0);
#endif
    ck_assert_uint_eq(cg_http_guard_bytes(), seen + t.bytes);

    redisFree(c);
    free(value);
}
END_TEST

int main(void)
{
    signal(SIGPIPE, SIG_IGN);
    if (cg_http_guard_init(&TALLY_OPS) != 0) {
        fprintf(stderr, "no memory for the guard's descriptor table\n");
        return EXIT_FAILURE;
    }
    curl_global_init(CURL_GLOBAL_DEFAULT);
    char redis[512];
    int have_redis = th_which("redis-server", redis, sizeof redis);

    Suite *su = suite_create("http_recv_hook");
    th_case(su, "curl", 60, TH_TESTS(libraries_bind_recv_to_the_hook, curl_reads_pass_through));
    if (have_redis)
        tcase_add_checked_fixture(th_case(su, "hiredis", 60, TH_TESTS(hiredis_reads_pass_through)),
                                  redis_setup, redis_teardown);
    int failed = th_run(su, CK_FORK_GETENV);
    curl_global_cleanup();
    if (failed) return EXIT_FAILURE;
    if (!have_redis) {
        printf("SKIP: redis-server not found on PATH (apt-get install redis-server): the hiredis "
               "case did not run\n");
        return SKIP_CODE;
    }
    return EXIT_SUCCESS;
}

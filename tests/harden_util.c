/* Helpers shared by the hardening suites: processes, libcurl requests, metrics, raw sockets. */
#include "tests/harden_util.h"

#include <errno.h>
#include <fcntl.h>
#include <ftw.h>
#include <grp.h>
#include <netinet/in.h>
#include <poll.h>
#include <signal.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/prctl.h>
#include <sys/socket.h>
#include <sys/stat.h>
#include <sys/wait.h>
#include <time.h>
#include <unistd.h>

static char root[256];

void hu_init(const char *name)
{
    signal(SIGPIPE, SIG_IGN);
    curl_global_init(CURL_GLOBAL_DEFAULT);
    snprintf(root, sizeof root, "/tmp/cg_%s_XXXXXX", name);
    if (!mkdtemp(root)) abort();
    chmod(root, 0755); /* processes running as nobody must reach their own directories */
}

const char *hu_root(void)
{
    return root;
}

static int rm_entry(const char *path, const struct stat *st, int flag, struct FTW *ftw)
{
    (void)st;
    (void)flag;
    (void)ftw;
    return remove(path);
}

void hu_rmrf(const char *path)
{
    nftw(path, rm_entry, 16, FTW_DEPTH | FTW_PHYS);
}

void hu_cleanup(int keep)
{
    if (keep || getenv("CG_KEEP_TMP")) {
        fprintf(stderr, "logs kept in %s\n", root);
        return;
    }
    hu_rmrf(root);
}

void hu_sleep_ms(int ms)
{
    struct timespec ts = {ms / 1000, (long)(ms % 1000) * 1000000L};
    while (nanosleep(&ts, &ts) != 0 && errno == EINTR) {
    }
}

double hu_now_s(void)
{
    return (double)cg_now_ns() / 1e9;
}

char *hu_read_file(const char *path)
{
    FILE *f = fopen(path, "rb");
    if (!f) return cg_strdup("");
    cg_buf b;
    cg_buf_init(&b, 0);
    char tmp[8192];
    size_t n;
    while ((n = fread(tmp, 1, sizeof tmp, f)) > 0)
        if (cg_buf_append(&b, tmp, n) != CG_OK) break;
    fclose(f);
    return b.data ? b.data : cg_strdup("");
}

int hu_write_file(const char *path, const char *text)
{
    FILE *f = fopen(path, "wb");
    if (!f) return -1;
    size_t n = strlen(text);
    int ok = fwrite(text, 1, n, f) == n;
    return fclose(f) == 0 && ok ? 0 : -1;
}

int hu_free_port(void)
{
    int fd = socket(AF_INET, SOCK_STREAM, 0);
    struct sockaddr_in sa = {0};
    sa.sin_family = AF_INET;
    sa.sin_addr.s_addr = htonl(0x7f000001);
    if (bind(fd, (struct sockaddr *)&sa, sizeof sa) != 0) abort();
    socklen_t len = sizeof sa;
    getsockname(fd, (struct sockaddr *)&sa, &len);
    close(fd);
    return ntohs(sa.sin_port);
}

/* ------------------------------------------------------------ processes */

int hu_spawn(hu_proc *p, const char *bin, const char *const *args, const char *const *env,
             const char *logname, const char *marker, int as_nobody)
{
    char *argv[80];
    int argc = 0;
    argv[argc++] = (char *)bin;
    for (; args && *args && argc < 78; args++)
        argv[argc++] = (char *)*args;
    argv[argc] = NULL;
    snprintf(p->log, sizeof p->log, "%s/%s", root, logname);
    p->port = 0;
    /* Empty the log first, so a restart never reads the previous run's port. */
    int tfd = open(p->log, O_WRONLY | O_CREAT | O_TRUNC, 0666);
    if (tfd >= 0) {
        fchmod(tfd, 0666);
        close(tfd);
    }
    fflush(NULL);
    pid_t pid = fork();
    if (pid < 0) return -1;
    if (pid == 0) {
        prctl(PR_SET_PDEATHSIG, SIGKILL); /* never outlive the test */
        int fd = open(p->log, O_WRONLY | O_CREAT | O_TRUNC, 0666);
        dup2(fd, 1);
        dup2(fd, 2);
        close(fd);
        for (; env && *env; env++)
            putenv((char *)*env);
        if (as_nobody && geteuid() == 0) {
            /* root ignores file permissions: run as nobody to see them apply */
            if (setgroups(0, NULL) != 0 || setgid(65534) != 0 || setuid(65534) != 0) _exit(126);
        }
        execv(bin, argv);
        _exit(127);
    }
    p->pid = pid;
    if (!marker) return 0;
    for (int i = 0; i < 3000; i++) { /* 60 s: sanitizer and valgrind builds start slowly */
        char *text = hu_read_file(p->log);
        const char *m = strstr(text, marker);
        if (m) {
            p->port = atoi(m + strlen(marker));
            free(text);
            return p->port > 0 ? 0 : -1;
        }
        free(text);
        int st;
        if (waitpid(pid, &st, WNOHANG) == pid) {
            p->pid = 0;
            return -1;
        }
        hu_sleep_ms(20);
    }
    return -1;
}

static int status_of(int st)
{
    return WIFEXITED(st) ? WEXITSTATUS(st) : 128 + WTERMSIG(st);
}

int hu_wait_exit(hu_proc *p, int timeout_ms)
{
    if (p->pid <= 0) return -1;
    for (int waited = 0; waited <= timeout_ms; waited += 10) {
        int st;
        if (waitpid(p->pid, &st, WNOHANG) == p->pid) {
            p->pid = 0;
            return status_of(st);
        }
        hu_sleep_ms(10);
    }
    return -1;
}

int hu_stop(hu_proc *p, int sig)
{
    if (p->pid <= 0) return -1;
    kill(p->pid, sig);
    int rc = hu_wait_exit(p, 20000);
    if (rc >= 0) return rc;
    kill(p->pid, SIGKILL);
    waitpid(p->pid, NULL, 0);
    p->pid = 0;
    return -1;
}

int hu_failures;

int hu_stop_clean(hu_proc *p, const char *what)
{
    int rc = hu_stop(p, SIGTERM);
    char *log = hu_read_file(p->log);
    int report = strstr(log, "AddressSanitizer") || strstr(log, "LeakSanitizer") ||
                 strstr(log, "runtime error:");
    if (rc != 0 || report) {
        fprintf(stderr, "%s: exit status %d%s; log %s\n", what, rc,
                report ? ", with a sanitizer report" : "", p->log);
        hu_failures++;
    }
    free(log);
    return rc == 0 && !report;
}

int hu_gen_model(const char *worker_bin, const char *dir)
{
    hu_proc gen;
    const char *args[] = {"generate-model", "--out", dir, NULL};
    if (hu_spawn(&gen, worker_bin, args, NULL, "gen.log", NULL, 0) != 0) return -1;
    return hu_wait_exit(&gen, 60000) == 0 ? 0 : -1;
}

int hu_start_worker(hu_proc *p, const char *worker_bin, const char *model_dir, int port,
                    const char *name, const char *const *extra)
{
    char listen[64], data[400], log[128];
    snprintf(listen, sizeof listen, "127.0.0.1:%d", port);
    snprintf(data, sizeof data, "%s/%s-data", root, name);
    snprintf(log, sizeof log, "%s.log", name);
    const char *args[64] = {"serve",      "--model", model_dir,   "--listen", listen,
                            "--data-dir", data,      "--pool-mb", "64"};
    int n = 9;
    for (; extra && *extra && n < 62; extra++)
        args[n++] = *extra;
    args[n] = NULL;
    return hu_spawn(p, worker_bin, args, NULL, log, "\"msg\":\"listening on 127.0.0.1:", 0);
}

int hu_start_gateway(hu_proc *p, const char *gateway_bin, const char *name,
                     const char *const *extra)
{
    char data[400], log[128];
    snprintf(data, sizeof data, "%s/%s-data", root, name);
    snprintf(log, sizeof log, "%s.log", name);
    const char *args[64] = {"--listen", "127.0.0.1:0", "--data-dir", data};
    int n = 4;
    for (; extra && *extra && n < 62; extra++)
        args[n++] = *extra;
    args[n] = NULL;
    return hu_spawn(p, gateway_bin, args, NULL, log, "listening on 127.0.0.1:", 0);
}

/* ------------------------------------------------------------ HTTP */

static size_t on_write(char *d, size_t sz, size_t n, void *ud)
{
    cg_buf *b = ud;
    return cg_buf_append(b, d, sz * n) == CG_OK ? sz * n : 0;
}

void hu_http(hu_resp *r, int port, const char *method, const char *path, const char *body,
             const char *token, const char *const *headers)
{
    memset(r, 0, sizeof *r);
    cg_buf_init(&r->body, 0);
    cg_buf_init(&r->head, 0);
    CURL *e = curl_easy_init();
    char url[1024], auth[512];
    snprintf(url, sizeof url, "http://127.0.0.1:%d%s", port, path);
    curl_easy_setopt(e, CURLOPT_URL, url);
    curl_easy_setopt(e, CURLOPT_NOSIGNAL, 1L);
    curl_easy_setopt(e, CURLOPT_TIMEOUT, 120L);
    curl_easy_setopt(e, CURLOPT_WRITEFUNCTION, on_write);
    curl_easy_setopt(e, CURLOPT_WRITEDATA, &r->body);
    curl_easy_setopt(e, CURLOPT_HEADERFUNCTION, on_write);
    curl_easy_setopt(e, CURLOPT_HEADERDATA, &r->head);
    struct curl_slist *h = curl_slist_append(NULL, "Expect:");
    h = curl_slist_append(h, "Content-Type: application/json");
    if (token) {
        snprintf(auth, sizeof auth, "Authorization: Bearer %s", token);
        h = curl_slist_append(h, auth);
    }
    for (; headers && *headers; headers++)
        h = curl_slist_append(h, *headers);
    curl_easy_setopt(e, CURLOPT_HTTPHEADER, h);
    if (body) {
        curl_easy_setopt(e, CURLOPT_POSTFIELDS, body);
        curl_easy_setopt(e, CURLOPT_POSTFIELDSIZE_LARGE, (curl_off_t)strlen(body));
    }
    curl_easy_setopt(e, CURLOPT_CUSTOMREQUEST, method);
    double t0 = hu_now_s();
    r->rc = curl_easy_perform(e);
    r->secs = hu_now_s() - t0;
    curl_easy_getinfo(e, CURLINFO_RESPONSE_CODE, &r->status);
    curl_slist_free_all(h);
    curl_easy_cleanup(e);
}

void hu_resp_free(hu_resp *r)
{
    cg_buf_free(&r->body);
    cg_buf_free(&r->head);
}

json_t *hu_json(const hu_resp *r)
{
    return json_loadb(r->body.data ? r->body.data : "", r->body.len, 0, NULL);
}

int hu_is_error(const hu_resp *r, long status, const char *code)
{
    if (r->status != status) return 0;
    json_t *j = hu_json(r);
    json_t *e = json_object_get(j, "error");
    int ok = json_is_object(e) && json_string_length(json_object_get(e, "message")) > 0 &&
             json_is_string(json_object_get(e, "type")) && json_object_get(e, "param") &&
             json_is_string(json_object_get(e, "code")) &&
             !strcmp(json_string_value(json_object_get(e, "code")), code);
    json_decref(j);
    return ok;
}

double hu_metric(int port, const char *series)
{
    hu_resp r;
    hu_http(&r, port, "GET", "/metrics", NULL, NULL, NULL);
    double v = -1;
    size_t n = strlen(series);
    const char *t = r.body.data ? r.body.data : "";
    for (const char *p = t; (p = strstr(p, series)) != NULL; p += n)
        if ((p == t || p[-1] == '\n') && p[n] == ' ') {
            v = atof(p + n + 1);
            break;
        }
    hu_resp_free(&r);
    return v;
}

int hu_wait_worker(int gport, const char *token, const char *url, int healthy)
{
    for (int i = 0; i < 1500; i++) {
        hu_resp r;
        hu_http(&r, gport, "GET", "/v1/workers", NULL, token, NULL);
        json_t *j = hu_json(&r);
        hu_resp_free(&r);
        size_t k;
        json_t *w;
        int ok = 0;
        json_array_foreach(json_object_get(j, "data"), k, w)
        {
            const char *u = json_string_value(json_object_get(w, "url"));
            if (u && !strcmp(u, url) && json_is_true(json_object_get(w, "healthy")) == !!healthy)
                ok = 1;
        }
        json_decref(j);
        if (ok) return 1;
        hu_sleep_ms(20);
    }
    return 0;
}

/* ------------------------------------------------------------ SSE */

typedef struct sse_acc {
    cg_buf raw;
} sse_acc;

CURLcode hu_sse(int port, const char *path, const char *body, const char *token, long *status,
                char ***events, int *n_events)
{
    hu_resp r;
    hu_http(&r, port, "POST", path, body, token, NULL);
    *status = r.status;
    *events = NULL;
    *n_events = 0;
    /* Blocks are separated by a blank line; keep the data lines of each. */
    const char *p = r.body.data ? r.body.data : "";
    while (*p) {
        const char *end = strstr(p, "\n\n");
        size_t len = end ? (size_t)(end - p) : strlen(p);
        if (!strncmp(p, "data: ", 6)) {
            *events = cg_realloc(*events, (size_t)(*n_events + 1) * sizeof **events);
            (*events)[(*n_events)++] = cg_strndup(p + 6, len - 6);
        }
        p += len + (end ? 2 : 0);
    }
    CURLcode rc = r.rc;
    hu_resp_free(&r);
    return rc;
}

void hu_sse_free(char **events, int n)
{
    for (int i = 0; i < n; i++)
        free(events[i]);
    free(events);
}

/* ------------------------------------------------------------ raw sockets */

int hu_connect(int port)
{
    int fd = socket(AF_INET, SOCK_STREAM, 0);
    if (fd < 0) return -1;
    struct sockaddr_in sa = {0};
    sa.sin_family = AF_INET;
    sa.sin_port = htons((uint16_t)port);
    sa.sin_addr.s_addr = htonl(0x7f000001);
    if (connect(fd, (struct sockaddr *)&sa, sizeof sa) != 0) {
        close(fd);
        return -1;
    }
    return fd;
}

int hu_send(int fd, const void *p, size_t n)
{
    const char *c = p;
    while (n) {
        ssize_t k = send(fd, c, n, MSG_NOSIGNAL);
        if (k < 0 && errno == EINTR) continue;
        if (k <= 0) return -1;
        c += k;
        n -= (size_t)k;
    }
    return 0;
}

char *hu_recv(int fd, int timeout_ms, size_t max, int *closed)
{
    cg_buf b;
    cg_buf_init(&b, 0);
    *closed = 0;
    double deadline = hu_now_s() + timeout_ms / 1000.0;
    while (b.len < max) {
        int left = (int)((deadline - hu_now_s()) * 1000);
        if (left <= 0) break;
        struct pollfd pf = {fd, POLLIN, 0};
        int k = poll(&pf, 1, left);
        if (k <= 0) break;
        char tmp[4096];
        ssize_t n = recv(fd, tmp, sizeof tmp, 0);
        if (n <= 0) {
            *closed = 1;
            break;
        }
        if (cg_buf_append(&b, tmp, (size_t)n) != CG_OK) break;
    }
    return b.data ? b.data : cg_strdup("");
}

char *hu_recv_response(int fd, int timeout_ms)
{
    cg_buf b;
    cg_buf_init(&b, 0);
    double deadline = hu_now_s() + timeout_ms / 1000.0;
    for (;;) {
        const char *end = b.data ? strstr(b.data, "\r\n\r\n") : NULL;
        if (end) {
            const char *cl = strcasestr(b.data, "\r\nContent-Length:");
            size_t want =
                (size_t)(end - b.data) + 4 + (cl && cl < end ? strtoul(cl + 17, NULL, 10) : 0);
            if (b.len >= want) break;
        }
        int left = (int)((deadline - hu_now_s()) * 1000);
        if (left <= 0) break;
        struct pollfd pf = {fd, POLLIN, 0};
        if (poll(&pf, 1, left) <= 0) break;
        char tmp[4096];
        ssize_t n = recv(fd, tmp, sizeof tmp, 0);
        if (n <= 0) break;
        if (cg_buf_append(&b, tmp, (size_t)n) != CG_OK) break;
    }
    return b.data ? b.data : cg_strdup("");
}

/* Test harness: settings, the temporary directory, files, and the real binaries as child
 * processes (spawn, port from the log, stop, sanitizer reports, the worker and gateway). */
#include "tests/harness/harness.h"

#include <errno.h>
#include <fcntl.h>
#include <ftw.h>
#include <grp.h>
#include <signal.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/prctl.h>
#include <sys/stat.h>
#include <sys/wait.h>
#include <time.h>
#include <unistd.h>

static char root[256];
static th_params params = {60000, 120, 120};

th_params th_default_params(void)
{
    th_params p = {.start_wait_ms = 60000, .http_timeout_s = 120, .sse_timeout_s = 120};
    return p;
}

void th_init(const char *name, const th_params *p)
{
    signal(SIGPIPE, SIG_IGN);
    curl_global_init(CURL_GLOBAL_DEFAULT);
    params = th_default_params();
    if (p && p->start_wait_ms) params.start_wait_ms = p->start_wait_ms;
    if (p && p->http_timeout_s) params.http_timeout_s = p->http_timeout_s;
    if (p && p->sse_timeout_s) params.sse_timeout_s = p->sse_timeout_s;
    snprintf(root, sizeof root, "/tmp/cg_%s_XXXXXX", name);
    if (!mkdtemp(root)) abort();
    chmod(root, 0755); /* processes running as nobody must reach their own directories */
}

const th_params *th_params_now(void)
{
    return &params;
}

const char *th_root(void)
{
    return root;
}

char *th_path(char *out, size_t n, const char *name)
{
    snprintf(out, n, "%s/%s", root, name);
    return out;
}

static int rm_entry(const char *path, const struct stat *st, int flag, struct FTW *ftw)
{
    (void)st;
    (void)flag;
    (void)ftw;
    return remove(path);
}

void th_rmrf(const char *path)
{
    nftw(path, rm_entry, 16, FTW_DEPTH | FTW_PHYS);
}

int th_logs_have_sanitizer_reports(void)
{
    char cmd[600];
    snprintf(cmd, sizeof cmd,
             "grep -l -E 'AddressSanitizer|LeakSanitizer|runtime error:' %s/*.log >&2", th_root());
    if (system(cmd) != 0) return 0;
    fprintf(stderr, "sanitizer reports in the logs above\n");
    return 1;
}

void th_cleanup(int keep)
{
    if (keep || getenv("CG_KEEP_TMP")) {
        fprintf(stderr, "logs kept in %s\n", root);
        return;
    }
    th_rmrf(root);
}

char *th_mkdtemp(const char *name)
{
    char tmpl[256];
    snprintf(tmpl, sizeof tmpl, "/tmp/cg_%s_XXXXXX", name);
    if (!mkdtemp(tmpl)) abort();
    return cg_strdup(tmpl);
}

void th_rmdtemp(char *path)
{
    if (!path) return;
    th_rmrf(path);
    free(path);
}

char *th_read_file(const char *path, size_t *len)
{
    cg_buf b;
    cg_buf_init_unbounded(&b);
    FILE *f = fopen(path, "rb");
    if (f) {
        char tmp[8192];
        size_t n;
        while ((n = fread(tmp, 1, sizeof tmp, f)) > 0)
            if (cg_buf_append(&b, tmp, n) != CG_OK) break;
        fclose(f);
    }
    if (len) *len = b.len;
    return b.data ? b.data : cg_strdup("");
}

int th_write_bytes(const char *path, const void *p, size_t n)
{
    FILE *f = fopen(path, "wb");
    if (!f) return -1;
    int ok = fwrite(p, 1, n, f) == n;
    return fclose(f) == 0 && ok ? 0 : -1;
}

int th_write_file(const char *path, const char *text)
{
    return th_write_bytes(path, text, strlen(text));
}

int th_file_has(const char *path, const char *needle)
{
    char *text = th_read_file(path, NULL);
    int found = strstr(text, needle) != NULL;
    free(text);
    return found;
}

int th_which(const char *name, char *out, size_t n)
{
    const char *p = getenv("PATH");
    const char *s = p ? p : "/usr/bin:/bin";
    while (*s) {
        const char *e = strchr(s, ':');
        size_t len = e ? (size_t)(e - s) : strlen(s);
        snprintf(out, n, "%.*s/%s", (int)len, s, name);
        if (len && access(out, X_OK) == 0) return 1;
        s += len + (e != NULL);
    }
    if (n) out[0] = '\0';
    return 0;
}

uint64_t th_splitmix64(uint64_t *state)
{
    uint64_t z = (*state += 0x9e3779b97f4a7c15ull);
    z = (z ^ (z >> 30)) * 0xbf58476d1ce4e5b9ull;
    z = (z ^ (z >> 27)) * 0x94d049bb133111ebull;
    return z ^ (z >> 31);
}

uint64_t th_xorshift64s(uint64_t *state)
{
    *state ^= *state >> 12;
    *state ^= *state << 25;
    *state ^= *state >> 27;
    return *state * 0x2545F4914F6CDD1Dull;
}

char *th_run_output(const char *cmd, size_t *len, int *code)
{
    *code = -1;
    FILE *p = popen(cmd, "r");
    if (!p) return NULL;
    cg_buf out;
    cg_buf_init_unbounded(&out);
    char chunk[65536];
    size_t n;
    while ((n = fread(chunk, 1, sizeof chunk, p)) > 0)
        if (cg_buf_append(&out, chunk, n) != CG_OK) abort();
    int rc = pclose(p);
    *code = WIFEXITED(rc) ? WEXITSTATUS(rc) : -1;
    if (len) *len = out.len;
    return out.data ? out.data : cg_strdup("");
}

static int cmp_double(const void *a, const void *b)
{
    double x = *(const double *)a, y = *(const double *)b;
    return x < y ? -1 : x > y;
}

double th_median(double *v, int n)
{
    qsort(v, (size_t)n, sizeof *v, cmp_double);
    return n % 2 ? v[n / 2] : (v[n / 2 - 1] + v[n / 2]) / 2;
}

double th_percentile(double *v, size_t n, double p)
{
    if (!n) return 0;
    qsort(v, n, sizeof *v, cmp_double);
    size_t i = (size_t)(p * (double)(n - 1) + 0.5);
    return v[i < n ? i : n - 1];
}

uint32_t th_lcg32(uint64_t *state)
{
    *state = *state * 6364136223846793005ull + 1442695040888963407ull;
    return (uint32_t)(*state >> 33);
}

char *th_words(size_t n, const char *prefix, uint64_t *state)
{
    static const char *words[] = {"the",     "valley", "rainfall", "gauge",    "council",
                                  "records", "annual", "report",   "members",  "harbour",
                                  "survey",  "data",   "changed",  "in",       "of",
                                  "and",     "was",    "were",     "replaced", "by",
                                  "after",   "town",   "ledger",   "vote",     "quorum"};
    char *s = cg_malloc(n + 1);
    size_t len = (size_t)snprintf(s, n + 1, "%s", prefix);
    while (len < n) {
        const char *w = words[th_lcg32(state) % CG_ARRAY_LEN(words)];
        size_t wl = strlen(w);
        for (size_t i = 0; i <= wl && len < n; i++)
            s[len++] = i < wl ? w[i] : ' ';
    }
    if (n) s[n - 1] = '.';
    s[n] = '\0';
    return s;
}

cg_key th_key_of(uint64_t i, uint64_t salt)
{
    cg_key k;
    uint64_t s = i * 2654435761ull + salt;
    uint64_t a = th_splitmix64(&s), b = th_splitmix64(&s);
    memcpy(k.b, &a, 8);
    memcpy(k.b + 8, &b, 8);
    return k;
}

uint64_t th_fnv1a(const void *p, size_t n)
{
    const unsigned char *c = p;
    uint64_t h = 14695981039346656037ull; /* the FNV-1a 64 offset basis */
    for (size_t i = 0; i < n; i++) {
        h ^= c[i];
        h *= 1099511628211ull;
    }
    return h;
}

uint64_t th_file_fnv1a(const char *path)
{
    ck_assert_msg(access(path, R_OK) == 0, "cannot open %s", path);
    size_t n;
    char *b = th_read_file(path, &n);
    uint64_t h = th_fnv1a(b, n);
    free(b);
    return h;
}

int th_flip_bytes(const char *path, size_t slot, size_t first, size_t step, size_t end,
                  uint8_t mask)
{
    int fd = open(path, O_RDWR), slots = 0;
    struct stat sb;
    if (fd < 0 || fstat(fd, &sb) != 0) goto fail;
    uint8_t *buf = cg_malloc(end);
    for (off_t off = 0; off + (off_t)end <= sb.st_size; off += (off_t)slot) {
        if (pread(fd, buf, end, off) != (ssize_t)end) goto fail_buf;
        for (size_t i = first; i < end; i += step)
            buf[i] ^= mask;
        if (pwrite(fd, buf, end, off) != (ssize_t)end) goto fail_buf;
        slots++;
    }
    free(buf);
    close(fd);
    return slots;
fail_buf:
    free(buf);
fail:
    if (fd >= 0) close(fd);
    return -1;
}

void th_sleep_ms(int ms)
{
    struct timespec ts = {ms / 1000, (long)(ms % 1000) * 1000000L};
    while (nanosleep(&ts, &ts) != 0 && errno == EINTR) {
    }
}

double th_now_s(void)
{
    return (double)cg_now_ns() / 1e9;
}

/* ------------------------------------------------------------ processes */

int th_spawn(th_proc *p, const char *bin, const char *const *args, const char *const *env,
             const char *logname, const char *marker, int flags)
{
    char *argv[80];
    int argc = 0;
    argv[argc++] = (char *)bin;
    for (; args && *args && argc < 78; args++)
        argv[argc++] = (char *)*args;
    argv[argc] = NULL;
    memset(p, 0, sizeof *p);
    if (logname[0] == '/')
        snprintf(p->log, sizeof p->log, "%s", logname);
    else
        th_path(p->log, sizeof p->log, logname);
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
        if ((flags & TH_NOBODY) && geteuid() == 0) {
            /* root ignores file permissions: run as nobody to see them apply */
            if (setgroups(0, NULL) != 0 || setgid(65534) != 0 || setuid(65534) != 0) _exit(126);
        }
        execv(bin, argv);
        _exit(127);
    }
    p->pid = pid;
    if (!marker) return 0;
    /* sanitizer and valgrind builds start slowly */
    for (int waited = 0; waited < params.start_wait_ms; waited += 20) {
        char *text = th_read_file(p->log, NULL);
        const char *m = strstr(text, marker);
        if (m) {
            p->port = atoi(m + strlen(marker));
            free(text);
            snprintf(p->url, sizeof p->url, "http://127.0.0.1:%d", p->port);
            return p->port > 0 ? 0 : -1;
        }
        free(text);
        if (waitpid(pid, &p->wstatus, WNOHANG) == pid) {
            p->pid = 0;
            return -1;
        }
        th_sleep_ms(20);
    }
    return -1;
}

static int status_of(int st)
{
    return WIFEXITED(st) ? WEXITSTATUS(st) : 128 + WTERMSIG(st);
}

int th_wait_exit(th_proc *p, int timeout_ms)
{
    if (p->pid <= 0) return -1;
    for (int waited = 0; waited <= timeout_ms; waited += 10) {
        if (waitpid(p->pid, &p->wstatus, WNOHANG) == p->pid) {
            p->pid = 0;
            return status_of(p->wstatus);
        }
        th_sleep_ms(10);
    }
    return -1;
}

int th_stop(th_proc *p, int sig)
{
    if (p->pid <= 0) return -1;
    kill(p->pid, sig);
    int rc = th_wait_exit(p, 20000);
    if (rc >= 0) return rc;
    kill(p->pid, SIGKILL);
    waitpid(p->pid, &p->wstatus, 0);
    p->pid = 0;
    return -1;
}

int th_failures;

int th_log_has_report(const th_proc *p)
{
    char *log = th_read_file(p->log, NULL);
    int report = strstr(log, "AddressSanitizer") || strstr(log, "LeakSanitizer") ||
                 strstr(log, "runtime error:");
    free(log);
    return report;
}

int th_stop_clean(th_proc *p, const char *what)
{
    int rc = th_stop(p, SIGTERM);
    int report = th_log_has_report(p);
    if (rc != 0 || report) {
        fprintf(stderr, "%s: exit status %d%s; log %s\n", what, rc,
                report ? ", with a sanitizer report" : "", p->log);
        th_failures++;
    }
    return rc == 0 && !report;
}

void th_die(const char *what, const th_proc *p)
{
    char *t = th_read_file(p->log, NULL);
    fprintf(stderr, "%s failed; log %s:\n%s\n", what, p->log, t);
    free(t);
    abort();
}

void th_omp_passive(char **argv)
{
    if (getenv("OMP_WAIT_POLICY")) return;
    setenv("OMP_WAIT_POLICY", "passive", 1);
    execv("/proc/self/exe", argv);
    fprintf(stderr, "%s: re-exec with OMP_WAIT_POLICY=passive: %s\n", argv[0], strerror(errno));
    exit(1);
}

int th_run_cmd(const char *bin, const char *const *args, const char *logname)
{
    th_proc p;
    if (th_spawn(&p, bin, args, NULL, logname, NULL, 0) != 0) return -1;
    int rc = th_wait_exit(&p, 60000);
    if (p.pid > 0) th_stop(&p, SIGKILL);
    return rc;
}

int th_gen_model(const char *worker_bin, const char *dir, const char *const *extra)
{
    const char *args[32] = {"generate-model", "--out", dir};
    int n = 3;
    for (; extra && *extra && n < 30; extra++)
        args[n++] = *extra;
    args[n] = NULL;
    return th_run_cmd(worker_bin, args, "gen.log") == 0 ? 0 : -1;
}

static int names(const char *const *extra, const char *flag)
{
    for (; extra && *extra; extra++)
        if (!strcmp(*extra, flag)) return 1;
    return 0;
}

/* args[0..n) then extra, then NULL; returns the count. */
static int with_extra(const char **args, int n, const char *const *extra)
{
    for (; extra && *extra && n < 62; extra++)
        args[n++] = *extra;
    args[n] = NULL;
    return n;
}

int th_start_worker(th_proc *p, const char *worker_bin, const char *model_dir, int port,
                    const char *name, const char *const *extra)
{
    char listen[64], data[400], log[128];
    snprintf(listen, sizeof listen, "127.0.0.1:%d", port);
    snprintf(data, sizeof data, "%s/%s-data", root, name);
    snprintf(log, sizeof log, "%s.log", name);
    const char *args[64] = {"serve", "--model", model_dir, "--listen", listen};
    int n = 5;
    if (!names(extra, "--data-dir")) args[n++] = "--data-dir", args[n++] = data;
    if (!names(extra, "--pool-mb")) args[n++] = "--pool-mb", args[n++] = "64";
    with_extra(args, n, extra);
    return th_spawn(p, worker_bin, args, NULL, log, "\"msg\":\"listening on 127.0.0.1:", 0);
}

int th_start_gateway(th_proc *p, const char *gateway_bin, const char *name,
                     const char *const *extra)
{
    char data[400], log[128];
    snprintf(data, sizeof data, "%s/%s-data", root, name);
    snprintf(log, sizeof log, "%s.log", name);
    const char *args[64] = {"--listen", "127.0.0.1:0"};
    int n = 2;
    if (!names(extra, "--data-dir")) args[n++] = "--data-dir", args[n++] = data;
    with_extra(args, n, extra);
    return th_spawn(p, gateway_bin, args, NULL, log, "listening on 127.0.0.1:", 0);
}

int th_start_gateway_to(th_proc *p, const char *gateway_bin, const char *name,
                        const char *worker_url, const char *token, const char *const *extra)
{
    const char *args[64] = {"--worker", worker_url};
    with_extra(args, 2, extra);
    if (th_start_gateway(p, gateway_bin, name, args) != 0) return -1;
    return th_wait_worker(p->port, token, worker_url, 1) ? 0 : -1;
}

int th_start_fake(th_proc *p, const char *fake_bin, const char *name, const char *const *args)
{
    char log[128];
    snprintf(log, sizeof log, "%s.log", name);
    return th_spawn(p, fake_bin, args, NULL, log, "PORT ", 0);
}

double th_cpu_seconds(pid_t pid)
{
    char path[64], buf[1024];
    snprintf(path, sizeof path, "/proc/%d/stat", (int)pid);
    FILE *f = fopen(path, "r");
    if (!f) return -1;
    size_t n = fread(buf, 1, sizeof buf - 1, f);
    fclose(f);
    buf[n] = '\0';
    const char *p = strrchr(buf, ')'); /* the command name may contain spaces */
    unsigned long ut = 0, st = 0;
    /* after ")": state ppid pgrp session tty tpgid flags minflt cminflt majflt cmajflt utime
     * stime */
    if (!p || sscanf(p + 2, "%*c %*d %*d %*d %*d %*d %*u %*u %*u %*u %*u %lu %lu", &ut, &st) != 2)
        return -1;
    return (double)(ut + st) / (double)sysconf(_SC_CLK_TCK);
}

int th_need(const char *name, const char *package, char *out, size_t n)
{
    if (th_which(name, out, n)) return 1;
    printf("SKIPPED: %s is not installed (Debian: %s)\n", name, package);
    return 0;
}

int th_init_with_model(const char *name, const char *worker_bin, char *model, size_t n)
{
    th_init(name, NULL);
    snprintf(model, n, "%s/model", th_root());
    if (th_gen_model(worker_bin, model, NULL) == 0) return 0;
    fprintf(stderr, "generate-model failed\n");
    return -1;
}

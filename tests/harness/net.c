/* Test harness: raw loopback sockets (free ports, silent listeners, send and receive bytes). */
#include "tests/harness/harness.h"

#include <errno.h>
#include <fcntl.h>
#include <signal.h>
#include <stdio.h>
#include <sys/prctl.h>
#include <sys/wait.h>
#include <netinet/in.h>
#include <poll.h>
#include <stdlib.h>
#include <string.h>
#include <sys/socket.h>
#include <unistd.h>

static struct sockaddr_in loopback(int port)
{
    struct sockaddr_in sa = {0};
    sa.sin_family = AF_INET;
    sa.sin_port = htons((uint16_t)port);
    sa.sin_addr.s_addr = htonl(INADDR_LOOPBACK);
    return sa;
}

/* A socket bound to a free loopback port (written to *port), or -1. */
static int bound(int type, int *port)
{
    int fd = socket(AF_INET, type, 0);
    if (fd < 0) return -1;
    struct sockaddr_in sa = loopback(0);
    socklen_t len = sizeof sa;
    if (bind(fd, (struct sockaddr *)&sa, sizeof sa) != 0 ||
        getsockname(fd, (struct sockaddr *)&sa, &len) != 0) {
        close(fd);
        return -1;
    }
    *port = ntohs(sa.sin_port);
    return fd;
}

int th_free_port(void)
{
    int port, fd = bound(SOCK_STREAM, &port);
    if (fd < 0) abort();
    close(fd);
    return port;
}

int th_port_free(int port)
{
    int fd = socket(AF_INET, SOCK_STREAM, 0);
    if (fd < 0) return 0;
    struct sockaddr_in sa = loopback(port);
    int ok = bind(fd, (struct sockaddr *)&sa, sizeof sa) == 0;
    close(fd);
    return ok;
}

pid_t th_redis_start(int port, const char *dir)
{
    /* formatted before the fork: a child of a threaded process may call only
     * async-signal-safe functions before it execs */
    char ps[16];
    snprintf(ps, sizeof ps, "%d", port);
    pid_t pid = fork();
    if (pid == 0) {
        prctl(PR_SET_PDEATHSIG, SIGKILL);
        int nul = open("/dev/null", O_RDWR);
        dup2(nul, 0);
        dup2(nul, 1);
        execlp("redis-server", "redis-server", "--port", ps, "--bind", "127.0.0.1", "--save", "",
               "--appendonly", "no", "--dir", dir, "--logfile", "redis.log", (char *)NULL);
        _exit(127);
    }
    for (int i = 0; pid > 0 && i < 600; i++) { /* up to 30 s on a busy machine */
        int fd = th_connect(port);
        if (fd >= 0) {
            int closed;
            char *r = th_send_all(fd, "PING\r\n", 6) == 0 ? th_recv(fd, 1000, 7, &closed) : NULL;
            int up = r && !strncmp(r, "+PONG", 5);
            free(r);
            close(fd);
            if (up) return pid;
        }
        if (waitpid(pid, NULL, WNOHANG) == pid) return -1;
        usleep(50000);
    }
    return -1;
}

int th_listen_silent(int *port)
{
    int fd = bound(SOCK_STREAM | SOCK_NONBLOCK, port);
    if (fd >= 0 && listen(fd, 16) != 0) {
        close(fd);
        return -1;
    }
    return fd;
}

int th_connect(int port)
{
    int fd = socket(AF_INET, SOCK_STREAM, 0);
    if (fd < 0) return -1;
    struct sockaddr_in sa = loopback(port);
    if (connect(fd, (struct sockaddr *)&sa, sizeof sa) != 0) {
        close(fd);
        return -1;
    }
    return fd;
}

int th_connect_small_rcvbuf(int port)
{
    int fd = socket(AF_INET, SOCK_STREAM, 0);
    ck_assert_int_ge(fd, 0);
    int small = 4096;
    ck_assert_int_eq(setsockopt(fd, SOL_SOCKET, SO_RCVBUF, &small, sizeof small), 0);
    struct sockaddr_in sa = loopback(port);
    ck_assert_int_eq(connect(fd, (struct sockaddr *)&sa, sizeof sa), 0);
    return fd;
}

int th_send_all(int fd, const void *p, size_t n)
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

void th_send_post(int fd, const char *path, const char *body)
{
    char head[512];
    int hl = snprintf(head, sizeof head,
                      "POST %s HTTP/1.1\r\nHost: x\r\nContent-Type: application/json\r\n"
                      "Content-Length: %zu\r\n\r\n",
                      path, strlen(body));
    ck_assert_int_lt(hl, (int)sizeof head);
    ck_assert_int_eq(th_send_all(fd, head, (size_t)hl), 0);
    ck_assert_int_eq(th_send_all(fd, body, strlen(body)), 0);
}

/* Waits until fd is readable or the deadline passes, then reads into b; returns the bytes
 * read, 0 at end of stream or on an error, -1 on timeout. */
static ssize_t recv_some(int fd, double deadline, cg_buf *b)
{
    int left = (int)((deadline - th_now_s()) * 1000);
    if (left <= 0) return -1;
    struct pollfd pf = {fd, POLLIN, 0};
    if (poll(&pf, 1, left) <= 0) return -1;
    char tmp[4096];
    ssize_t n = recv(fd, tmp, sizeof tmp, 0);
    if (n <= 0) return 0;
    return cg_buf_append(b, tmp, (size_t)n) == CG_OK ? n : -1;
}

char *th_recv(int fd, int timeout_ms, size_t max, int *closed)
{
    cg_buf b;
    cg_buf_init_unbounded(&b);
    *closed = 0;
    double deadline = th_now_s() + timeout_ms / 1000.0;
    while (b.len < max) {
        ssize_t n = recv_some(fd, deadline, &b);
        if (n == 0) *closed = 1;
        if (n <= 0) break;
    }
    return b.data ? b.data : cg_strdup("");
}

char *th_recv_response(int fd, int timeout_ms)
{
    cg_buf b;
    cg_buf_init_unbounded(&b);
    double deadline = th_now_s() + timeout_ms / 1000.0;
    for (;;) {
        const char *end = b.data ? strstr(b.data, "\r\n\r\n") : NULL;
        if (end) {
            const char *cl = strcasestr(b.data, "\r\nContent-Length:");
            size_t want =
                (size_t)(end - b.data) + 4 + (cl && cl < end ? strtoul(cl + 17, NULL, 10) : 0);
            if (b.len >= want) break;
        }
        if (recv_some(fd, deadline, &b) <= 0) break;
    }
    return b.data ? b.data : cg_strdup("");
}

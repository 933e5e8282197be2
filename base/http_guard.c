/* The framing check's descriptor table: which client connections base/http.c guards, and the
 * read that runs the check on them (cg_http_guard_recv). libmicrohttpd reads client sockets
 * with recv() and offers no hook to see those bytes first, so the two programs link
 * hook/http_recv_hook.c, which defines recv() as cg_http_guard_recv; this file defines no libc
 * function, and a program that does not link the hook reads as usual (the check then sees
 * nothing and libmicrohttpd's own checks apply). */
#include "base/http_guard.h"

#include <errno.h>
#include <pthread.h>
#include <stdatomic.h>
#include <stdlib.h>
#include <sys/resource.h>
#include <sys/socket.h>
#include <sys/syscall.h>
#include <unistd.h>

#define GUARD_FDS_MAX (1u << 20)

static _Atomic(void *) *guard_fds;
static atomic_size_t guard_n;
static atomic_ullong guard_seen;
static cg_http_guard_ops guard_ops;

int cg_http_guard_init(const cg_http_guard_ops *ops)
{
    static int done;
    static int rc;
    static pthread_mutex_t mu = PTHREAD_MUTEX_INITIALIZER;
    pthread_mutex_lock(&mu);
    if (!done) {
        done = 1;
        struct rlimit rl;
        size_t n = 65536;
        if (getrlimit(RLIMIT_NOFILE, &rl) == 0 && rl.rlim_max != RLIM_INFINITY)
            n = (size_t)rl.rlim_max;
        if (n < 1024) n = 1024;
        if (n > GUARD_FDS_MAX) n = GUARD_FDS_MAX;
        guard_ops = *ops;
        /* calloc'ed zero pages: only the pages of descriptors in use are ever touched */
        guard_fds = calloc(n, sizeof *guard_fds);
        if (guard_fds)
            atomic_store_explicit(&guard_n, n, memory_order_release);
        else
            rc = -1;
    }
    pthread_mutex_unlock(&mu);
    return rc;
}

void cg_http_guard_set(int fd, void *conn)
{
    size_t n = atomic_load_explicit(&guard_n, memory_order_acquire);
    if (fd >= 0 && (size_t)fd < n)
        atomic_store_explicit(&guard_fds[fd], conn, memory_order_release);
}

unsigned long long cg_http_guard_bytes(void)
{
    return atomic_load_explicit(&guard_seen, memory_order_relaxed);
}

ssize_t cg_http_guard_recv(int fd, void *buf, size_t len, int flags)
{
    size_t n = atomic_load_explicit(&guard_n, memory_order_acquire);
    void *conn = fd >= 0 && (size_t)fd < n
                     ? atomic_load_explicit(&guard_fds[fd], memory_order_acquire)
                     : NULL;
    if (conn && !(flags & MSG_PEEK) && guard_ops.is_refused(conn)) return guard_ops.refused(conn);
    ssize_t r = syscall(SYS_recvfrom, fd, buf, len, flags, NULL, NULL);
    if (r <= 0 || !conn || (flags & MSG_PEEK)) return r;
    atomic_fetch_add_explicit(&guard_seen, (unsigned long long)r, memory_order_relaxed);
    return guard_ops.check(conn, buf, (size_t)r);
}

/* Private to base/http.c and hook/http_recv_hook.c: what lets the server see every byte
 * libmicrohttpd reads from a client connection before the library parses it (see
 * base/http_guard.c). */
#ifndef CG_HTTP_GUARD_H
#define CG_HTTP_GUARD_H

#include <stddef.h>
#include <sys/types.h>

/* What the server does with bytes read on a guarded descriptor. check: the bytes just read
 * (n > 0) may be inspected; returns what recv() hands the library (n, 0 for end of stream,
 * or -1 with errno set). refused: called instead of reading once the connection is refused;
 * returns the same kind of value. Both run on the library's thread for that connection. */
typedef struct cg_http_guard_ops {
    ssize_t (*check)(void *conn, void *buf, size_t n);
    ssize_t (*refused)(void *conn);
    int (*is_refused)(void *conn);
} cg_http_guard_ops;

/* Sets the ops once (before any descriptor is guarded). Returns 0, or -1 when the descriptor
 * table cannot be had. */
int cg_http_guard_init(const cg_http_guard_ops *ops);
/* Guards fd with conn (conn NULL: stops guarding it). Call from the thread that owns fd,
 * between accept and close. */
void cg_http_guard_set(int fd, void *conn);
/* Total bytes the hook has seen since start (a self-check that it is in the path). */
unsigned long long cg_http_guard_bytes(void);
/* What recv() does in a program that links hook/http_recv_hook.c: on a guarded descriptor it
 * reads and hands the bytes to check (or calls refused instead of reading, once refused); on
 * any other descriptor, and for MSG_PEEK, it is the plain recvfrom system call. Same arguments
 * and return value as recv(2). */
ssize_t cg_http_guard_recv(int fd, void *buf, size_t len, int flags);

#endif

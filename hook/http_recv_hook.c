/* recv() for the two server programs, chunkgate and chunkgate-worker, and for the tests that
 * exercise the HTTP framing check; nothing else links this file. It overrides libc's recv()
 * for the whole process on purpose: libmicrohttpd reads client sockets with recv() and offers
 * no hook to see those bytes before it parses them. The program's definition comes before
 * libc's in the dynamic linker's search order (ordinary symbol interposition, as with
 * LD_PRELOAD), so libmicrohttpd, libcurl and hiredis from 1.0 on (Debian 12's 0.14 reads with
 * read(2)) all read through it. For a descriptor base/http.c registered as a client
 * connection it runs the framing check (cg_http_guard_recv in base/http_guard.c); for every
 * other descriptor (libcurl's, hiredis's, the library's own) it is the plain system call:
 * tests/test_http_recv_hook.c checks that libcurl's and hiredis' reads pass through
 * unchanged. */
#undef _FORTIFY_SOURCE /* recv() is defined here, not called through the fortified wrapper */
#include <sys/socket.h>

#include "base/http_guard.h"

ssize_t recv(int fd, void *buf, size_t len, int flags)
{
    return cg_http_guard_recv(fd, buf, len, flags);
}

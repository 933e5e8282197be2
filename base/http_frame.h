/* Raw HTTP/1.1 request framing (RFC 9112), checked byte by byte before libmicrohttpd parses
 * it: the request line, the header section, Content-Length and Transfer-Encoding, a chunked
 * body and its trailer section. The check is incremental (bytes arrive in any pieces) and
 * keeps no request bytes: it only decides whether what came so far is well framed and within
 * the limits, and where one request ends and the next begins.
 *
 * Why it exists: libmicrohttpd 0.9.75 (Debian 12) answers framing errors itself with fixed
 * HTML pages (a malformed Content-Length even gets its status line and headers twice), reads
 * a chunked body until the connection times out when a chunk declares a huge size, and
 * accepts requests RFC 9112 says to refuse (whitespace before a header's colon, obs-fold,
 * Content-Length with Transfer-Encoding, conflicting Content-Lengths, a missing Host). None of
 * that can be changed through its API; base/http.c runs this check on every byte the library
 * reads and answers a refusal itself, in the OpenAI error shape, before the library sees the
 * request. See docs/gateway.md, "HTTP framing". */
#ifndef CG_HTTP_FRAME_H
#define CG_HTTP_FRAME_H

#include <stddef.h>
#include <stdint.h>
#include "base/status.h"

typedef struct cg_http_frame cg_http_frame;

typedef struct cg_http_frame_limits {
    size_t max_target;       /* request-target bytes; longer -> 414. Default 8 KiB */
    size_t max_header_bytes; /* sum of header name and trimmed value bytes (header and trailer
                                sections each); more -> 431. Default 16 KiB; 0 = no such cap */
    size_t max_head_bytes;   /* raw bytes of the request line and header section (and of the
                                trailer section); more -> 431. Default 32 KiB */
    unsigned max_headers;    /* header fields (and trailer fields); more -> 431. Default 100 */
    uint64_t max_body_bytes; /* chunked body bytes declared so far; more -> 413 at the chunk-size
                                line that passes it. Default 8 MiB; 0 = no cap. A Content-Length
                                above it is left to the server's own check (it knows the route) */
} cg_http_frame_limits;

cg_http_frame_limits cg_http_frame_default_limits(void);

/* New checker for one connection (limits copied). Caller frees with cg_http_frame_free. */
cg_http_frame *cg_http_frame_new(const cg_http_frame_limits *limits);
void cg_http_frame_free(cg_http_frame **f);

/* Feeds the next n bytes the client sent. Returns CG_OK when they may go on to the HTTP
 * library. Otherwise the refusal (CG_E_HTTP_FRAMING 400, CG_E_URI_TOO_LONG 414,
 * CG_E_HEADERS_TOO_LARGE 431, CG_E_TOO_LARGE 413, CG_E_HTTP_VERSION 505, CG_E_NOT_IMPLEMENTED
 * 501), and *start says where the refused request began: an offset into p (the bytes before it
 * complete earlier requests), or SIZE_MAX when it began in an earlier call. After a refusal
 * every call returns the same status. start may be NULL. */
cg_status cg_http_frame_feed(cg_http_frame *f, const void *p, size_t n, size_t *start) CG_WUR;

/* The refusal's message (static or owned by f; "" while there is none). */
const char *cg_http_frame_message(const cg_http_frame *f);
/* Complete requests seen (at a refusal: those before the refused one). */
uint64_t cg_http_frame_requests(const cg_http_frame *f);
/* 1 while between requests (nothing of the next one seen yet). */
int cg_http_frame_idle(const cg_http_frame *f);
/* 1 after a request that ends the connection (Connection: close, or HTTP/1.0 without
 * keep-alive): the bytes after it are not checked, as the server will not read them. */
int cg_http_frame_closing(const cg_http_frame *f);

#endif

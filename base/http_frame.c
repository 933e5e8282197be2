/* Raw HTTP/1.1 request framing check (base/http_frame.h): one state machine per connection,
 * fed the bytes in whatever pieces they arrive. Grammar (RFC 9112, stricter where the HTTP
 * library would otherwise answer on its own or where a front proxy could read the request
 * differently):
 *
 *   request   = *( CRLF ) method SP request-target SP HTTP-version CRLF
 *               *( field-line CRLF ) CRLF [ body ]
 *   method    = 1*32 tchar
 *   target    = 1*( %x21-7E ), starting with "/", "*" or "http"; at most max_target bytes
 *   version   = "HTTP/1.0" / "HTTP/1." DIGIT (a higher 1.x minor is 1.1); another major -> 505
 *   field     = 1*tchar ":" OWS *( VCHAR / obs-text / SP / HTAB ) ; no space before ":",
 *               no obs-fold, no CTL but HTAB
 *   body      = Content-Length bytes, or chunked:
 *   chunked   = *( 1*16HEXDIG [ ";" ext ] CRLF data CRLF ) "0" [ ";" ext ] CRLF trailer CRLF
 *
 * CRLF is CR LF or a bare LF (both ends of the connection read them the same way); a CR must
 * be followed by LF. Framing headers: Content-Length is 1*19 DIGIT, several must agree;
 * Transfer-Encoding must be exactly "chunked" (another coding -> 501), at most once, never
 * with Content-Length and never in HTTP/1.0; neither may have whitespace after its value
 * (libmicrohttpd would frame it otherwise); HTTP/1.1 needs exactly one Host. */
#include "base/http_frame.h"

#include <stdio.h>
#include <string.h>
#include "base/base.h"

#define METHOD_MAX 32
#define EXT_MAX 4096 /* chunk extension bytes on one size line */
#define NAME_KEEP 24 /* header name bytes kept to recognise the framing headers */
#define VALUE_KEEP 128

enum state {
    ST_START, /* before a request: empty lines may come first */
    ST_METHOD,
    ST_TARGET,
    ST_VERSION,
    ST_FIELD, /* start of a header (or trailer) line */
    ST_NAME,
    ST_OWS, /* whitespace after the colon */
    ST_VALUE,
    ST_BODY,      /* Content-Length bytes */
    ST_CSIZE,     /* chunk-size hex digits */
    ST_CEXT,      /* chunk extension */
    ST_CDATA,     /* chunk data */
    ST_CDATA_END, /* the CRLF after chunk data */
    ST_IGNORE,    /* after a request that closes the connection */
    ST_ERROR,
};

/* Which line a CR or LF ends (what to do once the LF arrives). */
enum line_end { END_NONE, END_EMPTY, END_VERSION, END_VALUE, END_HEAD, END_CSIZE, END_CDATA };

enum hdr { H_OTHER, H_CONTENT_LENGTH, H_TRANSFER_ENCODING, H_HOST, H_CONNECTION };

struct cg_http_frame {
    cg_http_frame_limits lim;
    enum state st;
    cg_status err;
    const char *msg;
    uint64_t requests;

    /* the request being read */
    size_t req_bytes;  /* bytes of it so far (0: idle) */
    size_t head_bytes; /* raw bytes of its head, or of its trailer section */
    size_t field_bytes;
    unsigned fields;
    int trailer; /* reading the trailer section */
    int cr;      /* a CR was seen; the next byte must be LF */
    enum line_end pending;
    size_t tok; /* bytes of the current token (method, target, version, name, ...) */
    char version[9];
    int minor; /* 0 or 1 */
    enum hdr hdr;
    char name[NAME_KEEP + 1];
    char value[VALUE_KEEP + 1];
    size_t value_len, value_trim; /* value bytes, and up to its last non-blank byte; the first
                                     VALUE_KEEP of them are kept */
    unsigned n_cl, n_te, n_host;
    uint64_t cl;
    int te_chunked, conn_close, conn_keep_alive;
    uint64_t remaining; /* body or chunk data bytes left */
    uint64_t chunk_size, body_total;
};

cg_http_frame_limits cg_http_frame_default_limits(void)
{
    cg_http_frame_limits l = {.max_target = 8u << 10,
                              .max_header_bytes = 16u << 10,
                              .max_head_bytes = 32u << 10,
                              .max_headers = 100,
                              .max_body_bytes = 8u << 20};
    return l;
}

cg_http_frame *cg_http_frame_new(const cg_http_frame_limits *limits)
{
    cg_http_frame *f = cg_calloc(1, sizeof *f);
    f->lim = *limits;
    f->msg = "";
    return f;
}

void cg_http_frame_free(cg_http_frame **f)
{
    cg_free(f);
}

const char *cg_http_frame_message(const cg_http_frame *f)
{
    return f->msg;
}

uint64_t cg_http_frame_requests(const cg_http_frame *f)
{
    return f->requests;
}

int cg_http_frame_idle(const cg_http_frame *f)
{
    return f->st == ST_START && f->req_bytes == 0;
}

int cg_http_frame_closing(const cg_http_frame *f)
{
    return f->st == ST_IGNORE;
}

/* ---------------------------------------------------------------- character classes */

static int is_tchar(unsigned char c)
{
    static const char extra[] = "!#$%&'*+-.^_`|~";
    return (c >= 'a' && c <= 'z') || (c >= 'A' && c <= 'Z') || (c >= '0' && c <= '9') ||
           (c && memchr(extra, c, sizeof extra - 1));
}

/* A field value byte: VCHAR, obs-text, SP or HTAB. */
static int is_value_char(unsigned char c)
{
    return c == '\t' || (c >= 0x20 && c != 0x7f);
}

static int hex_value(unsigned char c)
{
    if (c >= '0' && c <= '9') return c - '0';
    if (c >= 'a' && c <= 'f') return c - 'a' + 10;
    if (c >= 'A' && c <= 'F') return c - 'A' + 10;
    return -1;
}

/* ---------------------------------------------------------------- helpers */

static cg_status fail(cg_http_frame *f, cg_status st, const char *msg)
{
    f->st = ST_ERROR;
    f->err = st;
    f->msg = msg;
    return st;
}

static void start_field(cg_http_frame *f)
{
    f->tok = 0;
    f->hdr = H_OTHER;
    f->value_len = f->value_trim = 0;
}

static void reset_request(cg_http_frame *f)
{
    f->req_bytes = 0;
    f->head_bytes = f->field_bytes = 0;
    f->fields = 0;
    f->trailer = 0;
    f->tok = 0;
    f->n_cl = f->n_te = f->n_host = 0;
    f->cl = 0;
    f->te_chunked = f->conn_close = f->conn_keep_alive = 0;
    f->remaining = f->chunk_size = f->body_total = 0;
    f->st = ST_START;
}

static enum hdr classify_name(const char *name, size_t len)
{
    if (len == 14 && !strcasecmp(name, "content-length")) return H_CONTENT_LENGTH;
    if (len == 17 && !strcasecmp(name, "transfer-encoding")) return H_TRANSFER_ENCODING;
    if (len == 4 && !strcasecmp(name, "host")) return H_HOST;
    if (len == 10 && !strcasecmp(name, "connection")) return H_CONNECTION;
    return H_OTHER;
}

/* Connection: a comma-separated list of tokens; "close" and "keep-alive" matter. */
static void connection_tokens(cg_http_frame *f, const char *v, size_t n)
{
    size_t i = 0;
    while (i < n) {
        while (i < n && (v[i] == ',' || v[i] == ' ' || v[i] == '\t'))
            i++;
        size_t b = i;
        while (i < n && v[i] != ',' && v[i] != ' ' && v[i] != '\t')
            i++;
        if (i - b == 5 && !strncasecmp(v + b, "close", 5)) f->conn_close = 1;
        if (i - b == 10 && !strncasecmp(v + b, "keep-alive", 10)) f->conn_keep_alive = 1;
    }
}

/* A complete header line (not a trailer): the limits and the framing headers. */
static cg_status end_field(cg_http_frame *f)
{
    size_t vlen = f->value_trim;
    if (f->lim.max_header_bytes && (f->field_bytes += f->tok + vlen) > f->lim.max_header_bytes)
        return fail(f, CG_E_HEADERS_TOO_LARGE,
                    f->trailer ? "the chunked body's trailer fields are larger than allowed"
                               : "request headers are larger than allowed");
    if (f->trailer || f->hdr == H_OTHER) return CG_OK;
    const char *v = f->value;
    size_t kept = CG_MIN(vlen, (size_t)VALUE_KEEP);
    /* RFC 9112 trims whitespace after a field value, but libmicrohttpd keeps it in the framing
     * headers: it takes "chunked " for another coding (and reads the body as the next request)
     * and "76 " for a bad length (its own HTML 400, headers written twice). Both parsers must
     * frame a request alike, so such a framing header is refused here, before the library. */
    if ((f->hdr == H_CONTENT_LENGTH || f->hdr == H_TRANSFER_ENCODING) &&
        f->value_len != f->value_trim)
        return fail(f, CG_E_HTTP_FRAMING,
                    f->hdr == H_CONTENT_LENGTH
                        ? "Content-Length has whitespace after its value"
                        : "Transfer-Encoding has whitespace after its value");
    switch (f->hdr) {
    case H_CONTENT_LENGTH: {
        if (!vlen || vlen > 19)
            return fail(f, CG_E_HTTP_FRAMING, "Content-Length must be 1 to 19 decimal digits");
        uint64_t x = 0;
        for (size_t i = 0; i < vlen; i++) {
            if (v[i] < '0' || v[i] > '9')
                return fail(f, CG_E_HTTP_FRAMING, "Content-Length must be 1 to 19 decimal digits");
            x = x * 10 + (uint64_t)(v[i] - '0');
        }
        if (f->n_cl++ && x != f->cl)
            return fail(f, CG_E_HTTP_FRAMING, "the request has Content-Length headers that differ");
        f->cl = x;
        break;
    }
    case H_TRANSFER_ENCODING:
        if (f->n_te++)
            return fail(f, CG_E_HTTP_FRAMING, "the request has more than one Transfer-Encoding");
        f->te_chunked = vlen == 7 && !strncasecmp(v, "chunked", 7);
        if (!f->te_chunked)
            return fail(f, CG_E_NOT_IMPLEMENTED,
                        "Transfer-Encoding other than exactly \"chunked\" is not implemented");
        break;
    case H_HOST:
        f->n_host++;
        break;
    case H_CONNECTION:
        connection_tokens(f, v, kept);
        break;
    case H_OTHER:
        break;
    }
    return CG_OK;
}

/* The header section is complete: decide how the body is framed. */
static cg_status end_head(cg_http_frame *f)
{
    if (f->n_te && f->n_cl)
        return fail(f, CG_E_HTTP_FRAMING,
                    "the request has both Content-Length and Transfer-Encoding");
    if (f->n_te && f->minor == 0)
        return fail(f, CG_E_HTTP_FRAMING, "Transfer-Encoding is not allowed in HTTP/1.0");
    if (f->minor == 1 && f->n_host != 1)
        return fail(f, CG_E_HTTP_FRAMING,
                    f->n_host ? "the request has more than one Host header"
                              : "an HTTP/1.1 request needs a Host header");
    if (f->n_host > 1)
        return fail(f, CG_E_HTTP_FRAMING, "the request has more than one Host header");
    return CG_OK;
}

/* One request is complete. */
static void end_request(cg_http_frame *f)
{
    int closing = f->conn_close || (f->minor == 0 && !f->conn_keep_alive);
    f->requests++;
    reset_request(f);
    if (closing) f->st = ST_IGNORE;
}

/* After the header section: the body, or the end of the request. */
static void begin_body(cg_http_frame *f)
{
    if (f->te_chunked) {
        f->st = ST_CSIZE;
        f->tok = 0;
        f->chunk_size = 0;
    } else if (f->cl) {
        f->st = ST_BODY;
        f->remaining = f->cl;
    } else {
        end_request(f);
    }
}

/* A line's LF arrived: act on what it ended. */
static cg_status end_line(cg_http_frame *f)
{
    enum line_end e = f->pending;
    f->pending = END_NONE;
    switch (e) {
    case END_EMPTY:
        return CG_OK; /* an empty line before a request */
    case END_VERSION:
        f->st = ST_FIELD;
        return CG_OK;
    case END_VALUE:
        f->st = ST_FIELD;
        return end_field(f);
    case END_HEAD:
        if (f->trailer) {
            end_request(f);
            return CG_OK;
        }
        if (end_head(f) != CG_OK) return f->err;
        begin_body(f);
        return CG_OK;
    case END_CSIZE:
        f->body_total += f->chunk_size;
        if (f->chunk_size == 0) { /* last chunk: the trailer section follows */
            f->trailer = 1;
            f->head_bytes = f->field_bytes = 0;
            f->fields = 0;
            f->st = ST_FIELD;
        } else {
            f->st = ST_CDATA;
            f->remaining = f->chunk_size;
        }
        return CG_OK;
    case END_CDATA:
        f->st = ST_CSIZE;
        f->tok = 0;
        f->chunk_size = 0;
        return CG_OK;
    case END_NONE:
        break;
    }
    return CG_OK;
}

/* CR or LF ending a line of kind e. */
static cg_status line_break(cg_http_frame *f, unsigned char c, enum line_end e)
{
    f->pending = e;
    if (c == '\r') {
        f->cr = 1;
        return CG_OK;
    }
    return end_line(f);
}

static cg_status version_check(cg_http_frame *f)
{
    const char *v = f->version;
    if (f->tok != 8 || memcmp(v, "HTTP/", 5) != 0 || v[5] < '0' || v[5] > '9' || v[6] != '.' ||
        v[7] < '0' || v[7] > '9')
        return fail(f, CG_E_HTTP_FRAMING, "the request line does not end with an HTTP version");
    if (v[5] != '1') return fail(f, CG_E_HTTP_VERSION, "only HTTP/1.0 and HTTP/1.1 are supported");
    f->minor = v[7] == '0' ? 0 : 1;
    return CG_OK;
}

/* ---------------------------------------------------------------- the machine */

/* One byte of the head, a trailer or a chunk-size line (the states that go byte by byte). */
static cg_status step(cg_http_frame *f, unsigned char c)
{
    if (f->cr) {
        f->cr = 0;
        if (c != '\n') return fail(f, CG_E_HTTP_FRAMING, "a CR not followed by LF");
        return end_line(f);
    }
    switch (f->st) {
    case ST_START:
        if (c == '\r' || c == '\n') return line_break(f, c, END_EMPTY);
        if (!is_tchar(c)) return fail(f, CG_E_HTTP_FRAMING, "the request line is malformed");
        f->st = ST_METHOD;
        f->tok = 1;
        return CG_OK;
    case ST_METHOD:
        if (c == ' ') {
            f->st = ST_TARGET;
            f->tok = 0;
            return CG_OK;
        }
        if (!is_tchar(c) || ++f->tok > METHOD_MAX)
            return fail(f, CG_E_HTTP_FRAMING, "the request method is malformed");
        return CG_OK;
    case ST_TARGET:
        if (c == ' ' && f->tok) {
            f->st = ST_VERSION;
            f->tok = 0;
            return CG_OK;
        }
        if (c <= 0x20 || c >= 0x7f)
            return fail(f, CG_E_HTTP_FRAMING,
                        "the request target is malformed (one space around it, no control, "
                        "space or non-ASCII bytes)");
        if (f->tok == 0 && c != '/' && c != '*' && c != 'h' && c != 'H')
            return fail(f, CG_E_HTTP_FRAMING, "the request target must start with / or http");
        if (++f->tok > f->lim.max_target)
            return fail(f, CG_E_URI_TOO_LONG, "the request target is longer than allowed");
        return CG_OK;
    case ST_VERSION:
        if (c == '\r' || c == '\n') {
            if (version_check(f) != CG_OK) return f->err;
            return line_break(f, c, END_VERSION);
        }
        if (f->tok >= 8) return fail(f, CG_E_HTTP_FRAMING, "the request line is malformed");
        f->version[f->tok++] = (char)c;
        return CG_OK;
    case ST_FIELD:
        if (c == '\r' || c == '\n') return line_break(f, c, END_HEAD);
        if (c == ' ' || c == '\t')
            return fail(f, CG_E_HTTP_FRAMING, "obsolete line folding in a header is not accepted");
        if (!is_tchar(c)) return fail(f, CG_E_HTTP_FRAMING, "a header name is malformed");
        if (++f->fields > f->lim.max_headers)
            return fail(f, CG_E_HEADERS_TOO_LARGE, "the request has too many header fields");
        start_field(f);
        f->name[0] = (char)c;
        f->tok = 1;
        f->st = ST_NAME;
        return CG_OK;
    case ST_NAME:
        if (c == ':') {
            f->name[CG_MIN(f->tok, (size_t)NAME_KEEP)] = '\0';
            f->hdr = f->tok <= NAME_KEEP ? classify_name(f->name, f->tok) : H_OTHER;
            f->st = ST_OWS;
            return CG_OK;
        }
        if (c == ' ' || c == '\t')
            return fail(f, CG_E_HTTP_FRAMING, "whitespace between a header name and its colon");
        if (!is_tchar(c)) return fail(f, CG_E_HTTP_FRAMING, "a header name is malformed");
        if (f->tok < NAME_KEEP) f->name[f->tok] = (char)c;
        f->tok++;
        return CG_OK;
    case ST_OWS:
        if (c == ' ' || c == '\t') return CG_OK;
        f->st = ST_VALUE;
        /* fall through */
    case ST_VALUE:
        if (c == '\r' || c == '\n') return line_break(f, c, END_VALUE);
        if (!is_value_char(c))
            return fail(f, CG_E_HTTP_FRAMING, "a header value holds a control character");
        if (f->value_len < VALUE_KEEP) f->value[f->value_len] = (char)c;
        f->value_len++;
        if (c != ' ' && c != '\t') f->value_trim = f->value_len;
        return CG_OK;
    case ST_CSIZE: {
        if ((c == '\r' || c == '\n' || c == ';') && f->tok) {
            if (c == ';') {
                f->st = ST_CEXT;
                f->value_len = 0;
                return CG_OK;
            }
            return line_break(f, c, END_CSIZE);
        }
        int d = hex_value(c);
        if (d < 0) return fail(f, CG_E_HTTP_FRAMING, "a chunk size is malformed");
        if (++f->tok > 16) return fail(f, CG_E_HTTP_FRAMING, "a chunk size has too many digits");
        f->chunk_size = f->chunk_size << 4 | (uint64_t)d;
        if (f->lim.max_body_bytes && f->chunk_size > f->lim.max_body_bytes - f->body_total)
            return fail(f, CG_E_TOO_LARGE, "request body is larger than allowed");
        return CG_OK;
    }
    case ST_CEXT:
        if (c == '\r' || c == '\n') return line_break(f, c, END_CSIZE);
        if (!is_value_char(c) || ++f->value_len > EXT_MAX)
            return fail(f, CG_E_HTTP_FRAMING, "a chunk extension is malformed or too long");
        return CG_OK;
    case ST_CDATA_END:
        if (c == '\r' || c == '\n') return line_break(f, c, END_CDATA);
        return fail(f, CG_E_HTTP_FRAMING, "chunk data is longer than its chunk size");
    case ST_BODY:
    case ST_CDATA:
    case ST_IGNORE:
    case ST_ERROR:
        break;
    }
    return CG_OK;
}

cg_status cg_http_frame_feed(cg_http_frame *f, const void *p, size_t n, size_t *start)
{
    const unsigned char *b = p;
    size_t i = 0, begin = f->req_bytes ? SIZE_MAX : 0;
    if (start) *start = SIZE_MAX;
    if (f->st == ST_ERROR) return f->err;
    while (i < n) {
        switch (f->st) {
        case ST_IGNORE:
            return CG_OK;
        case ST_BODY:
        case ST_CDATA: {
            uint64_t take = CG_MIN(f->remaining, (uint64_t)(n - i));
            f->remaining -= take;
            f->req_bytes += (size_t)take;
            i += (size_t)take;
            if (f->remaining) break;
            if (f->st == ST_BODY) {
                end_request(f);
                begin = i;
            } else {
                f->st = ST_CDATA_END;
            }
            break;
        }
        default: {
            enum state before = f->st;
            int in_head = before != ST_CSIZE && before != ST_CEXT && before != ST_CDATA_END;
            if (in_head && ++f->head_bytes > f->lim.max_head_bytes) {
                fail(f, CG_E_HEADERS_TOO_LARGE,
                     f->trailer ? "the chunked body's trailer section is larger than allowed"
                                : "the request head is larger than allowed");
                goto refused;
            }
            f->req_bytes++;
            if (step(f, b[i]) != CG_OK) goto refused;
            i++;
            if (f->st == ST_START && f->req_bytes == 0) begin = i; /* a request ended here */
            break;
        }
        }
    }
    return CG_OK;
refused:
    if (start) *start = begin;
    return f->err;
}

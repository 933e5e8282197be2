/* The raw request framing check (base/http_frame.c): a table of requests, well and badly
 * framed, each fed whole, byte by byte and in pseudo-random pieces (the verdict, the number of
 * complete requests and where the refused request began must not depend on the pieces); the
 * limits at and one past their values; several requests on one connection. */
#include <check.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include "tests/harness/harness.h"
#include "base/base.h"
#include "base/http_frame.h"

typedef struct verdict {
    cg_status st;
    uint64_t requests;
    size_t start; /* offset of the refused request in the whole input, SIZE_MAX when none */
} verdict;

/* Feeds p in pieces of the given sizes (cycled; 0 = all at once). */
static verdict feed(const cg_http_frame_limits *l, const char *p, size_t n, const size_t *pieces,
                    size_t n_pieces)
{
    cg_http_frame *f = cg_http_frame_new(l);
    verdict v = {CG_OK, 0, SIZE_MAX};
    size_t off = 0, k = 0;
    while (off < n) {
        size_t take = n_pieces ? pieces[k++ % n_pieces] : n;
        if (take > n - off) take = n - off;
        size_t start;
        cg_status st = cg_http_frame_feed(f, p + off, take, &start);
        if (st != CG_OK) {
            v.st = st;
            v.start = start == SIZE_MAX ? SIZE_MAX : off + start;
            break;
        }
        off += take;
    }
    v.requests = cg_http_frame_requests(f);
    if (v.st != CG_OK) {
        ck_assert_str_ne(cg_http_frame_message(f), "");
        size_t s2;
        ck_assert_int_eq(cg_http_frame_feed(f, "GET", 3, &s2), v.st); /* sticky */
    }
    cg_http_frame_free(&f);
    ck_assert_ptr_null(f);
    return v;
}

/* The verdict, checked to be the same whatever the pieces. The refused request's start may be
 * reported as "an earlier call" when pieces split it: compared only when both know it. */
static verdict check_all_splits(const cg_http_frame_limits *l, const char *p, size_t n)
{
    verdict whole = feed(l, p, n, NULL, 0);
    size_t one[] = {1};
    size_t mixed[] = {3, 1, 7, 2, 64, 5};
    verdict a = feed(l, p, n, one, 1), b = feed(l, p, n, mixed, CG_ARRAY_LEN(mixed));
    ck_assert_msg(a.st == whole.st && b.st == whole.st, "verdict depends on pieces: %s %s %s",
                  cg_status_name(whole.st), cg_status_name(a.st), cg_status_name(b.st));
    ck_assert_uint_eq(a.requests, whole.requests);
    ck_assert_uint_eq(b.requests, whole.requests);
    ck_assert(whole.st == CG_OK || whole.start != SIZE_MAX);
    if (a.start != SIZE_MAX) ck_assert_uint_eq(a.start, whole.start);
    if (b.start != SIZE_MAX) ck_assert_uint_eq(b.start, whole.start);
    return whole;
}

#define H "Host: x\r\n"

static const struct {
    const char *name, *req;
    cg_status st;
    unsigned requests;
} CASES[] = {
    {"simple get", "GET / HTTP/1.1\r\n" H "\r\n", CG_OK, 1},
    {"bare LF lines", "GET / HTTP/1.1\n" H "\n", CG_OK, 1},
    {"empty lines before", "\r\n\r\nGET / HTTP/1.1\r\n" H "\r\n", CG_OK, 1},
    {"http/1.0 without host", "GET / HTTP/1.0\r\n\r\n", CG_OK, 1},
    {"http/1.2 is 1.1", "GET / HTTP/1.2\r\n" H "\r\n", CG_OK, 1},
    {"absolute form", "GET http://x/a HTTP/1.1\r\n" H "\r\n", CG_OK, 1},
    {"options star", "OPTIONS * HTTP/1.1\r\n" H "\r\n", CG_OK, 1},
    {"content-length body", "POST /a HTTP/1.1\r\n" H "Content-Length: 5\r\n\r\nhello", CG_OK, 1},
    {"two equal content-lengths",
     "POST /a HTTP/1.1\r\n" H "Content-Length: 5\r\nContent-Length: 5\r\n\r\nhello", CG_OK, 1},
    {"content-length leading ows", "POST /a HTTP/1.1\r\n" H "Content-Length: \t 5\r\n\r\nhello",
     CG_OK, 1},
    {"content-length trailing ows", "POST /a HTTP/1.1\r\n" H "Content-Length: \t 5 \t\r\n\r\nhello",
     CG_E_HTTP_FRAMING, 0},
    {"chunked",
     "POST /a HTTP/1.1\r\n" H "Transfer-Encoding: chunked\r\n\r\n5\r\nhello\r\n0\r\n\r\n", CG_OK,
     1},
    {"chunked mixed case", "POST /a HTTP/1.1\r\n" H "transfer-encoding: ChUnKeD\r\n\r\n0\r\n\r\n",
     CG_OK, 1},
    {"chunk extension and trailer",
     "POST /a HTTP/1.1\r\n" H "Transfer-Encoding: chunked\r\n\r\n5;a=b\r\nhello\r\n0;x\r\n"
     "X-T: 1\r\n\r\n",
     CG_OK, 1},
    {"hex chunk sizes",
     "POST /a HTTP/1.1\r\n" H "Transfer-Encoding: chunked\r\n\r\nA\r\n0123456789\r\n00\r\n\r\n",
     CG_OK, 1},
    {"pipelined three",
     "GET /1 HTTP/1.1\r\n" H "\r\nPOST /2 HTTP/1.1\r\n" H "Content-Length: 2\r\n\r\nabGET /3 "
     "HTTP/1.1\r\n" H "\r\n",
     CG_OK, 3},
    {"after connection close nothing is checked",
     "GET / HTTP/1.1\r\n" H "Connection: close\r\n\r\n\x01garbage", CG_OK, 1},
    {"http/1.0 closes", "GET / HTTP/1.0\r\n\r\n garbage", CG_OK, 1},
    {"http/1.0 keep-alive goes on",
     "GET / HTTP/1.0\r\nConnection: Keep-Alive\r\n\r\nGET / HTTP/1.0\r\n\r\n", CG_OK, 2},
    {"value with obs-text and tabs", "GET / HTTP/1.1\r\n" H "X-A: a\tb \xc3\xa9\r\n\r\n", CG_OK, 1},
    {"empty value", "GET / HTTP/1.1\r\n" H "X-A:\r\n\r\n", CG_OK, 1},

    {"content-length -1", "POST / HTTP/1.1\r\n" H "Content-Length: -1\r\n\r\n", CG_E_HTTP_FRAMING,
     0},
    {"content-length abc", "POST / HTTP/1.1\r\n" H "Content-Length: abc\r\n\r\n", CG_E_HTTP_FRAMING,
     0},
    {"content-length list", "POST / HTTP/1.1\r\n" H "Content-Length: 5, 5\r\n\r\nhello",
     CG_E_HTTP_FRAMING, 0},
    {"content-length too many digits",
     "POST / HTTP/1.1\r\n" H "Content-Length: 99999999999999999999999\r\n\r\n", CG_E_HTTP_FRAMING,
     0},
    {"content-length empty", "POST / HTTP/1.1\r\n" H "Content-Length:\r\n\r\n", CG_E_HTTP_FRAMING,
     0},
    {"content-length with a space after", "POST / HTTP/1.1\r\n" H "Content-Length: 5 \r\n\r\nhello",
     CG_E_HTTP_FRAMING, 0},
    {"chunked with a space after",
     "POST / HTTP/1.1\r\n" H "Transfer-Encoding: chunked \r\n\r\n5\r\nhello\r\n0\r\n\r\n",
     CG_E_HTTP_FRAMING, 0},
    {"chunked with a tab after",
     "POST / HTTP/1.1\r\n" H "Transfer-Encoding: chunked\t\r\n\r\n0\r\n\r\nGET / HTTP/1.1\r\n" H
     "\r\n",
     CG_E_HTTP_FRAMING, 0},
    {"content-lengths differ",
     "POST / HTTP/1.1\r\n" H "Content-Length: 5\r\nContent-Length: 6\r\n\r\nhello!",
     CG_E_HTTP_FRAMING, 0},
    {"content-length and chunked",
     "POST / HTTP/1.1\r\n" H "Content-Length: 5\r\nTransfer-Encoding: chunked\r\n\r\n0\r\n\r\n",
     CG_E_HTTP_FRAMING, 0},
    {"chunked then content-length",
     "POST / HTTP/1.1\r\n" H "Transfer-Encoding: chunked\r\nContent-Length: 5\r\n\r\n0\r\n\r\n",
     CG_E_HTTP_FRAMING, 0},
    {"two transfer-encodings",
     "POST / HTTP/1.1\r\n" H "Transfer-Encoding: chunked\r\nTransfer-Encoding: chunked\r\n\r\n",
     CG_E_HTTP_FRAMING, 0},
    {"gzip coding", "POST / HTTP/1.1\r\n" H "Transfer-Encoding: gzip, chunked\r\n\r\n",
     CG_E_NOT_IMPLEMENTED, 0},
    {"identity coding", "POST / HTTP/1.1\r\n" H "Transfer-Encoding: identity\r\n\r\n",
     CG_E_NOT_IMPLEMENTED, 0},
    {"chunked in http/1.0", "POST / HTTP/1.0\r\nTransfer-Encoding: chunked\r\n\r\n0\r\n\r\n",
     CG_E_HTTP_FRAMING, 0},
    {"bad chunk size",
     "POST / HTTP/1.1\r\n" H "Transfer-Encoding: chunked\r\n\r\nzz\r\nhello\r\n0\r\n\r\n",
     CG_E_HTTP_FRAMING, 0},
    {"empty chunk size", "POST / HTTP/1.1\r\n" H "Transfer-Encoding: chunked\r\n\r\n\r\n",
     CG_E_HTTP_FRAMING, 0},
    {"space before chunk extension",
     "POST / HTTP/1.1\r\n" H "Transfer-Encoding: chunked\r\n\r\n5 ;a\r\nhello\r\n0\r\n\r\n",
     CG_E_HTTP_FRAMING, 0},
    {"chunk size 17 digits",
     "POST / HTTP/1.1\r\n" H "Transfer-Encoding: chunked\r\n\r\n00000000000000001\r\na\r\n",
     CG_E_HTTP_FRAMING, 0},
    {"chunk data too long",
     "POST / HTTP/1.1\r\n" H "Transfer-Encoding: chunked\r\n\r\n2\r\nabc\r\n0\r\n\r\n",
     CG_E_HTTP_FRAMING, 0},
    {"chunk extension with control",
     "POST / HTTP/1.1\r\n" H "Transfer-Encoding: chunked\r\n\r\n1;a\x01\r\nx\r\n0\r\n\r\n",
     CG_E_HTTP_FRAMING, 0},
    {"space before colon", "GET / HTTP/1.1\r\n" H "X-A : a\r\n\r\n", CG_E_HTTP_FRAMING, 0},
    {"obs-fold", "GET / HTTP/1.1\r\n" H "X-A: a\r\n b\r\n\r\n", CG_E_HTTP_FRAMING, 0},
    {"header name with slash", "GET / HTTP/1.1\r\n" H "X/A: a\r\n\r\n", CG_E_HTTP_FRAMING, 0},
    {"empty header name", "GET / HTTP/1.1\r\n" H ": a\r\n\r\n", CG_E_HTTP_FRAMING, 0},
    {"nul in value", "GET / HTTP/1.1\r\n" H "X-A: a\0b\r\n\r\n", CG_E_HTTP_FRAMING, 0},
    {"bare CR in value", "GET / HTTP/1.1\r\n" H "X-A: a\rb\r\n\r\n", CG_E_HTTP_FRAMING, 0},
    {"line without colon", "GET / HTTP/1.1\r\n" H "hello\r\n\r\n", CG_E_HTTP_FRAMING, 0},
    {"missing host", "GET / HTTP/1.1\r\n\r\n", CG_E_HTTP_FRAMING, 0},
    {"two hosts", "GET / HTTP/1.1\r\n" H H "\r\n", CG_E_HTTP_FRAMING, 0},
    {"two spaces", "GET  / HTTP/1.1\r\n" H "\r\n", CG_E_HTTP_FRAMING, 0},
    {"http/0.9", "GET /\r\n\r\n", CG_E_HTTP_FRAMING, 0},
    {"lower-case version", "GET / http/1.1\r\n" H "\r\n", CG_E_HTTP_FRAMING, 0},
    {"version too long", "GET / HTTP/1.10\r\n" H "\r\n", CG_E_HTTP_FRAMING, 0},
    {"http/2.0", "GET / HTTP/2.0\r\n" H "\r\n", CG_E_HTTP_VERSION, 0},
    {"http/0.9 with version", "GET / HTTP/0.9\r\n" H "\r\n", CG_E_HTTP_VERSION, 0},
    {"target without slash", "GET abc HTTP/1.1\r\n" H "\r\n", CG_E_HTTP_FRAMING, 0},
    {"target with tab", "GET /a\tb HTTP/1.1\r\n" H "\r\n", CG_E_HTTP_FRAMING, 0},
    {"target with utf-8", "GET /\xc3\xa9 HTTP/1.1\r\n" H "\r\n", CG_E_HTTP_FRAMING, 0},
    {"method with slash", "G/T / HTTP/1.1\r\n" H "\r\n", CG_E_HTTP_FRAMING, 0},
    {"leading space", " GET / HTTP/1.1\r\n" H "\r\n", CG_E_HTTP_FRAMING, 0},
    {"CR without LF after request line", "GET / HTTP/1.1\rX" H "\r\n", CG_E_HTTP_FRAMING, 0},
    {"second request bad",
     "GET / HTTP/1.1\r\n" H "\r\nPOST / HTTP/1.1\r\n" H "Content-Length: x\r\n\r\n",
     CG_E_HTTP_FRAMING, 1},
};

START_TEST(table)
{
    cg_http_frame_limits l = cg_http_frame_default_limits();
    for (size_t i = 0; i < CG_ARRAY_LEN(CASES); i++) {
        size_t n = strlen(CASES[i].req);
        if (!strcmp(CASES[i].name, "nul in value"))
            n = strlen(CASES[i].req) + 1 + strlen("b\r\n\r\n");
        verdict v = check_all_splits(&l, CASES[i].req, n);
        ck_assert_msg(v.st == CASES[i].st, "%s: got %s, want %s", CASES[i].name,
                      cg_status_name(v.st), cg_status_name(CASES[i].st));
        ck_assert_msg(v.requests == CASES[i].requests, "%s: %llu requests, want %u", CASES[i].name,
                      (unsigned long long)v.requests, CASES[i].requests);
    }
}
END_TEST

START_TEST(refused_request_start)
{
    cg_http_frame_limits l = cg_http_frame_default_limits();
    const char *first = "GET /1 HTTP/1.1\r\n" H "\r\n";
    char req[256];
    snprintf(req, sizeof req, "%sGET /2 HTTP/1.1\r\nX-A : b\r\n\r\n", first);
    verdict v = feed(&l, req, strlen(req), NULL, 0);
    ck_assert_int_eq(v.st, CG_E_HTTP_FRAMING);
    ck_assert_uint_eq(v.requests, 1);
    ck_assert_uint_eq(v.start, strlen(first));
    /* the bad request began in an earlier call */
    size_t pieces[] = {strlen(first) + 5, 1000};
    v = feed(&l, req, strlen(req), pieces, 2);
    ck_assert_uint_eq(v.start, SIZE_MAX);
}
END_TEST

/* "POST / HTTP/1.1" + headers padded to exactly n bytes of names + trimmed values. */
static char *with_header_bytes(size_t n, size_t *len)
{
    /* Host(4) + x(1) + X-Pad(5) = 10 */
    size_t pad = n - 10;
    char *v = cg_malloc(pad + 1);
    memset(v, 'v', pad);
    v[pad] = '\0';
    cg_buf b;
    cg_buf_init_unbounded(&b);
    ck_assert_int_eq(cg_buf_printf(&b, "GET / HTTP/1.1\r\nHost: x\r\nX-Pad:   %s  \r\n\r\n", v),
                     CG_OK);
    free(v);
    *len = b.len;
    return b.data;
}

START_TEST(limits_at_and_past)
{
    /* every limit, small */
    cg_http_frame_limits l = {.max_target = 100,
                              .max_header_bytes = 500,
                              .max_head_bytes = 2000,
                              .max_headers = 5,
                              .max_body_bytes = 1000};
    char req[4096];
    /* target */
    for (int past = 0; past <= 1; past++) {
        char t[200];
        memset(t, 'a', sizeof t);
        t[0] = '/';
        t[100 + past] = '\0';
        snprintf(req, sizeof req, "GET %s HTTP/1.1\r\n" H "\r\n", t);
        verdict v = check_all_splits(&l, req, strlen(req));
        ck_assert_int_eq(v.st, past ? CG_E_URI_TOO_LONG : CG_OK);
    }
    /* header bytes: names + trimmed values */
    for (int past = 0; past <= 1; past++) {
        size_t len;
        char *r = with_header_bytes(500 + (size_t)past, &len);
        verdict v = check_all_splits(&l, r, len);
        ck_assert_int_eq(v.st, past ? CG_E_HEADERS_TOO_LARGE : CG_OK);
        free(r);
    }
    /* header count (Host counts) */
    for (int past = 0; past <= 1; past++) {
        cg_buf b;
        cg_buf_init_unbounded(&b);
        ck_assert_int_eq(cg_buf_printf(&b, "GET / HTTP/1.1\r\n" H), CG_OK);
        for (int i = 0; i < 4 + past; i++)
            ck_assert_int_eq(cg_buf_printf(&b, "X-%d: 1\r\n", i), CG_OK);
        ck_assert_int_eq(cg_buf_printf(&b, "\r\n"), CG_OK);
        verdict v = check_all_splits(&l, b.data, b.len);
        ck_assert_int_eq(v.st, past ? CG_E_HEADERS_TOO_LARGE : CG_OK);
        cg_buf_free(&b);
    }
    /* raw head bytes: whitespace around values counts here, not in the header bytes */
    {
        l.max_header_bytes = 0;
        const char *line = "GET / HTTP/1.1\r\nHost: x\r\nX-Ws: ";
        const char *end = "v\r\n\r\n";
        for (int past = 0; past <= 1; past++) {
            size_t ws = 2000 - strlen(line) - strlen(end) + (size_t)past;
            cg_buf b;
            cg_buf_init_unbounded(&b);
            ck_assert_int_eq(cg_buf_append(&b, line, strlen(line)), CG_OK);
            for (size_t i = 0; i < ws; i++)
                ck_assert_int_eq(cg_buf_append(&b, " ", 1), CG_OK);
            ck_assert_int_eq(cg_buf_append(&b, end, strlen(end)), CG_OK);
            ck_assert_uint_eq(b.len, 2000 + (size_t)past);
            verdict v = check_all_splits(&l, b.data, b.len);
            ck_assert_int_eq(v.st, past ? CG_E_HEADERS_TOO_LARGE : CG_OK);
            cg_buf_free(&b);
        }
        l.max_header_bytes = 500;
    }
    /* chunked body: refused at the size line that passes the cap, before any data */
    for (int past = 0; past <= 1; past++) {
        snprintf(req, sizeof req,
                 "POST / HTTP/1.1\r\n" H
                 "Transfer-Encoding: chunked\r\n\r\n1f4\r\n%0500d\r\n%x\r\n",
                 0, 500 + past);
        verdict v = check_all_splits(&l, req, strlen(req));
        ck_assert_int_eq(v.st, past ? CG_E_TOO_LARGE : CG_OK);
    }
    /* a chunk that declares a huge size is refused at once, data or not */
    snprintf(req, sizeof req,
             "POST / HTTP/1.1\r\n" H "Transfer-Encoding: chunked\r\n\r\nfffffffffff");
    ck_assert_int_eq(check_all_splits(&l, req, strlen(req)).st, CG_E_TOO_LARGE);
    /* a Content-Length above the cap is the server's to answer (it knows the route) */
    snprintf(req, sizeof req, "POST / HTTP/1.1\r\n" H "Content-Length: 5000\r\n\r\n");
    ck_assert_int_eq(check_all_splits(&l, req, strlen(req)).st, CG_OK);
}
END_TEST

START_TEST(idle_and_closing)
{
    cg_http_frame_limits l = cg_http_frame_default_limits();
    cg_http_frame *f = cg_http_frame_new(&l);
    ck_assert(cg_http_frame_idle(f));
    const char *head = "POST / HTTP/1.1\r\nHost: x\r\nContent-Length: 4\r\n\r\nab";
    ck_assert_int_eq(cg_http_frame_feed(f, head, strlen(head), NULL), CG_OK);
    ck_assert(!cg_http_frame_idle(f));
    ck_assert_int_eq(cg_http_frame_feed(f, "cd", 2, NULL), CG_OK);
    ck_assert(cg_http_frame_idle(f));
    ck_assert_uint_eq(cg_http_frame_requests(f), 1);
    ck_assert(!cg_http_frame_closing(f));
    const char *last = "GET / HTTP/1.1\r\nHost: x\r\nConnection: keep-alive, close\r\n\r\n";
    ck_assert_int_eq(cg_http_frame_feed(f, last, strlen(last), NULL), CG_OK);
    ck_assert(cg_http_frame_closing(f));
    ck_assert_int_eq(cg_http_frame_feed(f, "\x01\x02", 2, NULL), CG_OK);
    cg_http_frame_free(&f);
    cg_http_frame_free(&f); /* NULL-safe */
}
END_TEST

int main(void)
{
    return th_run_tests(
        "http_frame", "frame", 0,
        TH_TESTS(table, refused_request_start, limits_at_and_past, idle_and_closing));
}

/* Test harness: streamed (SSE) requests, split into blocks as they arrive. */
#include "tests/harness/harness.h"

#include <signal.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

/* Cuts the complete blocks off s->raw (from s->scanned on). */
static void take_blocks(th_sse *s)
{
    char *end;
    while (s->raw.data && (end = strstr(s->raw.data + s->scanned, "\n\n"))) {
        if (s->n == s->cap) {
            s->cap = s->cap ? 2 * s->cap : 64;
            s->block = cg_realloc(s->block, (size_t)s->cap * sizeof *s->block);
            s->t = cg_realloc(s->t, (size_t)s->cap * sizeof *s->t);
        }
        size_t start = s->scanned;
        s->block[s->n] = cg_strndup(s->raw.data + start, (size_t)(end - s->raw.data) - start);
        s->t[s->n] = th_now_s();
        if (!strncmp(s->block[s->n], "data:", 5)) s->data_blocks++;
        s->n++;
        s->scanned = (size_t)(end - s->raw.data) + 2;
    }
}

int th_sse_feed(th_sse *s, const char *d, size_t n)
{
    if (!s->raw.data && !s->raw.max) cg_buf_init_unbounded(&s->raw); /* s started zeroed */
    for (size_t i = 0; i < n; i++)
        if ((s->keep_cr || d[i] != '\r') && cg_buf_append(&s->raw, d + i, 1) != CG_OK) return -1;
    take_blocks(s);
    return 0;
}

static size_t on_stream(char *d, size_t sz, size_t nm, void *ud)
{
    th_sse *s = ud;
    size_t n = sz * nm;
    if (th_sse_feed(s, d, n) != 0) return 0;
    if (s->kill_after > 0 && s->data_blocks >= 1) {
        kill(s->kill_after, SIGKILL);
        s->kill_after = 0;
    }
    if (s->stop_after && s->data_blocks >= s->stop_after) return 0;
    return n;
}

CURLcode th_sse_post(th_sse *s, int port, const char *path, const char *body, const char *token)
{
    th_sse keep = *s;
    memset(s, 0, sizeof *s);
    s->stop_after = keep.stop_after;
    s->kill_after = keep.kill_after;
    s->keep_cr = keep.keep_cr;
    s->timeout_s = keep.timeout_s;
    cg_buf_init_unbounded(&s->raw);
    CURL *e = curl_easy_init();
    char url[1024], auth[512];
    snprintf(url, sizeof url, "http://127.0.0.1:%d%s", port, path);
    struct curl_slist *h = curl_slist_append(NULL, "Content-Type: application/json");
    h = curl_slist_append(h, "Expect:");
    if (token) {
        snprintf(auth, sizeof auth, "Authorization: Bearer %s", token);
        h = curl_slist_append(h, auth);
    }
    curl_easy_setopt(e, CURLOPT_URL, url);
    curl_easy_setopt(e, CURLOPT_NOSIGNAL, 1L);
    curl_easy_setopt(e, CURLOPT_TIMEOUT,
                     s->timeout_s ? s->timeout_s : th_params_now()->sse_timeout_s);
    curl_easy_setopt(e, CURLOPT_HTTPHEADER, h);
    curl_easy_setopt(e, CURLOPT_POSTFIELDS, body);
    curl_easy_setopt(e, CURLOPT_WRITEFUNCTION, on_stream);
    curl_easy_setopt(e, CURLOPT_WRITEDATA, s);
    CURLcode rc = curl_easy_perform(e);
    curl_easy_getinfo(e, CURLINFO_RESPONSE_CODE, &s->status);
    char *ct = NULL;
    curl_easy_getinfo(e, CURLINFO_CONTENT_TYPE, &ct);
    snprintf(s->ctype, sizeof s->ctype, "%s", ct ? ct : "");
    curl_slist_free_all(h);
    curl_easy_cleanup(e);
    return rc;
}

void th_sse_free(th_sse *s)
{
    for (int i = 0; i < s->n; i++)
        free(s->block[i]);
    free(s->block);
    free(s->t);
    s->block = NULL;
    s->t = NULL;
    s->n = s->cap = 0;
    cg_buf_free(&s->raw);
}

json_t *th_sse_json(const th_sse *s, int i)
{
    if (strncmp(s->block[i], "data: ", 6) != 0) return NULL;
    return json_loads(s->block[i] + 6, 0, NULL);
}

CURLcode th_sse_data(int port, const char *path, const char *body, const char *token, long *status,
                     char ***events, int *n_events)
{
    th_sse s = {.keep_cr = 1, .timeout_s = th_params_now()->http_timeout_s};
    CURLcode rc = th_sse_post(&s, port, path, body, token);
    *status = s.status;
    *events = NULL;
    *n_events = 0;
    for (int i = 0; i <= s.n; i++) {
        /* the blocks, then what follows the last blank line */
        const char *b = i < s.n ? s.block[i] : s.raw.data ? s.raw.data + s.scanned : "";
        size_t len = i < s.n ? strlen(b) : s.raw.len - s.scanned;
        if (len >= 6 && !strncmp(b, "data: ", 6)) {
            *events = cg_realloc(*events, (size_t)(*n_events + 1) * sizeof **events);
            (*events)[(*n_events)++] = cg_strndup(b + 6, len - 6);
        }
    }
    th_sse_free(&s);
    return rc;
}

void th_sse_data_free(char **events, int n)
{
    for (int i = 0; i < n; i++)
        free(events[i]);
    free(events);
}

/* One status enum for the whole project, generated from one table: code, HTTP status,
 * OpenAI error type, OpenAI error code string, message. */
#ifndef CG_STATUS_H
#define CG_STATUS_H

#define CG_WUR __attribute__((warn_unused_result))

/* X(name, http, openai_type, code_string, message) */
#define CG_STATUS_TABLE(X)                                                                         \
    X(CG_OK, 200, "", "", "ok")                                                                    \
    X(CG_E_JSON, 400, "invalid_request_error", "invalid_json", "request body is not valid JSON")   \
    X(CG_E_JSON_LIMIT, 400, "invalid_request_error", "json_too_complex",                           \
      "request JSON nests deeper or holds more values than allowed")                               \
    X(CG_E_HTTP_FRAMING, 400, "invalid_request_error", "bad_request", "malformed HTTP request")    \
    X(CG_E_TYPE, 400, "invalid_request_error", "invalid_type", "a field has the wrong type")       \
    X(CG_E_MISSING, 400, "invalid_request_error", "missing_field", "a required field is missing")  \
    X(CG_E_VALUE, 400, "invalid_request_error", "invalid_value", "a field has an invalid value")   \
    X(CG_E_UTF8, 400, "invalid_request_error", "invalid_utf8", "prompt is not valid UTF-8")        \
    X(CG_E_SEGMENTS, 400, "invalid_request_error", "too_many_segments",                            \
      "prompt has more segments than allowed")                                                     \
    X(CG_E_SEGMENT_SIZE, 400, "invalid_request_error", "segment_too_large",                        \
      "a prompt segment is larger than allowed")                                                   \
    X(CG_E_KEY_MISMATCH, 400, "invalid_request_error", "chunk_key_mismatch",                       \
      "chunk key does not match its text")                                                         \
    X(CG_E_CONTEXT, 400, "invalid_request_error", "context_length_exceeded",                       \
      "prompt and max_tokens exceed the model's context length")                                   \
    X(CG_E_AUTH, 401, "authentication_error", "invalid_api_key",                                   \
      "missing or invalid bearer token")                                                           \
    X(CG_E_FORBIDDEN, 403, "permission_error", "forbidden", "this credential may not do that")     \
    X(CG_E_NOT_FOUND, 404, "invalid_request_error", "not_found", "no such route or object")        \
    X(CG_E_MODEL, 404, "invalid_request_error", "model_not_found", "the model does not exist")     \
    X(CG_E_METHOD, 405, "invalid_request_error", "method_not_allowed",                             \
      "method not allowed on this route")                                                          \
    X(CG_E_CONFLICT, 409, "invalid_request_error", "conflict", "the object is in use")             \
    X(CG_E_TOO_LARGE, 413, "invalid_request_error", "request_too_large",                           \
      "request body is larger than allowed")                                                       \
    X(CG_E_URI_TOO_LONG, 414, "invalid_request_error", "uri_too_long",                             \
      "request target is longer than allowed")                                                     \
    X(CG_E_UNSUPPORTED, 422, "invalid_request_error", "unsupported",                               \
      "unsupported model or option")                                                               \
    X(CG_E_RATE_LIMIT, 429, "rate_limit_exceeded", "rate_limit_exceeded",                          \
      "too many requests in progress; retry shortly")                                              \
    X(CG_E_HEADERS_TOO_LARGE, 431, "invalid_request_error", "request_header_fields_too_large",     \
      "request headers are larger than allowed")                                                   \
    X(CG_E_INTERNAL, 500, "server_error", "internal_error", "internal error")                      \
    X(CG_E_IO, 500, "server_error", "io_error", "input/output error")                              \
    X(CG_E_NOT_IMPLEMENTED, 501, "invalid_request_error", "not_implemented",                       \
      "the request uses an HTTP feature this server does not implement")                           \
    X(CG_E_BAD_GATEWAY, 502, "upstream_error", "bad_gateway",                                      \
      "upstream returned an invalid reply")                                                        \
    X(CG_E_UNAVAILABLE, 503, "upstream_error", "upstream_unavailable", "no upstream is reachable") \
    X(CG_E_TIMEOUT, 504, "upstream_error", "upstream_timeout", "upstream timed out")               \
    X(CG_E_HTTP_VERSION, 505, "invalid_request_error", "http_version_not_supported",               \
      "only HTTP/1.0 and HTTP/1.1 are supported")                                                  \
    X(CG_E_FULL, 507, "server_error", "insufficient_storage", "no space left in the KV pool")

typedef enum {
#define CG_STATUS_ENUM(name, http, type, code, msg) name,
    CG_STATUS_TABLE(CG_STATUS_ENUM)
#undef CG_STATUS_ENUM
        CG_STATUS_COUNT
} cg_status;

/* HTTP status for a status code. */
int cg_status_http(cg_status st);
/* The first status of the table with that HTTP status (429 gives CG_E_RATE_LIMIT); an
 * unknown 5xx gives CG_E_BAD_GATEWAY, an unknown 4xx CG_E_VALUE. */
cg_status cg_status_from_http(int http);
/* OpenAI error "type" string, static storage. */
const char *cg_status_type(cg_status st);
/* OpenAI error "code" string, static storage. */
const char *cg_status_code(cg_status st);
/* Default human message, static storage. */
const char *cg_status_message(cg_status st);
/* Enum name, e.g. "CG_E_JSON", static storage. */
const char *cg_status_name(cg_status st);

#endif

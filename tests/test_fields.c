/* Unit suite of the lists derived from the gateway's field table (server/fields.c): the
 * request extensions never forwarded to an OpenAI backend, and the fields only the gateway
 * sets (refused from a client). */
#include <check.h>
#include <jansson.h>

#include "server/fields.h"
#include "tests/harness/harness.h"

START_TEST(extension_fields)
{
    /* every extension of README "Request extensions" is one, in both APIs */
    static const char *const ext[] = {
        "chunk_separator",         "cache_salt",      "chunk_mode",       "documents",
        "recompute_prefix_tokens", "recompute_ratio", "recompute_select", "quality_probe"};
    for (size_t i = 0; i < sizeof ext / sizeof ext[0]; i++) {
        json_t *b = json_pack("{s:s, s:s, s:i}", "model", "m", "prompt", "p", ext[i], 1);
        ck_assert_msg(cg_gw_has_ext_fields(b), "%s", ext[i]);
        cg_gw_del_ext_fields(b);
        ck_assert_ptr_null(json_object_get(b, ext[i]));
        ck_assert_int_eq(json_object_size(b), 2); /* model and prompt stay */
        ck_assert(!cg_gw_has_ext_fields(b));
        json_decref(b);
    }
    /* neither OpenAI fields nor unknown ones nor kv_transfer_params (set by the gateway) */
    json_t *b = json_pack("{s:s, s:s, s:i, s:{}, s:b}", "model", "m", "prompt", "p", "max_tokens",
                          4, "kv_transfer_params", "x_unknown", 1);
    ck_assert(!cg_gw_has_ext_fields(b));
    cg_gw_del_ext_fields(b);
    ck_assert_int_eq(json_object_size(b), 5);
    json_decref(b);
}
END_TEST

START_TEST(gateway_only_fields)
{
    json_t *b = json_pack("{s:s, s:s, s:s}", "model", "m", "prompt", "p", "chunk_separator", "|");
    ck_assert_ptr_null(cg_gw_gateway_only_field(b)); /* an extension a client may send */
    json_object_set_new(b, "kv_transfer_params", json_object());
    ck_assert_str_eq(cg_gw_gateway_only_field(b), "kv_transfer_params");
    json_decref(b);
}
END_TEST

int main(void)
{
    return th_run_tests("fields", "fields_lists", 0,
                        TH_TESTS(extension_fields, gateway_only_fields));
}

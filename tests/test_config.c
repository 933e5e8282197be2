/* Tests of the table-driven configuration (base/config.c) and of the gateway's own table
 * (server/gateway.c): defaults, environment, flags over environment, lists, sizes, numbers,
 * bounds, errors and --help. */
#include <check.h>
#include <stddef.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include "base/config.h"
#include "base/base.h"
#include "cache/key.h"
#include "server/gateway.h"
#include "tests/harness/harness.h"

typedef struct tcfg {
    char *name;
    long long count;
    size_t size;
    int flag;
    cg_strlist items;
    char *unset;
    int color;
} tcfg;

static const char *const colors[] = {"red", "green", "blue", NULL};

static const cg_cfg_opt tab[] = {
    CG_OPT(tcfg, "name", "CGT_NAME", CG_CFG_STR, name, "dflt", 0, 0, "a name"),
    CG_OPT(tcfg, "count", "CGT_COUNT", CG_CFG_INT, count, "5", 1, 100, "a count"),
    CG_OPT(tcfg, "size", "CGT_SIZE", CG_CFG_SIZE, size, "1K", 0, 1LL << 40, "a size"),
    CG_OPT(tcfg, "flag", "CGT_FLAG", CG_CFG_BOOL, flag, "false", 0, 0, "a flag"),
    CG_OPT(tcfg, "item", "CGT_ITEMS", CG_CFG_LIST, items, "a,b", 0, 0, "items"),
    CG_OPT(tcfg, "unset", "CGT_UNSET", CG_CFG_STR, unset, NULL, 0, 0, "not set by default"),
    CG_OPT_ENUM(tcfg, "color", "CGT_COLOR", color, "green", colors, "a color"),
};
#define NTAB (sizeof tab / sizeof tab[0])

static void clear_env(void)
{
    const char *vars[] = {"CGT_NAME",  "CGT_COUNT", "CGT_SIZE", "CGT_FLAG",
                          "CGT_ITEMS", "CGT_UNSET", "CGT_COLOR"};
    for (size_t i = 0; i < sizeof vars / sizeof vars[0]; i++)
        unsetenv(vars[i]);
}

/* Parses argv (NULL-terminated, without program name) into *c; returns the status. */
static cg_status parse(tcfg *c, const char *const *args, int *help, char *err, size_t errlen)
{
    char *argv[32];
    int argc = 0;
    argv[argc++] = "prog";
    for (; args && *args; args++)
        argv[argc++] = (char *)*args;
    argv[argc] = NULL;
    memset(c, 0, sizeof *c);
    err[0] = '\0';
    return cg_config_parse(tab, NTAB, c, argc, argv, help, err, errlen);
}

/* Asserts the parsed values of c, two list items among them, then frees c. */
static void expect_values(tcfg *c, const char *name, long long count, int flag, const char *item0,
                          const char *item1)
{
    ck_assert_str_eq(c->name, name);
    ck_assert_int_eq(c->count, count);
    ck_assert_int_eq(c->flag, flag);
    ck_assert_uint_eq(c->items.n, 2);
    ck_assert_str_eq(c->items.v[0], item0);
    ck_assert_str_eq(c->items.v[1], item1);
    cg_config_free(tab, NTAB, c);
}

START_TEST(defaults)
{
    clear_env();
    tcfg c;
    int help;
    char err[256];
    ck_assert_int_eq(parse(&c, NULL, &help, err, sizeof err), CG_OK);
    ck_assert_int_eq(help, 0);
    ck_assert_uint_eq(c.size, 1024);
    ck_assert_ptr_null(c.items.v[2]);
    ck_assert_ptr_null(c.unset);
    expect_values(&c, "dflt", 5, 0, "a", "b");
    ck_assert_ptr_null(c.name);
    ck_assert_ptr_null(c.items.v);
}
END_TEST

START_TEST(env_then_flags)
{
    clear_env();
    setenv("CGT_NAME", "from-env", 1);
    setenv("CGT_COUNT", "7", 1);
    setenv("CGT_ITEMS", "x,,y", 1); /* empty items are skipped */
    setenv("CGT_FLAG", "yes", 1);
    tcfg c;
    int help;
    char err[256];
    ck_assert_int_eq(parse(&c, NULL, &help, err, sizeof err), CG_OK);
    expect_values(&c, "from-env", 7, 1, "x", "y");

    /* flags win over the environment, in both spellings; a repeated list flag replaces the
     * environment's list and then accumulates */
    const char *args[] = {"--name", "from-flag", "--count=9",  "--item",
                          "p",      "--item=q",  "--flag=off", NULL};
    ck_assert_int_eq(parse(&c, args, &help, err, sizeof err), CG_OK);
    expect_values(&c, "from-flag", 9, 0, "p", "q");
}
END_TEST

START_TEST(sizes)
{
    clear_env();
    struct {
        const char *in;
        size_t want;
    } ok[] = {{"512", 512},   {"64M", 64u << 20}, {"2G", 2ull << 30},
              {"1KiB", 1024}, {"3kb", 3072},      {"0", 0}};
    tcfg c;
    int help;
    char err[256];
    for (size_t i = 0; i < sizeof ok / sizeof ok[0]; i++) {
        const char *args[] = {"--size", ok[i].in, NULL};
        ck_assert_int_eq(parse(&c, args, &help, err, sizeof err), CG_OK);
        ck_assert_msg(c.size == ok[i].want, "%s -> %zu", ok[i].in, c.size);
        cg_config_free(tab, NTAB, &c);
    }
    const char *bad[] = {"12X", "M", "", "1.5G", "-1K", "99999999999G"};
    for (size_t i = 0; i < sizeof bad / sizeof bad[0]; i++) {
        const char *args[] = {"--size", bad[i], NULL};
        ck_assert_msg(parse(&c, args, &help, err, sizeof err) == CG_E_VALUE, "'%s' accepted",
                      bad[i]);
        ck_assert_msg(strstr(err, "--size") != NULL, "error does not name the option: %s", err);
        cg_config_free(tab, NTAB, &c);
    }
}
END_TEST

START_TEST(bounds_and_errors)
{
    clear_env();
    tcfg c;
    int help;
    char err[256];
    static const struct {
        const char *args[3]; /* NULL-terminated */
        const char *err;     /* a part of the message, or NULL */
    } refused[] = {
        {{"--count", "0"}, "outside [1, 100]"},
        {{"--count=101"}, NULL},
        {{"--count", "ten"}, NULL},
        {{"--nope", "1"}, "unknown option '--nope'"},
        {{"stray"}, "stray"},
        {{"--name"}, "needs a value"},
        {{"--flag=maybe"}, NULL},
    };
    for (size_t i = 0; i < sizeof refused / sizeof refused[0]; i++) {
        ck_assert_msg(parse(&c, refused[i].args, &help, err, sizeof err) == CG_E_VALUE,
                      "case %zu accepted", i);
        if (refused[i].err)
            ck_assert_msg(strstr(err, refused[i].err) != NULL, "case %zu: %s", i, err);
        cg_config_free(tab, NTAB, &c);
    }
    const char *edge[] = {"--count=100", NULL};
    ck_assert_int_eq(parse(&c, edge, &help, err, sizeof err), CG_OK);
    ck_assert_int_eq(c.count, 100);
    cg_config_free(tab, NTAB, &c);
    const char *boolalone[] = {"--flag", NULL};
    ck_assert_int_eq(parse(&c, boolalone, &help, err, sizeof err), CG_OK);
    ck_assert_int_eq(c.flag, 1);
    cg_config_free(tab, NTAB, &c);
    /* a bad environment value is reported too */
    setenv("CGT_COUNT", "1000", 1);
    ck_assert_int_eq(parse(&c, NULL, &help, err, sizeof err), CG_E_VALUE);
    cg_config_free(tab, NTAB, &c);
}
END_TEST

START_TEST(help_flag_and_text)
{
    clear_env();
    tcfg c;
    int help = 0;
    char err[256];
    const char *args[] = {"--help", NULL};
    ck_assert_int_eq(parse(&c, args, &help, err, sizeof err), CG_OK);
    ck_assert_int_eq(help, 1);
    cg_config_free(tab, NTAB, &c);

    char *text = NULL;
    size_t len = 0;
    FILE *f = open_memstream(&text, &len);
    cg_config_help(f, "usage: prog", tab, NTAB);
    fclose(f);
    ck_assert_ptr_nonnull(strstr(text, "usage: prog"));
    ck_assert_ptr_nonnull(strstr(text, "| `--count` | `CGT_COUNT` | INT | 5 | a count |"));
    ck_assert_ptr_nonnull(strstr(text, "| `--unset` | `CGT_UNSET` | STR | - |"));
    free(text);
}
END_TEST

/* ---- the gateway's table ---- */

static void clear_gateway_env(void)
{
    for (size_t i = 0; i < cg_gateway_n_options; i++)
        unsetenv(cg_gateway_options[i].env);
}

static cg_status gw_load(cg_gateway_config *cfg, const char *const *args, char *err, size_t errlen)
{
    char *argv[32];
    int argc = 0, help = 0;
    argv[argc++] = "chunkgate";
    for (; args && *args; args++)
        argv[argc++] = (char *)*args;
    argv[argc] = NULL;
    return cg_gateway_config_load(cfg, argc, argv, &help, err, errlen);
}

START_TEST(gateway_table)
{
    clear_gateway_env();
    for (size_t i = 0; i < cg_gateway_n_options; i++) {
        const cg_cfg_opt *o = &cg_gateway_options[i];
        ck_assert_msg(o->env && !strncmp(o->env, "CHUNKGATE_", 10), "--%s has no CHUNKGATE_ env",
                      o->name);
        ck_assert_msg(o->help && *o->help, "--%s has no help", o->name);
    }
    cg_gateway_config cfg;
    char err[256];
    ck_assert_int_eq(gw_load(&cfg, NULL, err, sizeof err), CG_OK);
    ck_assert_str_eq(cfg.listen, "127.0.0.1:8080");
    ck_assert_str_eq(cfg.separator, "# #");
    ck_assert_str_eq(cfg.data_dir, "./data");
    ck_assert_int_eq(cfg.chunk_mode, CG_MODE_STRICT);
    ck_assert_int_eq(cfg.log_level, CG_LOG_INFO);
    ck_assert_int_eq(cfg.key_hash, CG_KEY_HASH_XXH3);
    ck_assert_uint_eq(cfg.max_body_bytes, 8u << 20);
    ck_assert_int_eq(cfg.max_segments, 256);
    ck_assert_uint_eq(cfg.max_upstream_bytes, 64u << 20);
    ck_assert_ptr_null(cfg.backend);
    ck_assert_ptr_null(cfg.admin_token);
    ck_assert_uint_eq(cfg.workers.n, 0);
    cg_gateway_config_free(&cfg);

    setenv("CHUNKGATE_WORKERS", "http://w1:1,http://w2:2", 1);
    setenv("CHUNKGATE_ADMIN_TOKEN", "", 1); /* empty = unset */
    setenv("CHUNKGATE_BACKEND", "http://env:1", 1);
    const char *args[] = {"--backend", "http://flag:2", "--max-body-bytes", "1M", NULL};
    ck_assert_int_eq(gw_load(&cfg, args, err, sizeof err), CG_OK);
    ck_assert_uint_eq(cfg.workers.n, 2);
    ck_assert_str_eq(cfg.workers.v[1], "http://w2:2");
    ck_assert_ptr_null(cfg.admin_token);
    ck_assert_str_eq(cfg.backend, "http://flag:2");
    ck_assert_uint_eq(cfg.max_body_bytes, 1u << 20);
    cg_gateway_config_free(&cfg);
}
END_TEST

START_TEST(gateway_bad_values)
{
    clear_gateway_env();
    /* each refusal names the flag */
    const char *cases[][2] = {
        {"--log-level", "loud"},         {"--listen", "nohost"},
        {"--listen", "127.0.0.1:70000"}, {"--backend", "ftp://x"},
        {"--chunk-mode", "loose"},       {"--separator", ""},
        {"--max-segments", "1"},         {"--max-body-bytes", "10"},
        {"--key-hash", "md5"},           {"--recompute-default", "m=1.5"},
        {"--recompute-default", "=0.1"}, {"--recompute-default", "m=0.1:x"},
        {"--recompute-default", "m"},
    };
    for (size_t i = 0; i < sizeof cases / sizeof cases[0]; i++) {
        cg_gateway_config cfg;
        char err[256] = "";
        const char *args[] = {cases[i][0], cases[i][1], NULL};
        ck_assert_msg(gw_load(&cfg, args, err, sizeof err) == CG_E_VALUE, "%s %s accepted",
                      cases[i][0], cases[i][1]);
        ck_assert_msg(strstr(err, cases[i][0]) != NULL, "message '%s' does not name %s", err,
                      cases[i][0]);
        cg_gateway_config_free(&cfg);
    }
}
END_TEST

/* An enum option stores the index of its value, from the default, the environment or a flag,
 * and a value outside its choices is refused with the choices listed. */
START_TEST(enum_values)
{
    clear_env();
    tcfg c;
    int help;
    char err[256];
    const char *none[] = {NULL};
    ck_assert_int_eq(parse(&c, none, &help, err, sizeof err), CG_OK);
    ck_assert_int_eq(c.color, 1);
    cg_config_free(tab, NTAB, &c);
    setenv("CGT_COLOR", "blue", 1);
    ck_assert_int_eq(parse(&c, none, &help, err, sizeof err), CG_OK);
    ck_assert_int_eq(c.color, 2);
    cg_config_free(tab, NTAB, &c);
    const char *flag[] = {"--color", "red", NULL};
    ck_assert_int_eq(parse(&c, flag, &help, err, sizeof err), CG_OK);
    ck_assert_int_eq(c.color, 0);
    cg_config_free(tab, NTAB, &c);
    const char *bad[] = {"--color=mauve", NULL};
    ck_assert_int_eq(parse(&c, bad, &help, err, sizeof err), CG_E_VALUE);
    ck_assert_str_eq(err, "--color: 'mauve' is not one of red, green, blue");
    cg_config_free(tab, NTAB, &c);
    clear_env();
}
END_TEST

/* --recompute-default: the exact model first, then "*"; the prefix tokens only when given. */
START_TEST(gateway_recompute_defaults)
{
    clear_gateway_env();
    cg_gateway_config cfg;
    char err[256] = "";
    const char *args[] = {"--recompute-default",
                          "*=0.2",
                          "--recompute-default",
                          "Qwen/Qwen3-8B=0.15:16",
                          "--recompute-default",
                          "llama3:8b=1",
                          NULL};
    ck_assert_int_eq(gw_load(&cfg, args, err, sizeof err), CG_OK);
    cg_gw_recompute d;
    ck_assert(cg_gateway_recompute_default(&cfg, "Qwen/Qwen3-8B", &d));
    ck_assert(d.ratio == 0.15 && d.prefix == 16);
    ck_assert(cg_gateway_recompute_default(&cfg, "llama3:8b", &d));
    ck_assert(d.ratio == 1.0 && d.prefix == -1);
    ck_assert(cg_gateway_recompute_default(&cfg, "other", &d));
    ck_assert(d.ratio == 0.2 && d.prefix == -1);
    cg_gateway_config_free(&cfg);
    const char *one[] = {"--recompute-default", "m=0.5", NULL};
    ck_assert_int_eq(gw_load(&cfg, one, err, sizeof err), CG_OK);
    ck_assert(!cg_gateway_recompute_default(&cfg, "other", &d));
    ck_assert(!cg_gateway_recompute_default(&cfg, "m2", &d));
    ck_assert(cg_gateway_recompute_default(&cfg, "m", &d));
    cg_gateway_config_free(&cfg);
}
END_TEST

/* A number option holds a double within [min, max] from the default, the environment or a
 * flag; text that is not a whole number and values out of range are refused. */
typedef struct ncfg {
    double ratio;
} ncfg;

START_TEST(number_values)
{
    static const cg_cfg_opt ntab[] = {
        CG_OPT(ncfg, "ratio", "CGT_RATIO", CG_CFG_NUM, ratio, "0.25", 0, 1, "a ratio"),
    };
    struct {
        const char *env, *flag;
        cg_status st;
        double want;
        const char *msg;
    } cases[] = {
        {NULL, NULL, CG_OK, 0.25, NULL},
        {"0.5", NULL, CG_OK, 0.5, NULL},
        {"0.5", "--ratio=1", CG_OK, 1.0, NULL},
        {NULL, "--ratio=1e-2", CG_OK, 0.01, NULL},
        {NULL, "--ratio=1.5", CG_E_VALUE, 0, "--ratio: 1.5 is outside [0, 1]"},
        {NULL, "--ratio=-0.1", CG_E_VALUE, 0, "outside"},
        {NULL, "--ratio=0.3x", CG_E_VALUE, 0, "--ratio: '0.3x' is not a number"},
        {NULL, "--ratio=nan", CG_E_VALUE, 0, "not a number"},
        {"half", NULL, CG_E_VALUE, 0, "'half' is not a number"},
    };
    for (size_t i = 0; i < sizeof cases / sizeof cases[0]; i++) {
        if (cases[i].env)
            setenv("CGT_RATIO", cases[i].env, 1);
        else
            unsetenv("CGT_RATIO");
        char *argv[] = {"prog", (char *)cases[i].flag, NULL};
        ncfg c = {0};
        int help;
        char err[256] = "";
        cg_status st =
            cg_config_parse(ntab, 1, &c, cases[i].flag ? 2 : 1, argv, &help, err, sizeof err);
        ck_assert_msg(st == cases[i].st, "case %zu: %s (%s)", i, cg_status_name(st), err);
        if (st == CG_OK)
            ck_assert_msg(c.ratio == cases[i].want, "case %zu: %g", i, c.ratio);
        else
            ck_assert_msg(strstr(err, cases[i].msg), "case %zu: '%s'", i, err);
    }
    unsetenv("CGT_RATIO");
    char buf[512] = "";
    FILE *f = fmemopen(buf, sizeof buf, "w");
    cg_config_help(f, "usage", ntab, 1);
    fclose(f);
    ck_assert_ptr_nonnull(strstr(buf, "| `--ratio` | `CGT_RATIO` | NUM | 0.25 | a ratio |"));
}
END_TEST

int main(void)
{
    return th_run_tests("config", "table", 0,
                        TH_TESTS(defaults, env_then_flags, sizes, bounds_and_errors,
                                 help_flag_and_text, gateway_table, gateway_bad_values, enum_values,
                                 number_values, gateway_recompute_defaults));
}

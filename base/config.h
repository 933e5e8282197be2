/* One configuration table per program drives flag parsing, CHUNKGATE_* environment
 * variables, validation and --help (Redis configs[], Varnish tbl/params.h). */
#ifndef CG_CONFIG_H
#define CG_CONFIG_H

#include <stddef.h>
#include <stdio.h>
#include "base/status.h"

typedef enum {
    CG_CFG_STR,  /* char * (owned by the config; freed by cg_config_free) */
    CG_CFG_INT,  /* long long, within [min, max] */
    CG_CFG_SIZE, /* size_t, accepts K/M/G suffixes (powers of 1024), within [min, max] */
    CG_CFG_BOOL, /* int 0/1: "--flag" alone, or true/false/1/0/yes/no */
    CG_CFG_LIST, /* cg_strlist, repeatable flag; the env var is comma-separated */
    CG_CFG_ENUM, /* int: the index of the value in choices */
    CG_CFG_NUM,  /* double, within [min, max] */
} cg_cfg_type;

typedef struct cg_strlist {
    char **v; /* NULL-terminated */
    size_t n;
} cg_strlist;

typedef struct cg_cfg_opt {
    const char *name; /* flag without dashes: "listen" -> --listen */
    const char *env;  /* "CHUNKGATE_LISTEN" */
    cg_cfg_type type;
    size_t offset;   /* offsetof(struct, field) */
    const char *def; /* default as text; NULL = unset (NULL string / empty list / 0) */
    long long min, max;
    const char *help;
    const char *const *choices; /* CG_CFG_ENUM: the allowed values, NULL-terminated */
} cg_cfg_opt;

/* One row of a program's table over its config struct T (both programs use these). */
#define CG_OPT(T, name, env, type, field, def, min, max, help)                                     \
    {                                                                                              \
        name, env, type, offsetof(T, field), def, min, max, help, NULL                             \
    }
#define CG_OPT_ENUM(T, name, env, field, def, choices, help)                                       \
    {                                                                                              \
        name, env, CG_CFG_ENUM, offsetof(T, field), def, 0, 0, help, choices                       \
    }

/* The values of --log-level, in cg_log_level order. */
extern const char *const cg_log_level_names[];

/* Applies defaults, then environment variables, then argv flags (flags win), validating
 * each value. Positional arguments are an error. "--help" sets *want_help and returns CG_OK.
 * On failure writes a message naming the option into err. cfg must be zeroed first. */
cg_status cg_config_parse(const cg_cfg_opt *tab, size_t n, void *cfg, int argc, char **argv,
                          int *want_help, char *err, size_t errlen) CG_WUR;

/* Prints the table: usage line, then one row per option (flag, env, default, help). */
void cg_config_help(FILE *out, const char *usage, const cg_cfg_opt *tab, size_t n);

/* Frees the strings and lists that parse stored in cfg. */
void cg_config_free(const cg_cfg_opt *tab, size_t n, void *cfg);

/* A bearer token is non-empty printable ASCII without spaces: 1 when key is one. */
int cg_config_key_valid(const char *key);

/* Reads the one key of the file at path (for --api-key-file and the like): its first line
 * that is neither blank nor a "#" comment, surrounding whitespace trimmed. *out is the
 * caller's (free it after wiping). On failure (unreadable, no key, an invalid key) writes a
 * message that names flag but never the key into err and returns CG_E_VALUE. */
cg_status cg_config_read_key(const char *flag, const char *path, char **out, char *err,
                             size_t errlen) CG_WUR;

#endif

/* Table-driven configuration: defaults, CHUNKGATE_* environment, flags, --help. */
#include "base/config.h"

#include <errno.h>
#include <stdlib.h>
#include <string.h>
#include <strings.h>
#include "base/base.h"

const char *const cg_log_level_names[] = {"debug", "info", "warn", "error", NULL};

static void *field(void *cfg, const cg_cfg_opt *o)
{
    return (char *)cfg + o->offset;
}

static int parse_bool(const char *v, int *out)
{
    if (!strcasecmp(v, "1") || !strcasecmp(v, "true") || !strcasecmp(v, "yes") ||
        !strcasecmp(v, "on"))
        *out = 1;
    else if (!strcasecmp(v, "0") || !strcasecmp(v, "false") || !strcasecmp(v, "no") ||
             !strcasecmp(v, "off"))
        *out = 0;
    else
        return -1;
    return 0;
}

static void list_add(cg_strlist *l, const char *v, size_t len)
{
    l->v = cg_realloc(l->v, (l->n + 2) * sizeof *l->v);
    l->v[l->n++] = cg_strndup(v, len);
    l->v[l->n] = NULL;
}

static void list_clear(cg_strlist *l)
{
    for (size_t i = 0; i < l->n; i++)
        free(l->v[i]);
    cg_free(&l->v);
    l->n = 0;
}

/* Stores text v into the option's field. from_env: lists are comma-separated and replace. */
static cg_status set_value(const cg_cfg_opt *o, void *cfg, const char *v, int append, char *err,
                           size_t errlen)
{
    char *end = NULL;
    switch (o->type) {
    case CG_CFG_STR: {
        char **s = field(cfg, o);
        free(*s);
        *s = cg_strdup(v);
        return CG_OK;
    }
    case CG_CFG_BOOL:
        if (parse_bool(v, field(cfg, o)) != 0) {
            snprintf(err, errlen, "--%s: '%s' is not a boolean (true/false)", o->name, v);
            return CG_E_VALUE;
        }
        return CG_OK;
    case CG_CFG_INT:
    case CG_CFG_SIZE: {
        errno = 0;
        long long x = strtoll(v, &end, 10);
        if (end == v || errno) goto bad_number;
        if (o->type == CG_CFG_SIZE && *end) {
            long long mul = 1;
            switch (*end) {
            case 'k':
            case 'K':
                mul = 1LL << 10;
                break;
            case 'm':
            case 'M':
                mul = 1LL << 20;
                break;
            case 'g':
            case 'G':
                mul = 1LL << 30;
                break;
            default:
                goto bad_number;
            }
            end++;
            if (*end == 'i' || *end == 'I') end++;
            if (*end == 'b' || *end == 'B') end++;
            if (x > (1LL << 62) / mul) goto bad_number;
            x *= mul;
        }
        if (*end) goto bad_number;
        if (x < o->min || x > o->max) {
            snprintf(err, errlen, "--%s: %lld is outside [%lld, %lld]", o->name, x, o->min, o->max);
            return CG_E_VALUE;
        }
        if (o->type == CG_CFG_INT)
            *(long long *)field(cfg, o) = x;
        else
            *(size_t *)field(cfg, o) = (size_t)x;
        return CG_OK;
    }
    case CG_CFG_NUM: {
        errno = 0;
        double x = strtod(v, &end);
        if (end == v || *end || errno || x != x) {
            snprintf(err, errlen, "--%s: '%s' is not a number", o->name, v);
            return CG_E_VALUE;
        }
        if (x < (double)o->min || x > (double)o->max) {
            snprintf(err, errlen, "--%s: %g is outside [%lld, %lld]", o->name, x, o->min, o->max);
            return CG_E_VALUE;
        }
        *(double *)field(cfg, o) = x;
        return CG_OK;
    }
    case CG_CFG_ENUM:
        for (int i = 0; o->choices[i]; i++)
            if (!strcmp(v, o->choices[i])) {
                *(int *)field(cfg, o) = i;
                return CG_OK;
            }
        {
            size_t len = (size_t)snprintf(err, errlen, "--%s: '%s' is not one of", o->name, v);
            for (int i = 0; o->choices[i] && len < errlen; i++)
                len +=
                    (size_t)snprintf(err + len, errlen - len, "%s %s", i ? "," : "", o->choices[i]);
        }
        return CG_E_VALUE;
    case CG_CFG_LIST: {
        cg_strlist *l = field(cfg, o);
        if (!append) {
            list_clear(l);
            for (const char *p = v; *p;) {
                const char *c = strchr(p, ',');
                size_t n = c ? (size_t)(c - p) : strlen(p);
                if (n) list_add(l, p, n);
                p += n + (c ? 1 : 0);
            }
        } else {
            list_add(l, v, strlen(v));
        }
        return CG_OK;
    }
    }
    return CG_E_INTERNAL;
bad_number:
    snprintf(err, errlen, "--%s: '%s' is not a valid %s", o->name, v,
             o->type == CG_CFG_SIZE ? "size (e.g. 512, 64M, 2G)" : "integer");
    return CG_E_VALUE;
}

cg_status cg_config_parse(const cg_cfg_opt *tab, size_t n, void *cfg, int argc, char **argv,
                          int *want_help, char *err, size_t errlen)
{
    cg_status st = CG_OK;
    *want_help = 0;
    for (size_t i = 0; i < n; i++)
        if (tab[i].def && (st = set_value(&tab[i], cfg, tab[i].def, 0, err, errlen)) != CG_OK)
            return st;
    for (size_t i = 0; i < n; i++) {
        const char *v = tab[i].env ? getenv(tab[i].env) : NULL;
        if (v && (st = set_value(&tab[i], cfg, v, 0, err, errlen)) != CG_OK) return st;
    }
    /* Repeated list flags replace the default/env list on their first use. */
    unsigned char *seen = cg_calloc(n ? n : 1, 1);
    for (int a = 1; a < argc; a++) {
        const char *arg = argv[a];
        if (!strcmp(arg, "--help") || !strcmp(arg, "-h")) {
            *want_help = 1;
            continue;
        }
        if (strncmp(arg, "--", 2) != 0) {
            snprintf(err, errlen, "unexpected argument '%s' (see --help)", arg);
            st = CG_E_VALUE;
            goto out;
        }
        const char *name = arg + 2, *eq = strchr(name, '=');
        size_t nl = eq ? (size_t)(eq - name) : strlen(name);
        const cg_cfg_opt *o = NULL;
        size_t idx = 0;
        for (size_t i = 0; i < n; i++)
            if (strlen(tab[i].name) == nl && !strncmp(tab[i].name, name, nl)) {
                o = &tab[i];
                idx = i;
            }
        if (!o) {
            snprintf(err, errlen, "unknown option '%.*s' (see --help)", (int)(nl + 2), arg);
            st = CG_E_VALUE;
            goto out;
        }
        const char *v = eq ? eq + 1 : NULL;
        if (!v && o->type == CG_CFG_BOOL) v = "true";
        if (!v) {
            if (a + 1 >= argc) {
                snprintf(err, errlen, "--%s needs a value", o->name);
                st = CG_E_VALUE;
                goto out;
            }
            v = argv[++a];
        }
        if (o->type == CG_CFG_LIST && !seen[idx]) list_clear(field(cfg, o));
        seen[idx] = 1;
        if ((st = set_value(o, cfg, v, 1, err, errlen)) != CG_OK) goto out;
    }
out:
    free(seen);
    return st;
}

void cg_config_help(FILE *out, const char *usage, const cg_cfg_opt *tab, size_t n)
{
    static const char *types[] = {"STR", "INT", "SIZE", "BOOL", "LIST", "ENUM", "NUM"};
    fprintf(out, "%s\n\nOptions (flags override environment variables):\n\n", usage);
    fprintf(out, "| flag | env | type | default | description |\n|---|---|---|---|---|\n");
    for (size_t i = 0; i < n; i++) {
        const cg_cfg_opt *o = &tab[i];
        fprintf(out, "| `--%s` | `%s` | %s | %s | %s |\n", o->name, o->env ? o->env : "",
                types[o->type], o->def && *o->def ? o->def : "-", o->help);
    }
}

void cg_config_free(const cg_cfg_opt *tab, size_t n, void *cfg)
{
    for (size_t i = 0; i < n; i++) {
        if (tab[i].type == CG_CFG_STR)
            cg_free((char **)field(cfg, &tab[i]));
        else if (tab[i].type == CG_CFG_LIST)
            list_clear(field(cfg, &tab[i]));
    }
}

int cg_config_key_valid(const char *key)
{
    if (!key || !*key) return 0;
    for (const char *k = key; *k; k++)
        if ((unsigned char)*k <= 0x20 || (unsigned char)*k >= 0x7f) return 0;
    return 1;
}

cg_status cg_config_read_key(const char *flag, const char *path, char **out, char *err,
                             size_t errlen)
{
    *out = NULL;
    FILE *f = fopen(path, "r");
    if (!f) {
        snprintf(err, errlen, "%s: cannot read %s: %s", flag, path, strerror(errno));
        return CG_E_VALUE;
    }
    char line[4096];
    while (!*out && fgets(line, sizeof line, f)) {
        char *a = line, *b = line + strlen(line);
        while (a < b && (*a == ' ' || *a == '\t'))
            a++;
        while (b > a && (b[-1] == '\n' || b[-1] == '\r' || b[-1] == ' ' || b[-1] == '\t'))
            b--;
        if (a == b || *a == '#') continue;
        *out = cg_strndup(a, (size_t)(b - a));
    }
    fclose(f);
    explicit_bzero(line, sizeof line);
    if (!*out) {
        snprintf(err, errlen, "%s: %s holds no key", flag, path);
        return CG_E_VALUE;
    }
    if (!cg_config_key_valid(*out)) {
        explicit_bzero(*out, strlen(*out));
        cg_free(out);
        snprintf(err, errlen, "%s: the key in %s contains whitespace or control bytes", flag, path);
        return CG_E_VALUE;
    }
    return CG_OK;
}

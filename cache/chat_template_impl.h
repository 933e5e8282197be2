/* The chat-template renderer's private header: the syntax tree, the tokens, the values and the
 * render context that its lexer, parser, values, strings, filters and evaluator share, and the
 * functions they call across files. Not a public interface: cache/chat_template.h is.
 *
 *   chat_template.c         the public API: parse (preprocess, lex, parse, check) and render
 *   chat_template_base.c    UTF-8, JavaScript character classes, the arena, strings, buffers
 *                           and JavaScript number text
 *   chat_template_lex.c     @huggingface/jinja's whitespace preprocessing and the lexer
 *   chat_template_parse.c   the parser (grammar and precedence) and the post-parse call checks
 *   chat_template_value.c   values, the render context (errors, limits), JSON in and out,
 *                           truthiness, equality, ordering and sorting
 *   chat_template_string.c  case mapping and the JavaScript String methods
 *   chat_template_filter.c  tests, the methods of strings and mappings, and filters
 *   chat_template_eval.c    the evaluator: arguments, calls, operators and statements */
#ifndef CG_CHAT_TEMPLATE_IMPL_H
#define CG_CHAT_TEMPLATE_IMPL_H

#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>
#include <string.h>

#include "cache/chat_template.h"

#define TPL_MAX_SOURCE (1u << 20) /* bytes of template source */
#define TPL_MAX_NEST 256          /* nesting depth of the syntax tree */
#define TPL_MAX_INDENT 10000      /* widest indent tojson/indent accept */

/* ---- arena: every value of one render (and every node of one template) lives here ---- */

typedef struct chunk {
    struct chunk *next;
    size_t used, cap;
    max_align_t data[];
} chunk;

typedef struct arena {
    chunk *head;
    size_t total; /* bytes handed out */
} arena;

/* ---- strings ---- */

/* An immutable string: UTF-8 bytes (borrowed from the vars, the template or the arena) with
 * its length in UTF-16 units, which is what JavaScript's length and indexing count. */
typedef struct jstr {
    const char *p;
    size_t len;
    size_t u16; /* UTF-16 length */
    bool ascii;
} jstr;

/* Growable byte buffer (malloc) with the render's output cap. */
typedef struct sbuf {
    char *p;
    size_t len, cap;
} sbuf;

/* ---- syntax tree ---- */

typedef enum {
    /* statements */
    N_TEXT,
    N_OUTPUT,
    N_IF,
    N_FOR,
    N_SET,
    N_MACRO,
    N_CALLBLOCK,
    N_FILTERBLOCK,
    N_BREAK,
    N_CONTINUE,
    N_COMMENT,
    /* expressions */
    N_STR,
    N_INT,
    N_FLOAT,
    N_IDENT,
    N_ARRAY,
    N_TUPLE,
    N_DICT,
    N_MEMBER,
    N_SLICE,
    N_CALL,
    N_KWARG,
    N_SPREAD,
    N_KWSPREAD,
    N_UNARY,
    N_BINARY,
    N_FILTER,
    N_TEST,
    N_SELECT,
    N_TERNARY
} node_kind;

typedef enum {
    OP_OR,
    OP_AND,
    OP_NOT,
    OP_EQ,
    OP_NE,
    OP_LT,
    OP_GT,
    OP_LE,
    OP_GE,
    OP_IN,
    OP_NOTIN,
    OP_ADD,
    OP_SUB,
    OP_CAT,
    OP_MUL,
    OP_DIV,
    OP_FLOORDIV,
    OP_MOD,
    OP_POW,
    OP_NEG,
    OP_POS
} op_kind;

/* clang-format off */
#define FILTERS(X)                                                                                 \
    X(safe) X(tojson) X(list) X(first) X(last) X(length) X(reverse) X(sort) X(join) X(string)      \
    X(unique) X(upper) X(lower) X(title) X(capitalize) X(trim) X(indent) X(int) X(float) X(abs)    \
    X(items) X(bool) X(default) X(selectattr) X(rejectattr) X(map) X(replace) X(dictsort) X(get)   \
    X(keys) X(values)
#define TESTS(X)                                                                                   \
    X(boolean) X(callable) X(odd) X(even) X(false) X(true) X(none) X(string) X(number)             \
    X(integer) X(iterable) X(mapping) X(sequence) X(lower) X(upper) X(defined) X(undefined)        \
    X(equalto) X(eq)
/* Methods of strings (first two rows) and of mappings (last row). */
#define METHODS(X)                                                                                 \
    X(upper) X(lower) X(strip) X(title) X(capitalize) X(rstrip) X(lstrip) X(startswith)            \
    X(endswith) X(split) X(replace)                                                                \
    X(get) X(items) X(keys) X(values) X(dictsort)
/* clang-format on */

#define ENUM_F(n) F_##n,
#define ENUM_T(n) T_##n,
#define ENUM_M(n) M_##n,
#define NAME_(n) #n,
enum { FILTERS(ENUM_F) F_COUNT };
enum { TESTS(ENUM_T) TEST_COUNT };
enum { METHODS(ENUM_M) M_COUNT };
extern const char *const cgt_filter_names[];
extern const char *const cgt_test_names[];
extern const char *const cgt_method_names[];
#define M_FIRST_MAPPING M_get

typedef struct node node;
typedef struct nodelist {
    node **v;
    size_t n;
} nodelist;

/* One node type for all kinds; which fields a kind uses is listed with the parser below. */
struct node {
    uint8_t kind;
    uint8_t op;     /* op_kind, filter, test */
    uint8_t flag;   /* MEMBER: computed; FILTER: call form; TEST: negated; MACRO: uses kwargs(1)
                       varargs(2) */
    uint16_t depth; /* height of the subtree */
    uint32_t pos;   /* byte offset in the original source */
    node *a, *b, *c;
    nodelist l1, l2;
    jstr *s;
    double num;
};

struct cg_chat_template {
    arena ar; /* nodes and literal strings */
    char *src;
    size_t len;
    nodelist body;
    cg_chat_template_limits lim;
};

/* ---- preprocessed text and tokens ---- */

typedef struct ptext {
    char *s;
    uint32_t *map; /* map[i]: offset in the original source of byte i (n + 1 entries) */
    size_t n;
} ptext;

typedef enum {
    K_EOF,
    K_TEXT,
    K_NUM,
    K_STR,
    K_IDENT,
    K_EQUALS,
    K_LPAREN,
    K_RPAREN,
    K_OPEN_STMT,
    K_CLOSE_STMT,
    K_OPEN_EXPR,
    K_CLOSE_EXPR,
    K_LBRACKET,
    K_RBRACKET,
    K_LBRACE,
    K_RBRACE,
    K_COMMA,
    K_DOT,
    K_COLON,
    K_PIPE,
    K_ADD,
    K_MUL,
    K_POW,
    K_CMP,
    K_UNARY,
    K_COMMENT
} tok_kind;

typedef struct tok {
    uint8_t type;
    uint32_t pos; /* offset in the preprocessed text */
    const char *v;
    size_t len;
} tok;

typedef struct parser {
    cg_chat_template *t;
    const ptext *pt;
    tok *toks;
    size_t n, cap, cur;
    cg_status st;
    char msg[256];
    size_t errpos; /* offset in the original source */
    int depth;
} parser;

/* ---- values ---- */

typedef enum { V_UNDEF, V_NULL, V_BOOL, V_INT, V_FLOAT, V_STR, V_ARR, V_OBJ, V_NS, V_FUNC } vtype;
#define SUB_TUPLE 1  /* V_ARR: a tuple */
#define SUB_KWARGS 1 /* V_OBJ: keyword arguments */

typedef struct jarr jarr;
typedef struct jobj jobj;
typedef struct jfunc jfunc;

typedef struct val {
    uint8_t t;
    uint8_t sub;
    union {
        bool b;
        double n;
        jstr *s;
        jarr *a;
        jobj *o;
        jfunc *f;
    } u;
} val;

struct jarr {
    size_t n;
    val *v;
};

/* Insertion-ordered map (JavaScript Map); a hash index once it grows past 8 keys. */
struct jobj {
    size_t n, cap;
    const jstr **k;
    val *v;
    uint32_t *idx; /* slot -> entry + 1 */
    size_t idxcap;
};

typedef enum {
    FN_NAMESPACE,
    FN_RANGE,
    FN_RAISE,
    FN_STRFTIME,
    FN_METHOD,
    FN_MACRO,
    FN_CALLER
} fn_kind;

typedef struct env env;
struct jfunc {
    uint8_t kind;
    uint8_t method;
    val self;        /* FN_METHOD: the string or mapping */
    const node *def; /* FN_MACRO: the macro; FN_CALLER: the call block */
    env *lex;        /* FN_CALLER: the scope of the call block */
};

struct env {
    env *parent;
    /* Its variables: a mapping, so a scope with many of them (a request's
     * chat_template_kwargs) gets the mapping's hash index, not a scan per lookup. */
    jobj vars;
};

static const val UNDEF = {.t = V_UNDEF};
static const val VNULL = {.t = V_NULL};

/* ---- render context, errors and limits ---- */

enum { RC_OK = 0, RC_ERR, RC_BREAK, RC_CONT };

typedef struct ctx {
    const cg_chat_template *t;
    const cg_chat_template_limits *lim;
    arena ar;
    sbuf *out;
    uint64_t steps;
    unsigned depth;
    cg_status st;
    char msg[1024];
    env *global;
    const node *ctl;  /* the last break or continue, for the error when it escapes every loop */
    size_t buf_alloc; /* bytes of text buffers allocated so far (never decremented) */
} ctx;

#define TRY(x)                                                                                     \
    do {                                                                                           \
        int r_ = (x);                                                                              \
        if (r_) return r_;                                                                         \
    } while (0)

#define TERR(c, at, ...) cgt_rerr((c), (at), CG_E_VALUE, __VA_ARGS__)

/* ---- JSON output and sorting ---- */

typedef struct jopts {
    double indent; /* 0: none */
    bool ensure_ascii;
    bool sort_keys;
    const jstr *item_sep, *key_sep; /* NULL: the defaults */
} jopts;

static const jopts JSON_DEFAULT = {0};

typedef struct sortctx {
    ctx *c;
    const node *at;
    bool case_sensitive, reverse;
    const jstr *attr; /* sort by this attribute path, NULL: the items themselves */
} sortctx;

/* utils.slice of @huggingface/jinja: the indices a[start:stop:step] picks from len items. */
typedef struct slicer {
    double i, stop, step;
    int dir;
} slicer;

/* ---- constructors and predicates of the types above ---- */

static inline val vbool(bool b)
{
    return (val){.t = V_BOOL, .u.b = b};
}

static inline val vint(double n)
{
    return (val){.t = V_INT, .u.n = n};
}

static inline val vfloat(double n)
{
    return (val){.t = V_FLOAT, .u.n = n};
}

static inline val vstr(jstr *s)
{
    return (val){.t = V_STR, .u.s = s};
}

static inline val varr(jarr *a, int sub)
{
    return (val){.t = V_ARR, .sub = (uint8_t)sub, .u.a = a};
}

static inline val vobj(jobj *o, int sub)
{
    return (val){.t = V_OBJ, .sub = (uint8_t)sub, .u.o = o};
}

static inline bool is_num(val v)
{
    return v.t == V_INT || v.t == V_FLOAT;
}

static inline bool is_container(val v) /* ObjectValue or NamespaceValue */
{
    return v.t == V_OBJ || v.t == V_NS;
}

static inline bool is_digit(int c)
{
    return c >= '0' && c <= '9';
}

static inline bool is_word(int c) /* JavaScript's \w: ASCII only */
{
    return is_digit(c) || (c >= 'a' && c <= 'z') || (c >= 'A' && c <= 'Z') || c == '_';
}

static inline bool jstr_eq(const jstr *a, const jstr *b)
{
    return a->len == b->len && (a->len == 0 || memcmp(a->p, b->p, a->len) == 0);
}

static inline bool jstr_eqc(const jstr *a, const char *s)
{
    size_t n = strlen(s);
    return a->len == n && memcmp(a->p, s, n) == 0;
}

/* ---- chat_template_base.c: UTF-8, character classes, arena, strings, numbers ---- */

/* Decodes one code point at p (n bytes left, n > 0); stores its length. Invalid bytes decode
 * as U+FFFD of length 1, so every input makes progress. */
uint32_t cgt_u8_decode(const unsigned char *p, size_t n, size_t *len);

size_t cgt_u8_encode(uint32_t c, char *o);

/* Cuts a NUL-terminated message that snprintf may have truncated inside a character back to
 * whole characters, so an error message is always valid UTF-8 (it goes into JSON replies). */
void cgt_utf8_clip(char *s);

/* Length of the JavaScript whitespace character at p, 0 if there is none. */
size_t cgt_js_space_at(const char *p, size_t n);

/* Length of the JavaScript whitespace character that ends at p + n, 0 if none. */
size_t cgt_js_space_before(const char *p, size_t n);

/* The offset of the first character at or after i in s[0, n) that is no JavaScript space. */
size_t cgt_skip_js_space(const char *s, size_t n, size_t i);

size_t cgt_skip_digits(const char *s, size_t n, size_t i);

/* The value of a hexadecimal digit, -1 for any other character. */
int cgt_hex_digit(int c);

void *cgt_arena_alloc(arena *a, size_t n);

void *cgt_arena_zalloc(arena *a, size_t n);

void cgt_arena_free(arena *a);

void cgt_jstr_measure(jstr *s);

jstr *cgt_jstr_borrow(arena *a, const char *p, size_t len);

jstr *cgt_jstr_copy(arena *a, const char *p, size_t len);

void cgt_sbuf_free(sbuf *b);

/* Appends without a cap; callers check the size they build. */
void cgt_sbuf_put(sbuf *b, const void *p, size_t n);

void cgt_sbuf_putc(sbuf *b, char c);

/* Number.prototype.toString(): shortest round-trip digits, fixed notation for exponents in
 * [-7, 21), exponent notation outside. out must hold 32 bytes. */
void cgt_js_num(double d, char *out);

/* The FloatValue printer of @huggingface/jinja: integral values keep one decimal ("1.0"). */
void cgt_js_float_str(double d, char *out, size_t outlen);

/* ES StringToNumber: whitespace-trimmed decimal, 0x/0o/0b integers, Infinity; "" is 0. */
double cgt_js_str_to_num(const char *p, size_t n);

/* parseInt(s, 10): leading whitespace, sign, digits; NaN when there are none. */
double cgt_js_parse_int(const char *p, size_t n);

/* parseFloat(s): the longest prefix that is a decimal literal or Infinity; NaN if none. */
double cgt_js_parse_float(const char *p, size_t n);

/* 1-based line and column (in code points) of a byte offset of the source. */
void cgt_src_linecol(const char *src, size_t len, size_t off, unsigned *line, unsigned *col);

/* ---- chat_template_lex.c: preprocessing and the lexer ---- */

void cgt_ptext_init(ptext *o, size_t cap);

void cgt_ptext_free(ptext *p);

/* lstrip_blocks: /^[ \t]*({[#%-])/gm -> "$1" */
void cgt_pp_lstrip(const ptext *in, ptext *o);

/* trim_blocks: /([#%-]})\n/g -> "$1" */
void cgt_pp_trim(const ptext *in, ptext *o);

/* /(\s*){%(-?)\s*(?:end)?generation\s*(-?)%}(\s*)/gs: the tag goes, and the whitespace around
 * it stays unless the tag's '-' says otherwise (transformers' AssistantTracker blocks render
 * their body). */
void cgt_pp_generation(const ptext *in, ptext *o);

void *cgt_perr_at(parser *ps, cg_status st, size_t ppos, const char *fmt, ...)
    __attribute__((format(printf, 4, 5)));

/* The tokens of @huggingface/jinja's tokenize(): at each place the first rule that applies. */
bool cgt_lex(parser *ps);

/* ---- chat_template_value.c: values, the render context, JSON, comparisons ---- */

const char *cgt_type_name(val v);

jarr *cgt_arr_new(arena *a, size_t n);

jobj *cgt_obj_new(arena *a);

long cgt_obj_find(const jobj *o, const char *p, size_t n);

bool cgt_obj_get(const jobj *o, const char *p, size_t n, val *out);

/* Map.set: a new key goes last, an existing key keeps its place. */
void cgt_obj_set(arena *a, jobj *o, const jstr *k, val v);

int cgt_rerr(ctx *c, const node *at, cg_status st, const char *fmt, ...)
    __attribute__((format(printf, 4, 5)));

/* Charges k units of work; fails when the render crosses its step or memory bound. */
int cgt_step(ctx *c, const node *at, uint64_t k);

int cgt_work(ctx *c, const node *at, size_t bytes);

/* Appends to a buffer of the render, which no string or output may grow past max_output. */
int cgt_cput(ctx *c, const node *at, sbuf *b, const void *p, size_t n);

int cgt_cputs(ctx *c, const node *at, sbuf *b, const char *s);

int cgt_str_val(ctx *c, const node *at, const char *p, size_t n, val *out);

/* Moves a built buffer into a string value and frees the buffer. */
int cgt_sbuf_val(ctx *c, const node *at, sbuf *b, val *out);

/* Ends a string built in b: after an error r, frees it and returns r; else *out is the string. */
int cgt_sbuf_done(ctx *c, const node *at, sbuf *b, int r, val *out);

env *cgt_env_new(ctx *c, env *parent);

void cgt_env_set(ctx *c, env *e, const jstr *name, val v);

val cgt_fn_val(ctx *c, int kind);

/* Every scope of @huggingface/jinja holds its own 'namespace'; other names resolve outwards. */
val cgt_env_lookup(ctx *c, const env *e, const jstr *name);

const jstr *cgt_cname(ctx *c, const char *s);

/* JSON (borrowed) to a value, as JSON.parse and @huggingface/jinja's convertToRuntimeValues
 * would see it: integral numbers are integers, index-like keys come first. */
int cgt_from_json(ctx *c, const json_t *j, val *out, unsigned depth);

/* toJSON of @huggingface/jinja: tojson, and printing of lists, mappings and namespaces. */
int cgt_to_json(ctx *c, const node *at, sbuf *b, val v, const jopts *o, int depth, bool undef_null);

/* RuntimeValue.toString(): how {{ v }} prints a value. */
int cgt_emit(ctx *c, const node *at, sbuf *b, val v);

/* String(v.value): how '+' and '~' and join see a value (lists join with ',', mappings are
 * "[object Map]"). */
int cgt_raw_str(ctx *c, const node *at, sbuf *b, val v, unsigned depth);

/* __bool__ of @huggingface/jinja (Python-like: empty lists and mappings are false). */
bool cgt_truthy(val v);

/* !!v.value: JavaScript truthiness of the underlying value (objects are always true). */
bool cgt_raw_truthy(val v);

/* ===: same type and value; objects by identity; integers and floats are both numbers. */
bool cgt_strict_eq(val a, val b);

/* SameValueZero, the equality of Set (NaN equals itself). */
bool cgt_same_value_zero(val a, val b);

/* JavaScript's == on the underlying values (IsLooselyEqual). */
int cgt_loose_eq(ctx *c, const node *at, val a, val b, bool *res);

/* Stable merge sort (Array.prototype.sort is stable) whose comparison may fail. */
int cgt_merge_sort(sortctx *s, val *v, size_t n);

/* getAttributeValue: a dotted path through mappings, namespaces and list indices. */
val cgt_attr_path(ctx *c, val item, const jstr *path);

/* ---- chat_template_string.c: case mapping and String methods ---- */

/* Appends s upper-cased (upper) or lower-cased to b. */
int cgt_case_map(ctx *c, const node *at, const jstr *s, bool upper, sbuf *b);

int cgt_case_val(ctx *c, const node *at, const jstr *s, bool upper, val *out);

slicer cgt_slice_begin(double len, const val *start, const val *stop, const val *stepv);

bool cgt_slice_next(slicer *s, size_t *idx);

/* Byte offsets of the code points of s (n + 1 entries). */
size_t *cgt_cp_offsets(ctx *c, const jstr *s, size_t *n);

/* s[i]: JavaScript's String.prototype.at (UTF-16 units; half a surrogate pair prints as
 * U+FFFD). */
int cgt_str_at(ctx *c, const node *at, const jstr *s, double i, val *out);

/* trim / trimStart / trimEnd with JavaScript's whitespace. */
val cgt_str_trim(ctx *c, const jstr *s, bool left, bool right);

/* titleCase: /\b\w/g upper-cased; \w and \b are ASCII-only. */
int cgt_str_title(ctx *c, const node *at, const jstr *s, val *out);

/* charAt(0).toUpperCase() + slice(1): only the first UTF-16 unit changes. */
int cgt_str_capitalize(ctx *c, const node *at, const jstr *s, val *out);

bool cgt_has_prefix(const jstr *s, const jstr *p, bool suffix);

const char *cgt_memfind(const char *h, size_t hn, const char *n, size_t nn);

/* Python-style str.split(sep=None, maxsplit=-1) as @huggingface/jinja implements it. */
int cgt_str_split(ctx *c, const node *at, const jstr *s, val sep, val maxsplit, val *out);

/* utils.replace: count < 0 or null replaces all; an empty needle matches between code points. */
int cgt_str_replace(ctx *c, const node *at, const jstr *s, const jstr *from, const jstr *to,
                    val count, val *out);

/* The indent filter: every line but (unless first) the first and (unless blank) empty ones. */
int cgt_str_indent(ctx *c, const node *at, const jstr *s, double width, bool first, bool blank,
                   val *out);

/* Concatenation of two strings (no copy when one side is empty). */
int cgt_str_concat(ctx *c, const node *at, const jstr *a, const jstr *b, val *out);

/* String(v) as a string value. */
int cgt_raw_val(ctx *c, const node *at, val v, val *out);

/* ---- chat_template_filter.c: tests, methods and filters ---- */

int cgt_run_test(ctx *c, const node *at, int test, val v, const val *arg, bool *res);

int cgt_obj_items(ctx *c, const jobj *o, int which, val *out);

int cgt_method_call(ctx *c, env *e, const node *at, const jfunc *f, val *args, size_t n, val *out);

/* Property access (MemberExpression): mapping keys, then a mapping's methods; list and string
 * indices; a string's methods and length. Anything else is undefined. */
int cgt_member_get(ctx *c, const node *at, val obj, val prop, val *out);

int cgt_apply_filter(ctx *c, env *e, const node *f, val v, val *out);

/* ---- chat_template_eval.c: arguments and statements ---- */

val cgt_kwargs_val(ctx *c, jobj *kw);

/* evaluateArguments: positional values (with *spread) and keyword values (with **spread). */
int cgt_eval_args(ctx *c, env *e, const nodelist *args, val **pos, size_t *npos, jobj **kw);

bool cgt_kw_get(const jobj *kw, const char *name, val *out);

/* args.at(i) ?? kwargs.get(name) ?? fallback */
val cgt_arg_or(const val *pos, size_t n, size_t i, const jobj *kw, const char *name, val fallback);

int cgt_exec_list(ctx *c, env *e, const nodelist *l);

/* ---- chat_template_parse.c: the parser ---- */

/* Lexes and parses ps->pt into ps->t->body, then checks that every call names something the
 * renderer can call. False, with the error in ps, when any step fails. */
bool cgt_parse(parser *ps);

#endif

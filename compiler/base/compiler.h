/* compiler.h — internal declarations of libntpc, sectioned by the file that defines them. */
#ifndef NTP_COMPILER_H
#define NTP_COMPILER_H

#include <setjmp.h>
#include <stdarg.h>
#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>
#include <stdio.h>

#include "ntpc.h"

/* A source range. Lines and columns are 1-based; last_column is inclusive. The field
 * names are bison's, so this type doubles as the parser's location type. */
typedef struct ntp_loc {
  int first_line, first_column, last_line, last_column;
} ntp_loc;

#define NTP_NOLOC ((ntp_loc){0, 0, 0, 0})

/* ---- arena.c: one pool per compilation, freed in one call --------------------- */
typedef struct arena_block arena_block;
typedef struct arena {
  arena_block *head;
} arena;

void *arena_alloc(arena *a, size_t size);   /* zeroed, 16-byte aligned; aborts never: returns NULL on OOM */
char *arena_strdup(arena *a, const char *s);
char *arena_strndup(arena *a, const char *s, size_t n);
char *arena_printf(arena *a, const char *fmt, ...) __attribute__((format(printf, 2, 3)));
void arena_free(arena *a);

/* Growable array of fixed-size elements (heap, not arena: IR tables grow). */
#define VEC_PUSH(arr, len, cap, val)                                                       \
  (((len) >= (cap) ? vec_grow((void **)&(arr), &(cap), sizeof *(arr)) : 0),               \
   (arr)[(len)++] = (val))
void vec_grow(void **arr, size_t *cap, size_t elem);

/* Out of memory while a compiler table grows (vec_grow, strmap_put): the library's entry points
 * (ntpc_compile_*, the planner's) set a recovery point first, and the growth jumps back to it,
 * so the entry returns "out of memory" instead of the process aborting. An entry point is
 * written once as `NTP_OOM_GUARDED(its_unguarded_body(...), value_on_oom)` (below).
 * Tables stay consistent (a failed growth keeps the old block); what was half built leaks. */
typedef struct ntp_oom_guard {
  jmp_buf jb;
  struct ntp_oom_guard *prev;
} ntp_oom_guard;
void ntp_oom_push(ntp_oom_guard *g);
void ntp_oom_pop(ntp_oom_guard *g);
_Noreturn void ntp_out_of_memory(void);
/* Returns `call`'s result, or `on_oom` (evaluated after the jump) when a table could not grow
 * during it. For a function body: it returns in both cases. */
#define NTP_OOM_GUARDED(call, on_oom)        \
  do {                                       \
    ntp_oom_guard g_;                        \
    ntp_oom_push(&g_);                       \
    if (setjmp(g_.jb)) return (on_oom);      \
    __typeof__(call) r_ = (call);            \
    ntp_oom_pop(&g_);                        \
    return r_;                               \
  } while (0)
/* Test hook: the n-th table growth from now (on this thread) fails as if memory ran out; 0: off. */
void ntp_fail_growth_after(long n);

/* ---- diag.c: diagnostics as data ---------------------------------------------- */
typedef struct source_file {
  const char *name;
  const char *text;
  size_t len;
  size_t *line_start; /* offset of each line, built on first use by source_line */
  size_t nlines;
} source_file;

/* Line `line` (1-based) of f and its length without the newline, or NULL past the end; an
 * index built once (in pool) makes each call O(1), however many diagnostics a file gets. */
const char *source_line(arena *pool, source_file *f, int line, size_t *len);

typedef struct diag_sink {
  ntpc_diag *items;
  size_t len, cap;
  size_t errors;
  size_t error_limit; /* 0: none; else errors beyond it are dropped and `stopped` is set */
  bool stopped;       /* the limit was reached: the passes stop early */
  bool out_of_memory; /* a pass ran out of memory (not a diagnostic: reporting it needs memory) */
  struct strmap *seen; /* "file:line:col" of every error so far (see diag_vemit) */
  bool dropping;       /* the last error was a repeat: drop its notes too */
  arena *pool;
  source_file **files; /* to render source lines */
  size_t nfiles, files_cap;
} diag_sink;

void diag_add_file(diag_sink *d, source_file *f);
void diag_emit(diag_sink *d, ntpc_severity sev, const char *file, ntp_loc loc, const char *fmt, ...)
    __attribute__((format(printf, 5, 6)));
void diag_vemit(diag_sink *d, ntpc_severity sev, const char *file, ntp_loc loc, const char *fmt, va_list ap);
void diag_render(const diag_sink *d, FILE *out, int color);
void diag_render_from(const diag_sink *d, size_t first, FILE *out, int color); /* items [first, len) */
void diag_free(diag_sink *d);
static inline void diag_out_of_memory(diag_sink *d) { d->out_of_memory = true; }
/* Nearest candidate to `name` by edit distance, or NULL if none is close. */
const char *nearest_name(const char *name, const char *const *cands, size_t n);

/* ---- strmap.c: string -> int64 hash map (open addressing) --------------------- */
typedef struct strmap {
  const char **keys;
  int64_t *vals;
  size_t cap, len;
} strmap;

bool strmap_get(const strmap *m, const char *key, int64_t *val);
void strmap_put(strmap *m, const char *key, int64_t val); /* key must outlive the map */
void strmap_free(strmap *m);

/* ---- ast.c: the syntax tree (arena-allocated) ------------------------------- */
typedef enum { AST_INT, AST_FLOAT, AST_NAME, AST_BINOP, AST_NEG, AST_CALL } ast_expr_kind;

typedef struct ast_expr ast_expr;
typedef struct ast_arg ast_arg;

typedef struct ast_tp {
  ntp_loc loc;
  bool is_auto;
  ast_expr *degrees; /* list through ->next */
} ast_tp;

struct ast_expr {
  ast_expr_kind kind;
  ntp_loc loc;
  ast_expr *next; /* in lists (tp degrees, mesh dims, batch split) */
  ast_expr *tail; /* on a list's head: its last node, so the parser appends in O(1) */
  int depth;      /* nesting depth of the tree below, bounded by the parser */
  union {
    int64_t ival;
    double fval;
    const char *name;
    struct {
      int op; /* '+', '-', '*', '/', '@' */
      ast_expr *lhs, *rhs;
    } bin;
    ast_expr *operand;
    struct {
      const char *label; /* NULL for plain functions; set for layers */
      ntp_loc label_loc;
      const char *callee;
      ntp_loc callee_loc;
      ast_arg *args;
      ast_tp *tp;
    } call;
  };
};

struct ast_arg {
  ntp_loc loc;
  const char *key; /* NULL for positional */
  ntp_loc key_loc;
  ast_expr *value;
  ast_arg *next, *tail;
};

typedef struct ast_ident {
  const char *name;
  ntp_loc loc;
  struct ast_ident *next, *tail;
} ast_ident;

typedef struct ast_tdim {
  ntp_loc loc;
  ast_expr *size;
  ast_ident *axes;
  struct ast_tdim *next, *tail;
} ast_tdim;

typedef struct ast_type {
  ntp_loc loc;
  int dtype; /* ntp_dtype, or -1 for a bare layout */
  ntp_loc dtype_loc;
  ast_tdim *dims;
  bool diagonal;
} ast_type;

typedef enum { ST_DIM, ST_DTYPE, ST_MESH, ST_INPUT, ST_PARAM, ST_ASSIGN, ST_OUTPUT_NAME, ST_REPEAT } ast_stmt_kind;

typedef struct ast_stmt ast_stmt;
struct ast_stmt {
  ast_stmt_kind kind;
  ntp_loc loc;
  ast_stmt *next, *tail;
  const char *name; /* dim, mesh, input, param, assignment target, output name, repeat name */
  ntp_loc name_loc;
  ast_expr *expr;   /* dim value, assignment value, repeat count, mesh dims (list) */
  ast_type *type;   /* input/param type, requested output layout */
  ast_ident *axes;  /* mesh axis names */
  ast_stmt *body;   /* repeat */
  int dtype;        /* ST_DTYPE */
  bool is_output;
};

typedef enum { PST_WORLD, PST_RULE, PST_STAGE, PST_PIPELINE, PST_STAGES, PST_OPTIMIZER, PST_MICRO_BATCHES, PST_SCHEDULE } ast_pstmt_kind;
typedef struct ast_pstmt {
  ast_pstmt_kind kind;
  ntp_loc loc;
  struct ast_pstmt *next, *tail;
  ast_expr *world;
  const char *pattern;
  ntp_loc pattern_loc;
  ast_tp *tp;
  bool seq_parallel;
  bool recompute; /* training: the layer's forward runs again in its backward */
  ast_expr *batch; /* list */
  ntp_loc batch_loc;
  /* PST_STAGE: layers first..last (names or dotted prefixes) on ranks rank_lo..rank_hi */
  const char *last;
  ntp_loc last_loc;
  ast_expr *rank_lo, *rank_hi;
  ntp_loc ranks_loc;
  /* PST_PIPELINE: its stages (body) and batch share (world: NULL = its rank count);
     PST_STAGES: world holds the stage count */
  struct ast_pstmt *body;
  ast_arg *settings; /* PST_OPTIMIZER: name value pairs (zero 1, redundancy 2) */
  /* PST_SCHEDULE: the schedule's name in `pattern` (gpipe, 1f1b, interleaved, zb-h1) */
} ast_pstmt;

typedef struct ast_model {
  const char *name;
  ntp_loc loc, name_loc;
  const char *file;
  ast_stmt *stmts;
  struct ast_model *next, *tail;
} ast_model;

typedef struct ast_plan {
  const char *name, *model;
  ntp_loc loc, name_loc, model_loc;
  const char *file;
  ast_pstmt *stmts;
  struct ast_plan *next, *tail;
} ast_plan;

typedef struct ast_file {
  ast_model *models;
  ast_plan *plans;
} ast_file;

void ast_print(const ast_file *f, FILE *out);

/* ---- parse.c glue (grammar/): parse one source file, appending to `into` --------- */
typedef struct parse_ctx {
  arena *pool;
  diag_sink *diags;
  source_file *src;
  ast_file *out;
  /* for "expected ';'" at the end of the previous token */
  ntp_loc prev_tok, cur_tok;
  /* unclosed-brace notes */
  ntp_loc open_braces[64];
  int nbraces;
  FILE *token_dump; /* --emit=tokens */
  int line, col;    /* scanner position */
  ntp_loc comment_start;
  void *scanner;
} parse_ctx;

bool parse_source(parse_ctx *ctx);
bool lex_begin(parse_ctx *ctx); /* lexer.l */
void lex_end(parse_ctx *ctx);

#endif

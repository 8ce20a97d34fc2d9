/* parser.y — pure, reentrant bison parser for .ntp files.
 * Builds the AST of compiler.h; recovers from errors at statement level so one run
 * reports several; custom error messages name what was expected and what was found. */
%require "3.8"
%define api.pure full
%define api.location.type {ntp_loc}
%define parse.error custom
%define api.symbol.prefix {S_}
%locations
%param {parse_ctx *ctx}

%code requires {
#include "compiler.h"
}


%code {
#include <string.h>

static int yylex(YYSTYPE *lval, ntp_loc *lloc, parse_ctx *ctx);

#include "ntp_types.h"

#define NEW(T) ((T *)arena_alloc(ctx->pool, sizeof(T)))
/* Appends item (a node, or a list whose head knows its tail) in O(1): the head of every
 * list keeps its last node, so a long file is not quadratic to parse. */
#define APPEND(T, head, item)                                   \
  do {                                                          \
    T *item_ = (item);                                          \
    if (!item_) break;                                          \
    T *last_ = item_->tail ? item_->tail : item_;               \
    if (!(head)) { (head) = item_; (head)->tail = last_; break; } \
    ((head)->tail ? (head)->tail : (head))->next = item_;       \
    (head)->tail = last_;                                       \
  } while (0)

/* Sema, the printers and the passes walk expressions recursively: the parser bounds the
 * depth (a long a + b + c + ... chain is deep on its left), so none of them can overflow the
 * stack. One report, where the limit is first crossed. */
enum { MAX_EXPR_DEPTH = 1000 };

static void set_depth(parse_ctx *ctx, ast_expr *e, int below) {
  if (!e) return;
  e->depth = below + 1;
  if (e->depth == MAX_EXPR_DEPTH + 1)
    diag_emit(ctx->diags, NTPC_ERROR, ctx->src->name, e->loc,
              "expression nested more than %d levels deep; split it into several statements", MAX_EXPR_DEPTH);
}

static int depth_of(const ast_expr *e) { return e ? e->depth : 0; }
static int max_depth(int a, int b) { return a > b ? a : b; }

static ast_expr *mk_expr(parse_ctx *ctx, ast_expr_kind k, ntp_loc loc) {
  ast_expr *e = NEW(ast_expr);
  if (e) { e->kind = k; e->loc = loc; }
  return e;
}

static ast_expr *mk_bin(parse_ctx *ctx, int op, ast_expr *l, ast_expr *r, ntp_loc loc) {
  ast_expr *e = mk_expr(ctx, AST_BINOP, loc);
  if (e) { e->bin.op = op; e->bin.lhs = l; e->bin.rhs = r; set_depth(ctx, e, max_depth(depth_of(l), depth_of(r))); }
  return e;
}

static int args_depth(const ast_arg *a) {
  int d = 0;
  for (; a; a = a->next) d = max_depth(d, depth_of(a->value));
  return d;
}

static ast_stmt *mk_stmt(parse_ctx *ctx, ast_stmt_kind k, ntp_loc loc) {
  ast_stmt *s = NEW(ast_stmt);
  if (s) { s->kind = k; s->loc = loc; }
  return s;
}

static ast_ident *mk_ident(parse_ctx *ctx, const char *name, ntp_loc loc) {
  ast_ident *i = NEW(ast_ident);
  if (i) { i->name = name; i->loc = loc; }
  return i;
}

static void perror_at(parse_ctx *ctx, ntp_loc loc, const char *msg) {
  diag_emit(ctx->diags, NTPC_ERROR, ctx->src->name, loc, "%s", msg);
}

/* `yyerror` is only reached for internal parser failures (memory exhaustion). */
static void yyerror(ntp_loc *loc, parse_ctx *ctx, const char *msg) {
  /* bison's stack is bounded (YYMAXDEPTH): deep nesting is the way to exhaust it */
  if (strcmp(msg, "memory exhausted") == 0) msg = "the input is nested too deeply for the parser";
  perror_at(ctx, *loc, msg);
}
}

%union {
  int64_t ival;
  double fval;
  const char *str;
  int dtype;
  ast_expr *expr;
  ast_arg *arg;
  ast_tp *tp;
  ast_ident *ident;
  ast_tdim *tdim;
  ast_type *type;
  ast_stmt *stmt;
  ast_pstmt *pstmt;
  ast_model *model;
  ast_plan *plan;
}

%token KW_MODEL "'model'" KW_PLAN "'plan'" KW_FOR "'for'" KW_DIM "'dim'" KW_DTYPE "'dtype'"
%token KW_MESH "'mesh'" KW_INPUT "'input'" KW_PARAM "'param'" KW_OUTPUT "'output'"
%token KW_REPEAT "'repeat'" KW_AS "'as'" KW_WORLD "'world'" KW_TP "'tp'" KW_AUTO "'auto'"
%token KW_DIAGONAL "'diagonal'" KW_SEQPAR "'sequence_parallel'" KW_RECOMPUTE "'recompute'" KW_BATCH "'batch'"
%token KW_STAGE "'stage'" KW_STAGES "'stages'" KW_PIPELINE "'pipeline'" KW_RANKS "'ranks'"
%token KW_MICRO_BATCHES "'micro_batches'" KW_SCHEDULE "'schedule'"
%token KW_OPTIMIZER "'optimizer'"
%token AT_TP "'@tp'" ARROW "'->'" DOTDOT "'..'"
%token <str> IDENT "name" PATH "dotted name"
%token <ival> INT "integer"
%token <fval> FLOAT "number"
%token <dtype> DTYPE "dtype"

%nterm <model> model
%nterm <plan> plan
%nterm <stmt> stmts stmt dimdefs dimdef
%nterm <expr> expr primary meshdims meshdim exprs tpspec
%nterm <arg> args arg opt_settings
%nterm <tp> tp_opt
%nterm <ident> idents
%nterm <tdim> tdims tdim
%nterm <type> type layout layout_opt
%nterm <pstmt> pstmts pstmt options option stage stages
%nterm <str> stage_last sched_name
%nterm <expr> pipe_share
%nterm <str> pattern
%nterm <ival> diag_opt

%left '+' '-'
%left '*' '/' '@'
%precedence NEG

%%

/* file -> { model | plan } */
file:
    %empty
  | file model  { APPEND(ast_model, ctx->out->models, $2); }
  | file plan   { APPEND(ast_plan, ctx->out->plans, $2); }
  ;

/* model -> 'model' name '{' stmts '}' */
model:
    KW_MODEL IDENT '{' stmts '}' {
      $$ = NEW(ast_model);
      $$->name = $2; $$->loc = @$; $$->name_loc = @2; $$->file = ctx->src->name; $$->stmts = $4;
    }
  ;

stmts:
    %empty        { $$ = NULL; }
  | stmts stmt    { $$ = $1; if ($2) APPEND(ast_stmt, $$, $2); }
  ;

stmt:
    KW_DIM dimdefs ';'            { $$ = $2; }
  | KW_DTYPE DTYPE ';'            { $$ = mk_stmt(ctx, ST_DTYPE, @$); $$->dtype = $2; }
  | KW_MESH IDENT '=' meshdims '(' idents ')' ';' {
      $$ = mk_stmt(ctx, ST_MESH, @$); $$->name = $2; $$->name_loc = @2; $$->expr = $4; $$->axes = $6;
    }
  | KW_INPUT IDENT ':' type ';'   { $$ = mk_stmt(ctx, ST_INPUT, @$); $$->name = $2; $$->name_loc = @2; $$->type = $4; }
  | KW_PARAM IDENT ':' type ';'   { $$ = mk_stmt(ctx, ST_PARAM, @$); $$->name = $2; $$->name_loc = @2; $$->type = $4; }
  | IDENT '=' expr layout_opt ';' {
      $$ = mk_stmt(ctx, ST_ASSIGN, @$); $$->name = $1; $$->name_loc = @1; $$->expr = $3; $$->type = $4;
    }
  | KW_OUTPUT IDENT '=' expr layout_opt ';' {
      $$ = mk_stmt(ctx, ST_ASSIGN, @$); $$->name = $2; $$->name_loc = @2; $$->expr = $4; $$->type = $5;
      $$->is_output = true;
    }
  | KW_OUTPUT IDENT ';'           { $$ = mk_stmt(ctx, ST_OUTPUT_NAME, @$); $$->name = $2; $$->name_loc = @2; }
  | KW_REPEAT expr KW_AS IDENT '{' stmts '}' {
      $$ = mk_stmt(ctx, ST_REPEAT, @$); $$->expr = $2; $$->name = $4; $$->name_loc = @4; $$->body = $6;
    }
  | error ';'                     { $$ = NULL; yyerrok; }
  ;

dimdefs:
    dimdef                        { $$ = $1; }
  | dimdefs ',' dimdef            { $$ = $1; APPEND(ast_stmt, $$, $3); }
  ;

dimdef:
    IDENT '=' expr                { $$ = mk_stmt(ctx, ST_DIM, @$); $$->name = $1; $$->name_loc = @1; $$->expr = $3; }
  ;

/* meshdims -> meshdim { 'x' meshdim } */
meshdims:
    meshdim                       { $$ = $1; }
  | meshdims IDENT meshdim        {
      $$ = $1;
      if (strcmp($2, "x") != 0) perror_at(ctx, @2, "expected 'x' between mesh dimensions");
      APPEND(ast_expr, $$, $3);
    }
  ;

meshdim:
    INT                           { $$ = mk_expr(ctx, AST_INT, @$); $$->ival = $1; }
  | IDENT                         { $$ = mk_expr(ctx, AST_NAME, @$); $$->name = $1; }
  | '(' expr ')'                  { $$ = $2; }
  ;

idents:
    IDENT                         { $$ = mk_ident(ctx, $1, @1); }
  | idents ',' IDENT              { $$ = $1; APPEND(ast_ident, $$, mk_ident(ctx, $3, @3)); }
  ;

/* type -> dtype layout */
type:
    DTYPE layout                  { $$ = $2; $$->dtype = $1; $$->dtype_loc = @1; $$->loc = @$; }
  ;

layout:
    '[' tdims ']' diag_opt        { $$ = NEW(ast_type); $$->loc = @$; $$->dtype = -1; $$->dims = $2; $$->diagonal = $4; }
  ;

diag_opt:
    %empty                        { $$ = 0; }
  | KW_DIAGONAL                   { $$ = 1; }
  ;

layout_opt:
    %empty                        { $$ = NULL; }
  | ARROW layout                  { $$ = $2; }
  ;

tdims:
    tdim                          { $$ = $1; }
  | tdims ',' tdim                { $$ = $1; APPEND(ast_tdim, $$, $3); }
  ;

/* tdim -> expr [ '{' axis { ',' axis } '}' ] */
tdim:
    expr                          { $$ = NEW(ast_tdim); $$->loc = @$; $$->size = $1; }
  | expr '{' idents '}'           { $$ = NEW(ast_tdim); $$->loc = @$; $$->size = $1; $$->axes = $3; }
  ;

expr:
    expr '+' expr                 { $$ = mk_bin(ctx, '+', $1, $3, @$); }
  | expr '-' expr                 { $$ = mk_bin(ctx, '-', $1, $3, @$); }
  | expr '*' expr                 { $$ = mk_bin(ctx, '*', $1, $3, @$); }
  | expr '/' expr                 { $$ = mk_bin(ctx, '/', $1, $3, @$); }
  | expr '@' expr                 { $$ = mk_bin(ctx, '@', $1, $3, @$); }
  | '-' expr %prec NEG            { $$ = mk_expr(ctx, AST_NEG, @$); $$->operand = $2; set_depth(ctx, $$, depth_of($2)); }
  | primary                       { $$ = $1; }
  ;

primary:
    INT                           { $$ = mk_expr(ctx, AST_INT, @$); $$->ival = $1; }
  | FLOAT                         { $$ = mk_expr(ctx, AST_FLOAT, @$); $$->fval = $1; }
  | IDENT                         { $$ = mk_expr(ctx, AST_NAME, @$); $$->name = $1; }
  | '(' expr ')'                  { $$ = $2; }
  | IDENT '(' ')'                 {
      $$ = mk_expr(ctx, AST_CALL, @$); $$->call.callee = $1; $$->call.callee_loc = @1;
    }
  | IDENT '(' args ')'            {
      $$ = mk_expr(ctx, AST_CALL, @$); $$->call.callee = $1; $$->call.callee_loc = @1; $$->call.args = $3;
      set_depth(ctx, $$, args_depth($3));
    }
  | IDENT ':' IDENT '(' ')' tp_opt {
      $$ = mk_expr(ctx, AST_CALL, @$); $$->call.label = $1; $$->call.label_loc = @1;
      $$->call.callee = $3; $$->call.callee_loc = @3; $$->call.tp = $6;
    }
  | IDENT ':' IDENT '(' args ')' tp_opt {
      $$ = mk_expr(ctx, AST_CALL, @$); $$->call.label = $1; $$->call.label_loc = @1;
      $$->call.callee = $3; $$->call.callee_loc = @3; $$->call.args = $5; $$->call.tp = $7;
      set_depth(ctx, $$, args_depth($5));
    }
  ;

args:
    arg                           { $$ = $1; }
  | args ',' arg                  { $$ = $1; APPEND(ast_arg, $$, $3); }
  ;

arg:
    expr                          { $$ = NEW(ast_arg); $$->loc = @$; $$->value = $1; }
  | IDENT '=' expr                { $$ = NEW(ast_arg); $$->loc = @$; $$->key = $1; $$->key_loc = @1; $$->value = $3; }
  | KW_DIM '=' expr               { $$ = NEW(ast_arg); $$->loc = @$; $$->key = "dim"; $$->key_loc = @1; $$->value = $3; }
  ;

/* tp -> '@tp' '(' ( 'auto' | expr { ',' expr } ) ')' */
tp_opt:
    %empty                        { $$ = NULL; }
  | AT_TP '(' KW_AUTO ')'         { $$ = NEW(ast_tp); $$->loc = @$; $$->is_auto = true; }
  | AT_TP '(' exprs ')'           { $$ = NEW(ast_tp); $$->loc = @$; $$->degrees = $3; }
  ;

exprs:
    expr                          { $$ = $1; }
  | exprs ',' expr                { $$ = $1; APPEND(ast_expr, $$, $3); }
  ;

/* plan -> 'plan' name 'for' model '{' pstmts '}' */
plan:
    KW_PLAN IDENT KW_FOR IDENT '{' pstmts '}' {
      $$ = NEW(ast_plan);
      $$->name = $2; $$->model = $4; $$->loc = @$; $$->name_loc = @2; $$->model_loc = @4;
      $$->file = ctx->src->name; $$->stmts = $6;
    }
  ;

pstmts:
    %empty                        { $$ = NULL; }
  | pstmts pstmt                  { $$ = $1; if ($2) APPEND(ast_pstmt, $$, $2); }
  ;

pstmt:
    KW_WORLD expr ';'             { $$ = NEW(ast_pstmt); $$->kind = PST_WORLD; $$->loc = @$; $$->world = $2; }
  | pattern KW_TP tpspec options ';' {
      $$ = $4 ? $4 : NEW(ast_pstmt);
      $$->kind = PST_RULE; $$->loc = @$; $$->pattern = $1; $$->pattern_loc = @1;
      $$->tp = NEW(ast_tp); $$->tp->loc = @3;
      if ($3) $$->tp->degrees = $3; else $$->tp->is_auto = true;
    }
  | stage                         { $$ = $1; }
  | KW_STAGES expr ';'            { $$ = NEW(ast_pstmt); $$->kind = PST_STAGES; $$->loc = @$; $$->world = $2; }
  | KW_PIPELINE pipe_share '{' stages '}' {
      $$ = NEW(ast_pstmt); $$->kind = PST_PIPELINE; $$->loc = @1; $$->world = $2; $$->body = $4;
    }
  | KW_MICRO_BATCHES expr ';'     { $$ = NEW(ast_pstmt); $$->kind = PST_MICRO_BATCHES; $$->loc = @$; $$->world = $2; }
  | KW_SCHEDULE sched_name ';'    {
      $$ = NEW(ast_pstmt); $$->kind = PST_SCHEDULE; $$->loc = @$; $$->pattern = $2; $$->pattern_loc = @2;
    }
  | KW_OPTIMIZER opt_settings ';' { $$ = NEW(ast_pstmt); $$->kind = PST_OPTIMIZER; $$->loc = @$; $$->settings = $2; }
  | error ';'                     { $$ = NULL; yyerrok; }
  ;

/* schedule -> 'schedule' name ';' with the command line's names: gpipe, 1f1b, interleaved, zb-h1
   (1f1b lexes as 1 and f1b, zb-h1 as zb - h1: put back together) */
sched_name:
    IDENT                         { $$ = $1; }
  | INT IDENT                     { $$ = arena_printf(ctx->pool, "%lld%s", (long long)$1, $2); }
  | IDENT '-' IDENT               { $$ = arena_printf(ctx->pool, "%s-%s", $1, $3); }
  ;

/* optimizer -> 'optimizer' (name value)+ ';'   e.g. optimizer zero 1 redundancy 2; */
opt_settings:
    IDENT expr                    { $$ = NEW(ast_arg); $$->loc = @$; $$->key = $1; $$->key_loc = @1; $$->value = $2; }
  | opt_settings IDENT expr       {
      $$ = $1; ast_arg *a = NEW(ast_arg); a->loc = @2; a->key = $2; a->key_loc = @2; a->value = $3; APPEND(ast_arg, $$, a);
    }
  ;

/* stage -> 'stage' first [ '..' last ] 'ranks' lo [ '..' hi ] ';' */
stage:
    KW_STAGE pattern stage_last KW_RANKS expr ';' {
      $$ = NEW(ast_pstmt); $$->kind = PST_STAGE; $$->loc = @$; $$->pattern = $2; $$->pattern_loc = @2;
      $$->last = $3 ? $3 : $2; $$->last_loc = $3 ? @3 : @2; $$->rank_lo = $$->rank_hi = $5; $$->ranks_loc = @5;
    }
  | KW_STAGE pattern stage_last KW_RANKS expr DOTDOT expr ';' {
      $$ = NEW(ast_pstmt); $$->kind = PST_STAGE; $$->loc = @$; $$->pattern = $2; $$->pattern_loc = @2;
      $$->last = $3 ? $3 : $2; $$->last_loc = $3 ? @3 : @2; $$->rank_lo = $5; $$->rank_hi = $7;
      $$->ranks_loc = @5; $$->ranks_loc.last_line = @7.last_line; $$->ranks_loc.last_column = @7.last_column;
    }
  ;

stage_last:
    %empty                        { $$ = NULL; }
  | DOTDOT pattern                { $$ = $2; }
  ;

stages:
    %empty                        { $$ = NULL; }
  | stages stage                  { $$ = $1; APPEND(ast_pstmt, $$, $2); }
  | stages pattern KW_TP tpspec options ';' { /* a rule of this pipeline alone */
      ast_pstmt *r = $5 ? $5 : NEW(ast_pstmt);
      r->kind = PST_RULE; r->loc = @2; r->loc.last_line = @6.last_line; r->loc.last_column = @6.last_column;
      r->pattern = $2; r->pattern_loc = @2;
      r->tp = NEW(ast_tp); r->tp->loc = @4;
      if ($4) r->tp->degrees = $4; else r->tp->is_auto = true;
      $$ = $1; APPEND(ast_pstmt, $$, r);
    }
  | stages error ';'              { $$ = $1; yyerrok; }
  ;

pipe_share:
    %empty                        { $$ = NULL; }
  | KW_BATCH expr                 { $$ = $2; }
  ;

pattern:
    '*'                           { $$ = "*"; }
  | IDENT                         { $$ = $1; }
  | PATH                          { $$ = $1; }
  ;

/* a NULL tpspec means 'auto' */
tpspec:
    KW_AUTO                       { $$ = NULL; }
  | INT                           { $$ = mk_expr(ctx, AST_INT, @$); $$->ival = $1; }
  | IDENT                         { $$ = mk_expr(ctx, AST_NAME, @$); $$->name = $1; }
  | '(' exprs ')'                 { $$ = $2; }
  ;

/* options fold into one pstmt that the rule then fills in */
options:
    %empty                        { $$ = NULL; }
  | options ',' option            {
      $$ = $1 ? $1 : $3;
      if ($1 && $3) {
        if ($3->seq_parallel) $$->seq_parallel = true;
        if ($3->recompute) $$->recompute = true;
        if ($3->batch) { $$->batch = $3->batch; $$->batch_loc = $3->batch_loc; }
      }
    }
  ;

option:
    KW_SEQPAR                     { $$ = NEW(ast_pstmt); $$->seq_parallel = true; }
  | KW_RECOMPUTE                  { $$ = NEW(ast_pstmt); $$->recompute = true; }
  | KW_BATCH '(' exprs ')'        { $$ = NEW(ast_pstmt); $$->batch = $3; $$->batch_loc = @$; }
  ;

%%

/* The text of the token at `loc`, for messages: "unexpected 'foo'". */
static void token_text(parse_ctx *ctx, ntp_loc loc, char *buf, size_t cap) {
  size_t len = 0;
  const char *p = source_line(ctx->pool, ctx->src, loc.first_line, &len);
  buf[0] = 0;
  if (!p || loc.first_column < 1 || (size_t)(loc.first_column - 1) > len) return;
  p += loc.first_column - 1;
  len -= (size_t)(loc.first_column - 1);
  size_t n = (size_t)(loc.last_column - loc.first_column + 1);
  if (loc.last_line != loc.first_line || n >= cap) n = cap - 1 < 24 ? cap - 1 : 24;
  if (n > cap - 1) n = cap - 1;
  if (n > len) n = len;
  memcpy(buf, p, n);
  buf[n] = 0;
}

static int yyreport_syntax_error(const yypcontext_t *pc, parse_ctx *ctx) {
  enum { MAXEXP = 6 };
  yysymbol_kind_t exp[MAXEXP];
  int n = yypcontext_expected_tokens(pc, exp, MAXEXP);
  if (n < 0) n = 0;
  yysymbol_kind_t tok = yypcontext_token(pc);
  ntp_loc loc = *yypcontext_location(pc);

  char found[64];
  if (tok == S_YYEOF) snprintf(found, sizeof found, "end of file");
  else {
    char text[32];
    token_text(ctx, loc, text, sizeof text);
    snprintf(found, sizeof found, "'%s'", text);
  }

  char want[256] = "";
  bool wants_semi = false, wants_name = false, wants_dtype = false;
  for (int i = 0; i < n; i++) {
    if (exp[i] == YYTRANSLATE(IDENT)) wants_name = true;
    if (exp[i] == YYTRANSLATE(DTYPE)) wants_dtype = true;
    if (exp[i] == YYTRANSLATE(';')) wants_semi = true;
    const char *name = yysymbol_name(exp[i]);
    size_t len = strlen(want);
    snprintf(want + len, sizeof want - len, "%s%s", i == 0 ? "" : i == n - 1 ? " or " : ", ", name);
  }

  /* A missing ';' at the end of a line is best reported where it belongs. */
  if (wants_semi && tok != S_YYEOF && loc.first_line > ctx->prev_tok.last_line && ctx->prev_tok.last_line > 0) {
    ntp_loc at = {ctx->prev_tok.last_line, ctx->prev_tok.last_column + 1, ctx->prev_tok.last_line,
                  ctx->prev_tok.last_column + 1};
    diag_emit(ctx->diags, NTPC_ERROR, ctx->src->name, at, "expected ';' at end of statement");
    return 0;
  }
  if (wants_dtype && n == 1 && tok == S_IDENT) {
    diag_emit(ctx->diags, NTPC_ERROR, ctx->src->name, loc, "unknown dtype %s (expected bf16, fp16, fp32 or i32)", found);
    return 0;
  }
  if (tok == S_YYEOF && ctx->nbraces > 0) {
    diag_emit(ctx->diags, NTPC_ERROR, ctx->src->name, loc, "expected '}' before end of file");
  } else if (n > 0 && wants_name && tok >= S_KW_MODEL && tok <= S_KW_BATCH)
    diag_emit(ctx->diags, NTPC_ERROR, ctx->src->name, loc, "expected %s before %s, which is a reserved word", want,
              found);
  else if (n > 0)
    diag_emit(ctx->diags, NTPC_ERROR, ctx->src->name, loc, "expected %s before %s", want, found);
  else
    diag_emit(ctx->diags, NTPC_ERROR, ctx->src->name, loc, "unexpected %s", found);
  if (tok == S_YYEOF && ctx->nbraces > 0 && ctx->nbraces <= 64)
    diag_emit(ctx->diags, NTPC_NOTE, ctx->src->name, ctx->open_braces[ctx->nbraces - 1],
              "unclosed '{' opened here");
  return 0;
}

static int yylex(YYSTYPE *lval, ntp_loc *lloc, parse_ctx *ctx) {
  extern int ntp_yylex(YYSTYPE *, ntp_loc *, void *);
  if (ctx->diags->stopped) return 0; /* the error limit: end the parse here */
  int t = ntp_yylex(lval, lloc, ctx->scanner);
  ctx->prev_tok = ctx->cur_tok;
  ctx->cur_tok = *lloc;
  if (ctx->token_dump) {
    const char *name = t == 0 ? "end of file" : yysymbol_name(YYTRANSLATE(t));
    fprintf(ctx->token_dump, "%d:%d\t%s", lloc->first_line, lloc->first_column, name);
    if (t == IDENT || t == PATH) fprintf(ctx->token_dump, "\t%s", lval->str);
    else if (t == INT) fprintf(ctx->token_dump, "\t%lld", (long long)lval->ival);
    else if (t == FLOAT) fprintf(ctx->token_dump, "\t%g", lval->fval);
    else if (t == DTYPE) fprintf(ctx->token_dump, "\t%s", dtype_name((ntp_dtype)lval->dtype));
    fputc('\n', ctx->token_dump);
  }
  return t;
}

bool parse_source(parse_ctx *ctx) {
  if (!lex_begin(ctx)) return false;
  size_t before = ctx->diags->errors;
  int rc = yyparse(ctx);
  lex_end(ctx);
  return rc == 0 && ctx->diags->errors == before;
}

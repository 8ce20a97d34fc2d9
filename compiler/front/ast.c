/* ast.c — prints the syntax tree (--emit=ast), one node per line, indented. */
#include "compiler.h"
#include "ntp_types.h"

static void indent(FILE *out, int depth) {
  for (int i = 0; i < depth; i++) fputs("  ", out);
}

static void print_expr_inline(const ast_expr *e, FILE *out);

static void print_args(const ast_arg *a, FILE *out) {
  for (; a; a = a->next) {
    if (a->key) fprintf(out, "%s = ", a->key);
    print_expr_inline(a->value, out);
    if (a->next) fputs(", ", out);
  }
}

static void print_tp(const ast_tp *tp, FILE *out) {
  if (!tp) return;
  fputs(" @tp(", out);
  if (tp->is_auto) fputs("auto", out);
  for (const ast_expr *d = tp->degrees; d; d = d->next) {
    print_expr_inline(d, out);
    if (d->next) fputs(", ", out);
  }
  fputc(')', out);
}

/* Fully parenthesised, so the tree shape is visible. */
static void print_expr_inline(const ast_expr *e, FILE *out) {
  switch (e->kind) {
  case AST_INT: fprintf(out, "%lld", (long long)e->ival); break;
  case AST_FLOAT: fprintf(out, "%g", e->fval); break;
  case AST_NAME: fputs(e->name, out); break;
  case AST_NEG: fputs("(-", out); print_expr_inline(e->operand, out); fputc(')', out); break;
  case AST_BINOP:
    fputc('(', out);
    print_expr_inline(e->bin.lhs, out);
    fprintf(out, " %c ", e->bin.op);
    print_expr_inline(e->bin.rhs, out);
    fputc(')', out);
    break;
  case AST_CALL:
    if (e->call.label) fprintf(out, "%s: ", e->call.label);
    fprintf(out, "%s(", e->call.callee);
    print_args(e->call.args, out);
    fputc(')', out);
    print_tp(e->call.tp, out);
    break;
  }
}

static void print_type(const ast_type *t, FILE *out) {
  if (!t) return;
  if (t->dtype >= 0) fputs(dtype_name((ntp_dtype)t->dtype), out);
  fputc('[', out);
  for (const ast_tdim *d = t->dims; d; d = d->next) {
    print_expr_inline(d->size, out);
    if (d->axes) {
      fputc('{', out);
      for (const ast_ident *a = d->axes; a; a = a->next) fprintf(out, "%s%s", a->name, a->next ? ", " : "");
      fputc('}', out);
    }
    if (d->next) fputs(", ", out);
  }
  fputc(']', out);
  if (t->diagonal) fputs(" diagonal", out);
}

static void print_stmts(const ast_stmt *st, FILE *out, int depth) {
  for (; st; st = st->next) {
    indent(out, depth);
    fprintf(out, "%d:%d ", st->loc.first_line, st->loc.first_column);
    switch (st->kind) {
    case ST_DIM: fprintf(out, "dim %s = ", st->name); print_expr_inline(st->expr, out); break;
    case ST_DTYPE: fprintf(out, "dtype %s", dtype_name((ntp_dtype)st->dtype)); break;
    case ST_MESH:
      fprintf(out, "mesh %s =", st->name);
      for (const ast_expr *e = st->expr; e; e = e->next) {
        fputc(' ', out);
        print_expr_inline(e, out);
      }
      fputs(" (", out);
      for (const ast_ident *a = st->axes; a; a = a->next) fprintf(out, "%s%s", a->name, a->next ? ", " : "");
      fputc(')', out);
      break;
    case ST_INPUT:
    case ST_PARAM:
      fprintf(out, "%s %s : ", st->kind == ST_INPUT ? "input" : "param", st->name);
      print_type(st->type, out);
      break;
    case ST_ASSIGN:
      fprintf(out, "%s%s = ", st->is_output ? "output " : "", st->name);
      print_expr_inline(st->expr, out);
      if (st->type) {
        fputs(" -> ", out);
        print_type(st->type, out);
      }
      break;
    case ST_OUTPUT_NAME: fprintf(out, "output %s", st->name); break;
    case ST_REPEAT:
      fputs("repeat ", out);
      print_expr_inline(st->expr, out);
      fprintf(out, " as %s\n", st->name);
      print_stmts(st->body, out, depth + 1);
      continue;
    }
    fputc('\n', out);
  }
}

/* A stage line, or a pipeline block with its stage lines (each ending its line). */
static void print_stages(const ast_pstmt *st, FILE *out) {
  if (st->kind == PST_PIPELINE) {
    fputs("pipeline", out);
    if (st->world) fputs(" batch ", out), print_expr_inline(st->world, out);
    fputs(" {\n", out);
    for (const ast_pstmt *g = st->body; g; g = g->next) indent(out, 2), print_stages(g, out);
    indent(out, 1);
    fputs("}\n", out);
    return;
  }
  if (st->kind == PST_RULE) { /* a rule of this pipeline */
    fprintf(out, "%s tp", st->pattern);
    for (const ast_expr *d = st->tp->degrees; d; d = d->next) fputc(' ', out), print_expr_inline(d, out);
    if (st->tp->is_auto) fputs(" auto", out);
    fputc('\n', out);
    return;
  }
  fprintf(out, "stage %s .. %s ranks ", st->pattern, st->last);
  print_expr_inline(st->rank_lo, out);
  fputs(" .. ", out);
  print_expr_inline(st->rank_hi, out);
  fputc('\n', out);
}

void ast_print(const ast_file *f, FILE *out) {
  for (const ast_model *m = f->models; m; m = m->next) {
    fprintf(out, "model %s  # %s:%d\n", m->name, m->file, m->loc.first_line);
    print_stmts(m->stmts, out, 1);
  }
  for (const ast_plan *p = f->plans; p; p = p->next) {
    fprintf(out, "plan %s for %s  # %s:%d\n", p->name, p->model, p->file, p->loc.first_line);
    for (const ast_pstmt *st = p->stmts; st; st = st->next) {
      indent(out, 1);
      if (st->kind == PST_WORLD || st->kind == PST_STAGES || st->kind == PST_MICRO_BATCHES) {
        fputs(st->kind == PST_WORLD ? "world " : st->kind == PST_STAGES ? "stages " : "micro_batches ", out);
        print_expr_inline(st->world, out);
      } else if (st->kind == PST_STAGE || st->kind == PST_PIPELINE) {
        print_stages(st, out);
        continue;
      } else if (st->kind == PST_SCHEDULE) {
        fprintf(out, "schedule %s", st->pattern);
      } else if (st->kind == PST_OPTIMIZER) {
        fputs("optimizer", out);
        for (const ast_arg *a = st->settings; a; a = a->next) {
          fprintf(out, " %s ", a->key);
          print_expr_inline(a->value, out);
        }
      } else {
        fprintf(out, "%s tp", st->pattern);
        if (st->tp->is_auto) fputs(" auto", out);
        for (const ast_expr *d = st->tp->degrees; d; d = d->next) {
          fputc(' ', out);
          print_expr_inline(d, out);
        }
        if (st->seq_parallel) fputs(", sequence_parallel", out);
        if (st->recompute) fputs(", recompute", out);
        if (st->batch) {
          fputs(", batch", out);
          for (const ast_expr *d = st->batch; d; d = d->next) {
            fputc(' ', out);
            print_expr_inline(d, out);
          }
        }
      }
      fputc('\n', out);
    }
  }
}

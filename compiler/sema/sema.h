/* sema.h — semantic analysis: AST -> global IR. Shared by sema.c (statements,
 * expressions, plans) and sema_layers.c (layer calls, lowered by their kinds in compiler/layers/). */
#ifndef NTP_SEMA_H
#define NTP_SEMA_H

#include "compiler.h"
#include "ir.h"

typedef struct sema_define {
  const char *name;
  int64_t value;
  bool used;
} sema_define;

typedef struct sema {
  arena *pool;
  diag_sink *diags;
  const char *file; /* of the model being lowered */
  ir_module *m;
  strmap dims;   /* name -> index in m->dims */
  strmap vars;   /* variable -> value */
  strmap layers; /* full layer name -> index in m->layers */
  strmap tensors; /* full input/param name -> value */
  strmap outputs; /* output name -> index in m->outputs */
  strmap narrowed; /* i32 inputs whose default range an embedding has set */
  const char *prefix; /* "" or "blk.3." inside repeat */
  int32_t cur_layer;
  bool dtype_locked; /* a tensor exists: dtype can no longer change */
  sema_define *defines;
  size_t ndefines;
} sema;

/* A lowered expression: a tensor value, a plain number, or an error (already reported). */
typedef enum { TV_ERROR, TV_TENSOR, TV_NUMBER } tval_kind;
typedef struct tval {
  tval_kind kind;
  int32_t value;
  double num;
  bool is_int;
} tval;

void sema_error(sema *s, ntp_loc loc, const char *fmt, ...) __attribute__((format(printf, 3, 4)));
void sema_note(sema *s, ntp_loc loc, const char *fmt, ...) __attribute__((format(printf, 3, 4)));
/* Evaluates a dim expression (integers, dims, + - * /); false if reported. */
bool sema_eval_dim(sema *s, const ast_expr *e, int64_t *out);
tval sema_lower_expr(sema *s, const ast_expr *e);
/* Emits an op whose shape comes from ir_infer; reports at loc and returns -1 on a rule violation. */
int32_t sema_op(sema *s, ir_opcode code, const int32_t *args, int32_t nargs, ntp_loc loc, const ir_op *attrs);
int32_t sema_param(sema *s, const char *name, ntp_shape shape, float center, float scale, ntp_loc loc);
const char *sema_type_str(sema *s, int32_t value);
bool sema_lower_tp(sema *s, const ast_tp *in, ir_tp *out);
/* A positive dim expression at most max; one in [lo, max]. false if reported. */
bool sema_eval_bounded(sema *s, const ast_expr *e, const char *what, int64_t max, int64_t *out);
bool sema_eval_bounded_from(sema *s, const ast_expr *e, const char *what, int64_t lo, int64_t max, int64_t *out);

/* sema_plans.c: a plan for the model, checked and appended to its plans (active: the one applied) */
void sema_lower_plan(sema *s, const ast_plan *p, bool active);

/* sema_layers.c: a layer call, checked against its kind (compiler/layers/) and lowered */
tval sema_lower_layer(sema *s, const ast_expr *call);

/* sema.c entry: lowers the model and the plans that target it. */
ir_module *sema_run(arena *pool, diag_sink *diags, const ast_file *file, const ast_model *model,
                    sema_define *defines, size_t ndefines, const char *active_plan_file, const char *active_plan_name);

#endif

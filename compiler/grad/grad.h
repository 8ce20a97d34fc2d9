/* grad.h — the gradient pass (grad.c): reverse-mode differentiation of the global IR. */
#ifndef NTP_GRAD_H
#define NTP_GRAD_H

#include "ir.h"

/* Appends the backward ops of m's loss (its one scalar float output, or the one named "loss")
 * and an output "grad.NAME" per parameter the loss depends on. Names come from pool. false with
 * diagnostics (at model_loc when there is no loss, at an op with no gradient rule). */
bool ir_grad(ir_module *m, arena *pool, ntp_loc model_loc, diag_sink *diags);
/* The loss output: the one scalar float output, or of several the one named "loss"; -1 with a
 * diagnostic at model_loc (diags may be NULL: then none). */
int32_t ir_loss_output(const ir_module *m, diag_sink *diags, ntp_loc model_loc);
/* The value of parameter `param`'s gradient output (grad.NAME), -1: none. */
int32_t ir_grad_output(const ir_module *m, int32_t param);

/* How a backward rule emits: ops on ids (global values, or one rank's tensors) through the
 * callbacks of whoever differentiates. */
typedef struct grad_emitter {
  void *ctx;
  int32_t (*emit)(void *ctx, ir_opcode code, const int32_t *args, int32_t nargs, ntp_shape shape, ntp_dtype dt,
                  const ntp_op_attr *attr);
  ntp_shape (*shape)(void *ctx, int32_t id);
  ntp_dtype (*dtype)(void *ctx, int32_t id);
  bool (*needs)(void *ctx, int32_t id); /* whether id's gradient is wanted */
  void (*add)(void *ctx, int32_t id, int32_t g); /* g is (a part of) id's gradient: accumulate it */
} grad_emitter;

/* grad_rules.c: op's vector-Jacobian product for the gradient g of its result, sent to its
 * operands with E->add. false: no rule for the op (reported by the caller). */
bool grad_rule(const grad_emitter *E, const ir_op *op, int32_t g);

#endif

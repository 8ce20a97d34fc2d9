/* grad.h — the gradient pass (grad.c): reverse-mode differentiation of the global IR. */
#ifndef NTP_GRAD_H
#define NTP_GRAD_H

#include "ir.h"

/* Appends the backward ops of m's loss (its one scalar float output, or the one named "loss")
 * and an output "grad.NAME" per parameter the loss depends on. Names come from pool. false with
 * diagnostics (at model_loc when there is no loss, at an op with no gradient rule). */
bool ir_grad(ir_module *m, arena *pool, ntp_loc model_loc, diag_sink *diags);

#endif

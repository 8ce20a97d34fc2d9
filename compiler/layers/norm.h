/* norm.h — what layernorm.c and rmsnorm.c share: the lowering of a normalisation with its
 * learned gain (and bias). Norms are not split: their ops follow their input's rows. */
#ifndef NTP_LAYER_NORM_H
#define NTP_LAYER_NORM_H

#include "layer_kind.h"

enum { NORM_G, NORM_B }; /* roles */
int32_t layer_lower_norm(struct sema *s, layer_call *c, ir_opcode code);

#endif

/* rmsnorm.c — rmsnorm(x [, eps]): x / sqrt(mean(x^2) + eps) * g over the last dim (the lowering
 * is layernorm.c's, norm.h). Not split: it follows its input's rows. */
#include "norm.h"

static int32_t lower(struct sema *s, layer_call *c) { return layer_lower_norm(s, c, IR_RMSNORM); }

static const char *const roles[] = {"g", NULL};

const layer_kind layer_rmsnorm = {
    .name = "rmsnorm",
    .args = {{"eps", LA_FLOAT, false, NULL, NULL}},
    .roles = roles,
    .lower = lower,
    .weight_role = -1,
};

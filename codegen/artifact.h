/* artifact.h — the C source of a model library (see artifact.c). */
#ifndef NTP_ARTIFACT_GEN_H
#define NTP_ARTIFACT_GEN_H

#include <stdio.h>

#include "shard.h"

/* The model's inputs, outputs or parameters, in the ABI's order: their values and names into
 * vals/names (room for n_ops + n_outputs); their count. */
typedef enum { ARTIFACT_INPUTS, ARTIFACT_OUTPUTS, ARTIFACT_PARAMS } artifact_kind;
size_t artifact_tensors(const ir_module *m, artifact_kind kind, int32_t *vals, const char **names);
/* Layer l's line of the info's sharding text ("blk.0.attn: attention, groups (4, 3)\n"). */
void artifact_sharding_line(const sh_program *p, size_t l, char *line, size_t cap);

/* Writes the C file of the model library for program p, whose image (ntpc_program_image) the
 * library embeds. 0, or -1 with a message. */
int artifact_write_c(const sh_program *p, const void *image, size_t image_len, FILE *f, char *err, size_t cap);

#endif

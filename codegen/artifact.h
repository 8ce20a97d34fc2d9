/* artifact.h — the C source of a model library (see artifact.c). */
#ifndef NTP_ARTIFACT_GEN_H
#define NTP_ARTIFACT_GEN_H

#include <stdio.h>

#include "shard.h"

/* Writes the C file of the model library for program p, whose image (ntpc_program_image) the
 * library embeds. 0, or -1 with a message. */
int artifact_write_c(const sh_program *p, const void *image, size_t image_len, FILE *f, char *err, size_t cap);

#endif

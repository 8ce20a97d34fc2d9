/* program_write.h — the compiled program as the runtime's image (runtime/ntp_program.h). */
#ifndef NTP_PROGRAM_WRITE_H
#define NTP_PROGRAM_WRITE_H

#include "cuda_gen.h"
#include "shard.h"

typedef struct program_image {
  unsigned char *data;
  size_t len, cap;
} program_image;

/* Writes module m, the sharded program p (NULL: none) and its ranks' CUDA (NULL: none) as an
 * image. Runs under the caller's out-of-memory guard (compiler.h). */
void program_write(const ir_module *m, const sh_program *p, const cg_module *cuda, program_image *out);
void program_image_free(program_image *img);

#endif

/* param_formats.h — checkpoint layouts other than the model's own names (docs/runtime.md#checkpoint-layouts):
 * a map from each parameter of a model to the tensor of another layout that holds it (Hugging
 * Face GPT-2's fused, transposed Conv1D weights; Llama's projections), used to read such files
 * by slices and to write them back. Internal to the runtime (safetensors.c). */
#ifndef NTP_PARAM_FORMATS_H
#define NTP_PARAM_FORMATS_H

#include <stdbool.h>
#include <stdint.h>

#include "ntp_program.h"

/* The model's tensor `model` is rows [offset, offset + its dim 0) of the file's tensor `source`
 * (transpose: the model's [out, in] is the file's [in, out] with columns from offset). */
typedef struct ntp_st_name {
  const char *model;
  char *source;
  bool transpose;
  int64_t offset;
  int64_t extent;  /* the file tensor's length along the offset dim: the end of its last part */
  bool longer_ok;  /* the file's may be longer (a position table cut to the model's positions) */
  bool shared;     /* another parameter reads the same range (a tied head, reading only) */
} ntp_st_name;

typedef struct ntp_st_names {
  ntp_st_name *e;
  size_t n;
} ntp_st_names;

/* The layouts: "ntp" (the model's names: no map), "hf-gpt2", "hf-llama". */
const char *const *ntp_param_format_names(void);
bool ntp_param_format_known(const char *format);

/* The map of `format` for every parameter of m; has(ctx, name) says whether the file holds a
 * tensor (prefixes and tied heads follow the file), NULL when writing. NULL map for "ntp".
 * -1 with a message when a parameter has no place in the layout. */
int ntp_st_names_build(const char *format, const ntp_module *m, bool (*has)(void *ctx, const char *name), void *ctx,
                       ntp_st_names **out, char *err, size_t cap);
const ntp_st_name *ntp_st_names_find(const ntp_st_names *map, const char *model);
void ntp_st_names_free(ntp_st_names *map);

#endif
